#!/usr/bin/env python3
"""Check that a Hermes installation offers every interface the cloudflare_sandbox plugin relies on.

    python scripts/check_hermes_contract.py --hermes-source /path/to/hermes-agent   # a checkout or site-packages

Run it with a Python that can import Hermes (its venv). It first reports which of Hermes' two terminal backend
contracts this Hermes has, and which one the plugin's register() would use (the newer when offered, never both):
- terminal-backend: ctx.register_terminal_backend(TerminalBackendDefinition) from tools/environments/registry.py,
  the factory taking a TerminalBackendRequest (upstream's newer tree);
- terminal-environment-provider: ctx.register_terminal_environment_provider(provider) with
  agent.terminal_env_provider (Hermes v0.20.6 / v2026.8.27 and later).
It then checks signatures and class shapes, not live behaviour: for each contract present, its shapes (the frozen
definition and request fields, that register() makes exactly one registration and Hermes' own definition class
accepts ours; the provider ABC and its abstract set, the registry's reserved names), and for both
BaseEnvironment's execute()/_run_bash/_wait_for_process, EnvironmentConnectionError(retry_hint=), the secret lookup,
and that our process handle has no `pid`; with the provider contract, that Hermes keeps environments with
`_persistent`. Exit 0 when every check passes.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXPECTED_ABSTRACT = {"name", "is_available", "create_environment"}
RESERVED = {
    "local",
    "docker",
    "singularity",
    "modal",
    "managed_modal",
    "daytona",
    "vercel_sandbox",
    "ssh",
    "bubblewrap",
}


class Checker:
    def __init__(self) -> None:
        self.failures = 0

    def check(self, ok: bool, label: str, detail: str = "") -> bool:
        print(f"{'PASS' if ok else 'FAIL'}  {label}{(': ' + detail) if detail else ''}")
        self.failures += not ok
        return ok

    def note(self, label: str, detail: str) -> None:
        print(f"NOTE  {label}: {detail}")


def load_plugin():
    """Import plugin/ as a package the way Hermes loads a plugin directory."""
    plugin_dir = REPO / "plugin"
    spec = importlib.util.spec_from_file_location(
        "flarebox_contract_plugin", plugin_dir / "__init__.py", submodule_search_locations=[str(plugin_dir)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return spec.name


def params(func) -> set[str]:
    return set(inspect.signature(func).parameters)


DEFINITION_FIELDS = {
    "name",
    "factory",
    "container_paths",
    "default_cwd",
    "default_image",
    "image_override_key",
    "image_config_key",
}
REQUEST_FIELDS = {"name", "task_id", "cwd", "timeout", "image", "settings"}


def dataclass_shape(cls) -> tuple[set[str], bool]:
    """(field names, frozen) of a dataclass, or (set(), False)."""
    if not dataclasses.is_dataclass(cls):
        return set(), False
    params = getattr(cls, "__dataclass_params__", None)
    return {f.name for f in dataclasses.fields(cls)}, bool(getattr(params, "frozen", False))


class RecordingContext:
    """Offers both registration methods and records every call (the plugin must make exactly one)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def register_terminal_backend(self, definition) -> None:
        self.calls.append(("register_terminal_backend", definition))

    def register_terminal_environment_provider(self, provider) -> None:
        self.calls.append(("register_terminal_environment_provider", provider))


def contracts_present(c: Checker):
    """(TerminalEnvironmentProvider or None, the tools.environments.registry module or None), with CONTRACT lines."""
    try:
        from agent.terminal_env_provider import TerminalEnvironmentProvider
    except ImportError as exc:
        TerminalEnvironmentProvider = None
        provider_detail = f"absent ({exc})"
    else:
        provider_detail = "present: agent.terminal_env_provider"
    registry = None
    try:
        registry = importlib.import_module("tools.environments.registry")
        missing = [n for n in ("TerminalBackendDefinition", "TerminalBackendRequest") if not hasattr(registry, n)]
        if missing:
            backend_detail = f"absent (tools.environments.registry has no {', '.join(missing)})"
            registry = None
        else:
            from hermes_cli.plugins import PluginContext

            if callable(getattr(PluginContext, "register_terminal_backend", None)):
                backend_detail = "present: tools.environments.registry, PluginContext.register_terminal_backend"
            else:
                backend_detail = "absent (PluginContext has no register_terminal_backend)"
                registry = None
    except ImportError as exc:
        backend_detail = f"absent ({exc})"
    print(f"CONTRACT  terminal-backend: {backend_detail}")
    print(f"CONTRACT  terminal-environment-provider: {provider_detail}")
    return TerminalEnvironmentProvider, registry


