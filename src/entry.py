"""Cloudflare entry points: the Worker (`Default`) and the per-workspace Durable Object (`Workspace`).

Thin glue only: the Worker hands each request to `worker.edge.Edge`, whose workspace stubs are Durable Object
stubs; the object hosts `durable.workspace.Workspace` over the Cloudflare adapters in `cloudflare/`.
"""

from workers import DurableObject, Response, WorkerEntrypoint

from cloudflare.host import WorkspaceHost
from cloudflare.settings import env_var, settings_from_env
from cloudflare.worker_side import DurableObjectDirectory, edge_request, js_response
from worker.edge import Edge

VERSION = "0.1.0"


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        edge = Edge(
            token=env_var(self.env, "SANDBOX_API_TOKEN"),
            settings=settings_from_env(self.env),
            directory=DurableObjectDirectory(self.env.WORKSPACE),
            version=VERSION,
        )
        return Response(js_response(await edge.handle(edge_request(request.js_object))))


class Workspace(DurableObject):
    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.host = WorkspaceHost(self.ctx, self.env)

    async def fetch(self, request):
        return Response(js_response(await self.host.fetch(request.js_object)))

    async def alarm(self, alarm_info=None):
        await self.host.alarm()
