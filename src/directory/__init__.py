"""The directory object: one per deployment, holding the scoped keys, the index of workspaces and the audit log.

Plain Python over the Storage port, like the workspace object (durable/); the edge talks to it through a
DirectoryStub (in-process standalone, a second Durable Object class on Cloudflare). Workspace objects stay the only
owners of their own state.
"""