def check_backend_contract(c: Checker, registry, plugin) -> None:
    definition_cls, request_cls = registry.TerminalBackendDefinition, registry.TerminalBackendRequest
    fields, frozen = dataclass_shape(definition_cls)
    c.check(
        DEFINITION_FIELDS <= fields and frozen,
        "TerminalBackendDefinition is frozen with the documented fields",
        ", ".join(sorted(fields)),
    )
    fields, frozen = dataclass_shape(request_cls)
    c.check(
        REQUEST_FIELDS <= fields and frozen,
        "TerminalBackendRequest is frozen with the documented fields",
        ", ".join(sorted(fields)),
    )

    ctx = RecordingContext()
    try:
        plugin.register(ctx)
    except Exception as exc:  # Hermes' definition class refused ours (its __post_init__ validates the fields)
        c.check(False, "register() builds a definition Hermes accepts", f"{type(exc).__name__}: {exc}")
        return
    methods = [method for method, _ in ctx.calls]
    c.check(
        methods == ["register_terminal_backend"],
        "register() makes exactly one registration, through register_terminal_backend",
        ", ".join(methods),
    )
    if not methods or methods[0] != "register_terminal_backend":
        return
    definition = ctx.calls[0][1]
    c.check(isinstance(definition, definition_cls), "the definition is Hermes' own TerminalBackendDefinition")
    reserved = set(getattr(registry, "BUILTIN_TERMINAL_BACKENDS", ())) | RESERVED
    name = getattr(definition, "name", None)
    c.check(name == "cloudflare_sandbox" and name not in reserved, "definition name, not reserved", str(name))
    c.check(
        getattr(definition, "default_cwd", None) == "/workspace"
        and getattr(definition, "container_paths", None) is True,
        "definition default_cwd /workspace, container_paths",
    )
    c.note(
        "definition image keys",
        f"override {getattr(definition, 'image_override_key', None)!r}, "
        f"config {getattr(definition, 'image_config_key', None)!r}",
    )
    factory = getattr(definition, "factory", None)
    try:
        inspect.signature(factory).bind(object())
        takes_request = True
    except (TypeError, ValueError):
        takes_request = False
    c.check(callable(factory) and takes_request, "definition factory takes one TerminalBackendRequest")
    registry_cls = getattr(registry, "TerminalBackendRegistry", None)
    if registry_cls is not None:
        try:
            registry_cls().register(definition, owner="cloudflare-sandbox")
            c.check(True, "Hermes' TerminalBackendRegistry accepts the definition")
        except Exception as exc:
            c.check(False, "Hermes' TerminalBackendRegistry accepts the definition", f"{type(exc).__name__}: {exc}")
    try:
        importlib.import_module("tools.environments.manager")
        c.note("tools.environments.manager", "present (Hermes owns the environment cache and calls cleanup())")
    except ImportError:
        c.note("tools.environments.manager", "absent")


def check_provider_contract(c: Checker, TerminalEnvironmentProvider, provider_mod) -> None:
    abstract = set(getattr(TerminalEnvironmentProvider, "__abstractmethods__", ()))
    c.check(abstract <= EXPECTED_ABSTRACT, "provider ABC abstract set", ", ".join(sorted(abstract)))
    if abstract != EXPECTED_ABSTRACT:
        c.note("provider ABC abstract set", f"expected {sorted(EXPECTED_ABSTRACT)}")

    try:
        from agent.terminal_env_registry import BUILTIN_BACKEND_NAMES

        reserved = set(BUILTIN_BACKEND_NAMES)
    except ImportError:
        reserved = set()
        c.note("registry", "agent.terminal_env_registry.BUILTIN_BACKEND_NAMES not found; using the known list")

    provider_cls = provider_mod.CloudflareSandboxProvider
    c.check(issubclass(provider_cls, TerminalEnvironmentProvider), "provider subclasses TerminalEnvironmentProvider")
    c.check(not inspect.isabstract(provider_cls), "provider is concrete")
    provider = provider_cls()
    c.check(provider.name == "cloudflare_sandbox", "backend name", provider.name)
    clash = provider.name in (reserved | RESERVED)
    c.check(not clash, "backend name is not reserved", ", ".join(sorted(reserved)) or "known list")
    c.note("skip_container_guards", str(provider.skip_container_guards))
    create = params(provider_cls.create_environment)
    needed = {"cwd", "timeout", "task_id", "image", "container_config", "kwargs"}
    c.check(needed <= create, "create_environment signature", ", ".join(sorted(create - {"self"})))


