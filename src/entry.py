"""Cloudflare entry points: the Worker (`Default`), the per-workspace Durable Object (`Workspace`) and the one
directory Durable Object of the deployment (`Directory`: keys, the workspace index, the audit log).

Thin glue only: the Worker hands each request to `worker.edge.Edge`, whose workspace and directory stubs are Durable
Object stubs; the objects host `durable.workspace.Workspace` and `directory.directory.Directory` over the Cloudflare
adapters in `cloudflare/`.

The Worker's cold start imports only what a request needs: the objects' hosts (`cloudflare.host`,
`cloudflare.directory_host`, with the workspace and directory code behind them) are imported when an object is
constructed (tests/cloudflare/test_cold_start_under_pyodide.py holds this; bench/bench_worker.py measures it).
"""

from workers import DurableObject, Response, WorkerEntrypoint

from cloudflare.access import access_gate
from cloudflare.settings import env_var, settings_from_env
from cloudflare.worker_side import DirectoryObjectStub, DurableObjectWorkspaces, edge_request, js_response
from worker.edge import Edge

VERSION = "0.1.0"


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        settings = settings_from_env(self.env)
        edge = Edge(
            token=env_var(self.env, "SANDBOX_API_TOKEN"),
            settings=settings,
            workspaces=DurableObjectWorkspaces(self.env.WORKSPACE),
            directory=DirectoryObjectStub(self.env.DIRECTORY),
            version=VERSION,
            access=access_gate(settings),
        )
        return Response(js_response(await edge.handle(edge_request(request.js_object))))


class Workspace(DurableObject):
    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        from cloudflare.host import WorkspaceHost  # here: the object code stays out of the Worker cold start

        self.host = WorkspaceHost(self.ctx, self.env)

    async def fetch(self, request):
        return Response(js_response(await self.host.fetch(request.js_object)))

    async def alarm(self, alarm_info=None):
        await self.host.alarm()


class Directory(DurableObject):
    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        from cloudflare.directory_host import DirectoryHost  # here, as above

        self.host = DirectoryHost(self.ctx, self.env)

    async def fetch(self, request):
        return Response(js_response(await self.host.fetch(request.js_object)))
