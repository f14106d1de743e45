#!/usr/bin/env python3
"""Check that a Hermes installation offers every interface the cloudflare_sandbox plugin relies on.

    python scripts/check_hermes_contract.py --hermes-source /path/to/hermes-agent   # a checkout or site-packages

Run it with a Python that can import Hermes (its venv). It checks signatures and class shapes, not live behaviour:
the provider ABC and its abstract set, the registry's reserved names, BaseEnvironment's execute()/_run_bash/
_wait_for_process, EnvironmentConnectionError(retry_hint=), that Hermes keeps environments with `_persistent`,
the secret lookup, and that our process handle has no `pid`. Exit 0 when every check passes.
"""

from __future__ import annotations

import argparse
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


def run(hermes_source: Path | None) -> int:
    c = Checker()
    if hermes_source is not None:
        sys.path.insert(0, str(hermes_source.resolve()))
    try:
        from agent.secret_scope import get_secret
        from agent.terminal_env_provider import TerminalEnvironmentProvider
        from hermes_constants import get_hermes_home
        from tools.environments.base import BaseEnvironment, EnvironmentConnectionError
    except ImportError as exc:
        c.check(False, "Hermes imports", f"{exc} — needs Hermes v0.20.6 (v2026.8.27) or later in this Python")
        return 1
    c.check(True, "Hermes imports", "terminal_env_provider, secret_scope, hermes_constants, environments.base")

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

    package = load_plugin()
    provider_mod = importlib.import_module(f"{package}.provider")
    env_mod = importlib.import_module(f"{package}.environment")
    process_mod = importlib.import_module(f"{package}.process")
    provider_cls, env_cls = provider_mod.CloudflareSandboxProvider, env_mod.CloudflareSandboxEnvironment

    c.check(issubclass(provider_cls, TerminalEnvironmentProvider), "provider subclasses TerminalEnvironmentProvider")
    c.check(not inspect.isabstract(provider_cls), "provider is concrete")
    c.check(issubclass(env_cls, BaseEnvironment), "environment subclasses BaseEnvironment")
    c.check(not inspect.isabstract(env_cls), "environment is concrete")

    provider = provider_cls()
    c.check(provider.name == "cloudflare_sandbox", "backend name", provider.name)
    clash = provider.name in (reserved | RESERVED)
    c.check(not clash, "backend name is not reserved", ", ".join(sorted(reserved)) or "known list")
    c.note("skip_container_guards", str(provider.skip_container_guards))
    create = params(provider_cls.create_environment)
    needed = {"cwd", "timeout", "task_id", "image", "container_config", "kwargs"}
    c.check(needed <= create, "create_environment signature", ", ".join(sorted(create - {"self"})))

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
    c.check("_persistent" in lifecycle_source, "Hermes keeps environments that set _persistent (is_persistent_env)")

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