def run(hermes_source: Path | None) -> int:
    c = Checker()
    if hermes_source is not None:
        sys.path.insert(0, str(hermes_source.resolve()))
    TerminalEnvironmentProvider, registry = contracts_present(c)
    if TerminalEnvironmentProvider is None and registry is None:
        c.check(
            False,
            "Hermes terminal backend contract",
            "neither agent.terminal_env_provider (Hermes v0.20.6 / v2026.8.27 or later) nor "
            "tools.environments.registry.TerminalBackendDefinition with PluginContext.register_terminal_backend",
        )
        return 1
    try:
        from agent.secret_scope import get_secret
        from hermes_constants import get_hermes_home
        from tools.environments.base import BaseEnvironment, EnvironmentConnectionError
    except ImportError as exc:
        c.check(False, "Hermes imports", f"{exc} — needs Hermes v0.20.6 (v2026.8.27) or later in this Python")
        return 1
    c.check(True, "Hermes imports", "secret_scope, hermes_constants, environments.base")

    package = load_plugin()
    plugin = sys.modules[package]
    try:  # what register() picks, asked of this Hermes' own plugin context class
        from hermes_cli.plugins import PluginContext
    except ImportError:
        PluginContext = None
        c.note("hermes_cli.plugins.PluginContext", "not importable; asking a context with both methods instead")
    uses = plugin.contract(PluginContext if PluginContext is not None else RecordingContext())
    expected = plugin.BACKEND_CONTRACT if registry is not None else plugin.PROVIDER_CONTRACT
    print(f"CONTRACT  register() uses {uses}")
    c.check(uses == expected, "register() picks the newest contract this Hermes offers", str(uses))
    provider_mod = importlib.import_module(f"{package}.provider")
    env_mod = importlib.import_module(f"{package}.environment")
    process_mod = importlib.import_module(f"{package}.process")
    env_cls = env_mod.CloudflareSandboxEnvironment

    if registry is not None:
        check_backend_contract(c, registry, plugin)
    if TerminalEnvironmentProvider is not None:
        check_provider_contract(c, TerminalEnvironmentProvider, provider_mod)

    c.check(issubclass(env_cls, BaseEnvironment), "environment subclasses BaseEnvironment")
    c.check(not inspect.isabstract(env_cls), "environment is concrete")
    for method in ("init_session", "execute", "_run_bash", "_wait_for_process", "cleanup"):
        c.check(callable(getattr(BaseEnvironment, method, None)), f"BaseEnvironment.{method}")
    execute = params(BaseEnvironment.execute)
    c.check(
        {"command", "cwd", "timeout", "stdin_data", "bounded_capture"} <= execute,
        "BaseEnvironment.execute kwargs",
        ", ".join(sorted(execute - {"self"})),
    )
    wait = list(inspect.signature(BaseEnvironment._wait_for_process).parameters)
    c.check(wait[:2] == ["self", "proc"], "BaseEnvironment._wait_for_process(proc, ...)", ", ".join(wait[1:]))
    run_bash = params(BaseEnvironment._run_bash)
    c.check({"login", "timeout", "stdin_data"} <= run_bash, "BaseEnvironment._run_bash kwargs")
    c.check("retry_hint" in params(EnvironmentConnectionError.__init__), "EnvironmentConnectionError(retry_hint=)")
    c.check(callable(get_secret) and callable(get_hermes_home), "get_secret / get_hermes_home")
    c.check(
        getattr(BaseEnvironment, "_stdin_mode", None) in ("pipe", "payload", "heredoc"), "BaseEnvironment._stdin_mode"
    )
    for optional in ("fetch_file", "_mark_recreated"):
        present = callable(getattr(BaseEnvironment, optional, None))
        c.note(f"BaseEnvironment.{optional}", "present" if present else "absent (the plugin copes)")

    lifecycle_source = ""
    for name in ("tools.terminal_tool_lifecycle", "tools.terminal_tool"):
        try:
            lifecycle = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(lifecycle, "is_persistent_env"):
            lifecycle_source = inspect.getsource(lifecycle.is_persistent_env)
            break
    keeps = "_persistent" in lifecycle_source
    label = "Hermes keeps environments that set _persistent (is_persistent_env)"
    if uses == plugin.PROVIDER_CONTRACT:
        c.check(keeps, label)
    else:  # the host owns the lifecycle: it caches the environment and calls cleanup() when it lets it go
        c.note(label, "yes" if keeps else "no (the terminal-backend host owns the lifecycle)")

    handle = process_mod.RemoteProcess(
        command="true",
        request_fields={},
        run_fn=lambda request, offset: iter([{"type": "exit", "exit_code": 0, "reason": "exited"}]),
        cancel_fn=lambda rid: None,
    )
    handle.wait(5)
    c.check(not hasattr(handle, "pid"), "process handle has no pid (Hermes would kill a host pid)")
    members = ("poll", "kill", "wait", "stdout", "returncode")
    c.check(all(hasattr(handle, m) for m in members), "process handle has poll/kill/wait/stdout/returncode")
    c.check(isinstance(handle.stdout.fileno(), int), "process handle stdout is a real file descriptor")
    handle.stdout.close()

    print("\nChecked signatures and class shapes only, not live behaviour (run scripts/smoke.py --live for that).")
    print("RESULT", "PASS" if c.failures == 0 else f"FAIL ({c.failures} failed)")
    return 0 if c.failures == 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--hermes-source", type=Path, help="a Hermes checkout or site-packages dir (default: installed)"
    )
    args = parser.parse_args(argv)
    return run(args.hermes_source)


if __name__ == "__main__":
    raise SystemExit(main())
