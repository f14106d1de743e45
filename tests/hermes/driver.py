"""Runs INSIDE a Hermes venv (as a subprocess of the tests): drives real Hermes code against the plugin.

Usage: driver.py SCENARIO [JSON-ARGS]. HERMES_HOME (plugin installed, config.yaml written) and HERMES_CF_* come from
the environment. The result is one line `RESULT <json>` on stdout; interactive scenarios also print `STEP <name>`
lines and wait for a line on stdin before going on (the test stops or restarts the server meanwhile).
"""

import importlib.util
import json
import os
import sys
import threading
import time
from pathlib import Path


def emit(tag: str, value) -> None:
    sys.stdout.write(f"{tag} {json.dumps(value, ensure_ascii=False, default=str)}\n")
    sys.stdout.flush()


def step(name: str) -> None:
    emit("STEP", name)
    sys.stdin.readline()


def load_plugin():
    """Import the installed plugin directory as a package, the way Hermes' loader does."""
    plugin_dir = Path(os.environ["HERMES_HOME"]) / "plugins" / "cloudflare-sandbox"
    spec = importlib.util.spec_from_file_location(
        "flarebox_plugin_under_test", plugin_dir / "__init__.py", submodule_search_locations=[str(plugin_dir)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def discover():
    from hermes_cli.plugins import discover_plugins, get_plugin_manager

    discover_plugins()
    return get_plugin_manager()


def terminal(command, **kwargs):
    from tools.terminal_tool import terminal_tool

    return json.loads(terminal_tool(command, **kwargs))


def active_env(task_id="default"):
    from tools import terminal_tool as tt

    for key, env in tt._active_environments.items():
        if key == task_id or key.endswith(task_id):
            return env
    raise LookupError(f"no environment for {task_id}: {list(tt._active_environments)}")


def cleanup_all():
    try:
        from tools.terminal_tool_lifecycle import cleanup_all_environments
    except ImportError:
        from tools.terminal_tool import cleanup_all_environments

    cleanup_all_environments()


# --- scenarios on a Hermes with provider plugins ------------------------------------------------------------


def s_registration(args):
    manager = discover()
    from agent.terminal_env_registry import get_provider, plugin_backend_names, provider_flag

    provider = get_provider("cloudflare_sandbox")
    plugins = [
        {k: p.get(k) for k in ("name", "kind", "enabled", "error", "source")}
        for p in manager.list_plugins()
        if isinstance(p, dict) and p.get("name") == "cloudflare-sandbox"
    ]
    return {
        "backends": plugin_backend_names(),
        "flags": {
            flag: provider_flag("cloudflare_sandbox", flag)
            for flag in ("is_remote", "is_container", "skip_container_guards", "session_isolated_when_nonpersistent")
        },
        "strip_env_keys": sorted(provider.strip_env_keys),
        "available": provider.is_available(),
        "probe": list(provider.probe()),
        "doctor": [list(row) for row in provider.doctor_checks()],
        "plugins": plugins,
    }


def s_probe(args):
    """provider.probe() against an endpoint that refuses and one that never answers: bounded, never raises."""
    discover()
    from agent.terminal_env_registry import get_provider

    provider = get_provider("cloudflare_sandbox")
    out = {}
    for label, endpoint in (("refused", "http://127.0.0.1:9"), ("silent", args["silent"])):
        os.environ["HERMES_CF_ENDPOINT"] = endpoint
        started = time.monotonic()
        out[label] = {"probe": list(provider.probe()), "seconds": time.monotonic() - started}
    os.environ.pop("HERMES_CF_ENDPOINT")
    out["unset"] = list(provider.probe())
    out["unset_doctor"] = [list(row) for row in provider.doctor_checks()]
    out["unset_available"] = provider.is_available()
    return out


def s_secret_scope(args):
    """With gateway multiplexing on and no profile scope bound, Hermes' get_secret raises: the plugin must fail
    closed instead of reading os.environ (which holds valid settings here)."""
    discover()
    import agent.secret_scope as scope
    from agent.terminal_env_registry import get_provider

    provider = get_provider("cloudflare_sandbox")
    before = provider.is_available()
    scope.is_multiplex_active = lambda: True
    out = {"available_before": before, "available": provider.is_available(), "probe": list(provider.probe())}
    try:
        provider.create_environment(cwd="/workspace", timeout=10, task_id="default", container_config={})
        out["create"] = None
    except Exception as exc:
        out["create"] = [type(exc).__name__, str(exc)]
    return out


def s_conflict(args):
    """The user's workspace exists with another configuration: a degraded result that says what to change."""
    discover()
    from flarebox_plugin_under_test.client import Client
    from flarebox_plugin_under_test.config import load_settings

    settings = load_settings()
    with Client(settings.endpoint, settings.token) as client:
        client.put_workspace(settings.namespace, settings.persistent_workspace("default"), {"instance": "lite"})
    return {"result": terminal("true")}


def s_terminal(args):
    discover()
    out = {}
    out["first"] = terminal("mkdir -p /workspace/sub && cd /workspace/sub && export FLAREBOX_VAR=kept && pwd")
    out["cwd_and_var"] = terminal('pwd; echo "var=$FLAREBOX_VAR"')
    out["exit3"] = terminal("echo before; exit 3")
    out["unicode"] = terminal("printf '%s\\n' '日本語 🙂 $(not run)'")
    started = time.monotonic()
    out["timeout"] = terminal("sleep 20", timeout=2)
    out["timeout_seconds"] = time.monotonic() - started
    env = active_env()
    out["persistent"] = getattr(env, "_persistent", None)
    out["workspace"] = env.workspace
    out["has_pid"] = hasattr(env._run_bash("true"), "pid")
    cleanup_all()
    return out


def s_interrupt(args):
    discover()
    from tools.interrupt import set_interrupt

    terminal("true")  # build the environment first
    box = {}

    def run():
        box["tid"] = threading.get_ident()
        box["result"] = terminal("sleep 60")

    worker = threading.Thread(target=run)
    worker.start()
    time.sleep(1.5)
    started = time.monotonic()
    set_interrupt(True, box["tid"])
    worker.join(30)
    elapsed = time.monotonic() - started
    set_interrupt(False, box["tid"])
    # the remote command must really be gone: nothing named like it still runs
    after = terminal("pgrep -fx 'sleep 60' || echo none")
    cleanup_all()
    return {"result": box.get("result"), "seconds": elapsed, "after": after}


def s_files(args):
    discover()
    from tools.file_tools import patch_tool, read_file_tool, search_tool, write_file_tool

    big = "".join(f"line {i:07d} 日本語 🙂 payload\n" for i in range(90_000))  # ~3.3 MB of UTF-8
    out = {"big_bytes": len(big.encode())}
    out["write_big"] = json.loads(write_file_tool("/workspace/big.txt", big))
    out["big_check"] = terminal("wc -c < /workspace/big.txt; sha256sum /workspace/big.txt | cut -c1-64")
    import hashlib

    out["big_sha"] = hashlib.sha256(big.encode()).hexdigest()
    out["write_small"] = json.loads(write_file_tool("/workspace/notes.txt", "alpha\nbeta 🙂\ngamma\n"))
    out["read"] = json.loads(read_file_tool("/workspace/notes.txt"))
    out["patch"] = json.loads(
        patch_tool(mode="replace", path="/workspace/notes.txt", old_string="beta 🙂", new_string="BETA")
    )
    out["after_patch"] = terminal("cat /workspace/notes.txt")
    out["search"] = json.loads(search_tool("BETA", target="content", path="/workspace"))
    out["read_big_tail"] = json.loads(read_file_tool("/workspace/big.txt", offset=89_999, limit=2))
    cleanup_all()
    return out


def s_execute_code(args):
    discover()
    from tools.code_execution_tool import execute_code

    code = (
        "from hermes_tools import terminal\n"
        "r = terminal('echo from-inner-tool && uname -s')\n"
        "print('INNER', r.get('output', '').strip().replace(chr(10), ' | '))\n"
        "print('EXIT', r.get('exit_code'))\n"
    )
    started = time.monotonic()
    result = json.loads(execute_code(code, task_id="default"))
    out = {"result": result, "seconds": time.monotonic() - started}
    cleanup_all()
    return out


def s_background(args):
    discover()
    from tools.process_registry import process_registry

    started = terminal("for i in 1 2 3; do echo tick $i; sleep 0.5; done; echo bg-done", background=True)
    session_id = started.get("session_id")
    deadline = time.monotonic() + 60
    session = None
    while time.monotonic() < deadline:
        session = process_registry.get(session_id)
        if session is not None and getattr(session, "exited", False):
            break
        time.sleep(0.5)
    out = {
        "started": started,
        "exited": getattr(session, "exited", None),
        "exit_code": getattr(session, "exit_code", None),
        "output": getattr(session, "output_buffer", None),
    }
    cleanup_all()
    return out


def s_fetch_file(args):
    discover()
    terminal("head -c 3000000 /dev/urandom > /workspace/blob.bin && sha256sum /workspace/blob.bin")
    env = active_env()
    digest = terminal("sha256sum /workspace/blob.bin | cut -c1-64")["output"].strip()
    dest = Path(args["dest"])
    env.fetch_file("/workspace/blob.bin", dest, max_bytes=50 * 1024 * 1024)
    import hashlib

    out = {"remote_sha": digest, "local_sha": hashlib.sha256(dest.read_bytes()).hexdigest()}
    errors = {}
    for name, path, limit in (("missing", "/workspace/nope", 1000), ("too_big", "/workspace/blob.bin", 1000)):
        try:
            env.fetch_file(path, Path(args["dest"] + "." + name), max_bytes=limit)
            errors[name] = None
        except Exception as exc:
            errors[name] = [type(exc).__name__, str(exc), os.path.exists(args["dest"] + "." + name)]
    out["errors"] = errors
    cleanup_all()
    return out


def s_restore(args):
    """The workspace is stopped (as the idle timer does) between two commands: Hermes must warn the model."""
    discover()
    out = {"write": terminal("echo kept > /workspace/marker.txt")}
    env = active_env()
    # A process that outlives its command, started below Hermes' tools: terminal(background=True) would add a
    # poller whose own commands could be the first to see the restore (and take Hermes' one-time notice).
    # setsid -f returns before the child has exec'd sleep: wait for it to show up (bounded) before asserting on it
    out["bg"] = env.execute(
        "setsid -f sleep 300 >/dev/null 2>&1; for _ in $(seq 50); do pgrep -fx 'sleep 300' >/dev/null && "
        "{ echo running; break; }; sleep 0.1; done"
    )
    env._client.stop(env.namespace, env.workspace)
    out["status_after_stop"] = env._client.get_workspace(env.namespace, env.workspace)
    out["after"] = terminal("cat /workspace/marker.txt; pgrep -fx 'sleep 300' || echo no-processes")
    out["next"] = terminal("true")
    # Hermes lets go of the environment (its idle reaper or exit): the plugin stops the workspace in the
    # background; a new environment's first command finds it restored, and Hermes says so again.
    client = env._client.__class__(os.environ["HERMES_CF_ENDPOINT"], os.environ["HERMES_CF_TOKEN"])
    cleanup_all()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and client.get_workspace(env.namespace, env.workspace)["state"] != "stopped":
        time.sleep(0.2)
    out["new_env_first"] = terminal("cat /workspace/marker.txt")
    cleanup_all()
    return out


def s_idle(args):
    """A server with a short IDLE_SECONDS snapshots and stops the workspace by itself between two commands."""
    discover()
    out = {"write": terminal("echo idle-kept > /workspace/marker.txt")}
    if out["write"].get("environment_recreated"):  # a slow machine let it idle out before the write: again
        out["write"] = terminal("echo idle-kept > /workspace/marker.txt")
    env = active_env()
    states, deadline = [], time.monotonic() + 60
    while time.monotonic() < deadline:
        status = env._client.get_workspace(env.namespace, env.workspace)
        states.append(status["state"])
        if status["state"] == "stopped":
            break
        time.sleep(0.25)
    out["states"] = states
    out["after"] = terminal("cat /workspace/marker.txt")
    cleanup_all()
    return out


def s_server_down(args):
    """Interactive: the test stops the server after STEP stop-server and starts it again after STEP start-server."""
    discover()
    out = {"before": terminal("echo up > /workspace/state.txt && cat /workspace/state.txt")}
    step("stop-server")
    started = time.monotonic()
    out["down"] = terminal("echo while-down")
    out["down_seconds"] = time.monotonic() - started
    cleanup_all()  # as Hermes' idle reaper would: the next call must build a new environment
    out["down_new_env"] = terminal("echo new-env")
    step("start-server")
    out["recovered"] = terminal("cat /workspace/state.txt")
    cleanup_all()
    return out


def s_cleanup(args):
    """Hermes' own teardown: persistent → stopped (not deleted); force_remove → deleted."""
    discover()
    terminal("echo x > /workspace/x.txt")
    env = active_env()
    names = (env.namespace, env.workspace)
    client = env._client.__class__(os.environ["HERMES_CF_ENDPOINT"], os.environ["HERMES_CF_TOKEN"])
    try:
        from tools.terminal_tool_lifecycle import cleanup_vm
    except ImportError:
        from tools.terminal_tool import cleanup_vm

    cleanup_vm("default")
    states = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = client.get_workspace(*names)
        states.append(status["state"])
        if not status["running"] and status["state"] == "stopped":
            break
        time.sleep(0.3)
    out = {"after_cleanup": client.get_workspace(*names)}
    env.cleanup()  # idempotent: a second call does nothing and raises nothing
    # a probe environment is ephemeral and never touches the user's workspace
    from agent.terminal_env_registry import get_provider

    provider = get_provider("cloudflare_sandbox")
    probe = provider.create_environment(cwd="/root", timeout=4, task_id="prompt-backend-probe", container_config={})
    out["probe"] = {
        "workspace": probe.workspace,
        "persistent": probe._persistent,
        "uname": probe.execute("uname -s", timeout=60),
    }
    probe.cleanup(force_remove=True)
    probe.cleanup(force_remove=True)
    from flarebox_plugin_under_test.client import ApiError  # noqa: F401 - same module Hermes loaded

    deadline = time.monotonic() + 30
    gone = False
    while time.monotonic() < deadline and not gone:
        try:
            client.get_workspace(probe.namespace, probe.workspace)
            time.sleep(0.2)
        except Exception as exc:
            gone = getattr(exc, "code", None) == "workspace_not_found"
    out["probe_deleted"] = gone
    out["user_workspace_still_there"] = client.get_workspace(*names)["state"]
    return out


def s_bench(args):
    """Timings for bench/bench_hermes.py: terminal_tool("true") and a 1 MB write_file_tool, on whichever backend
    config.yaml selects (the plugin, or Hermes' local backend for the baseline)."""
    discover()
    from tools.file_tools import write_file_tool

    repeat, directory = int(args.get("repeat", 20)), args["dir"]
    payload = ("0123456789abcdef" * 64 + "\n") * 1000  # ~1 MB of text
    for _ in range(3):  # warm: environment built, session snapshot taken, connections open
        assert terminal("true")["exit_code"] == 0
        assert "error" not in json.loads(write_file_tool(f"{directory}/warm.txt", payload))
    true_times, write_times = [], []
    for i in range(repeat):
        started = time.perf_counter()
        result = terminal("true")
        true_times.append(time.perf_counter() - started)
        assert result["exit_code"] == 0, result
        started = time.perf_counter()
        written = json.loads(write_file_tool(f"{directory}/bench-{i}.txt", payload))
        write_times.append(time.perf_counter() - started)
        assert written.get("bytes_written") == len(payload.encode()), written
    cleanup_all()
    return {"terminal_true": true_times, "write_1mb": write_times, "bytes": len(payload.encode())}


# --- plugin fixes (issue 18): exit after execute_code, the restore notice, background workdir and kill ---------


def s_exit_after_execute_code(args):
    """Hermes' CLI exit after an execute_code session: its cleanup releases every environment (the plugin stops the
    workspace), then the interpreter's atexit shuts the remote kernel down through the released environment
    (`pkill …; kill …`, `rm -rf /tmp/hermes_rkernel_…`). main() exits normally for this scenario so that atexit
    runs; every command the kernel sends is logged to args["log"] with its outcome."""
    discover()
    import tools.code_kernel_remote as kernels
    from tools.code_execution_tool import execute_code

    log, phase, real_sh = Path(args["log"]), {"name": "session"}, kernels._sh

    def logged_sh(env, cmd, timeout=15):
        entry, started = {"phase": phase["name"], "command": cmd}, time.monotonic()
        try:
            entry["output"] = real_sh(env, cmd, timeout)
            return entry["output"]
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            entry["seconds"] = time.monotonic() - started
            with open(log, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(entry) + "\n")

    kernels._sh = logged_sh
    code = "from hermes_tools import terminal\nprint('INNER', terminal('echo via-kernel')['output'].strip())\n"
    out = {"result": json.loads(execute_code(code, task_id="default"))}
    env = active_env()
    out["names"] = [env.namespace, env.workspace]
    out["kernel_dirs"] = terminal("ls -d /tmp/hermes_rkernel_* 2>/dev/null || true")["output"].split()
    # ballast, so that the stop's snapshot takes long enough for a late command to arrive while it is under way
    out["ballast"] = terminal("head -c 20000000 /dev/urandom > /workspace/ballast && echo ok")["output"]
    client = env._client.__class__(os.environ["HERMES_CF_ENDPOINT"], os.environ["HERMES_CF_TOKEN"])
    cleanup_all()  # what the CLI's _run_cleanup does on exit, before the interpreter's atexit handlers
    # a late command while the plugin's stop is under way (the server would queue it and boot the workspace again
    # once the stop is done): answered at once, sent nowhere
    deadline = time.monotonic() + 10
    state = client.get_workspace(env.namespace, env.workspace)["state"]
    while time.monotonic() < deadline and state not in ("saving", "stopped"):
        time.sleep(0.005)
        state = client.get_workspace(env.namespace, env.workspace)["state"]
    out["state_at_late"] = state
    started = time.monotonic()
    try:
        out["late"] = env.execute("echo late", timeout=10)
    except Exception as exc:
        out["late"] = {"error": [type(exc).__name__, str(exc), getattr(exc, "retry_hint", "")]}
    out["late_seconds"] = time.monotonic() - started
    # then Hermes exits after the stop has finished: the atexit teardown meets a stopped workspace
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and client.get_workspace(env.namespace, env.workspace)["state"] != "stopped":
        time.sleep(0.2)
    out["status_before_exit"] = client.get_workspace(env.namespace, env.workspace)
    client.close()
    phase["name"] = "exit"
    return out


def s_restore_notice(args):
    """The workspace is stopped between two commands and the first command after it is a file tool's internal one:
    Hermes hands its one-time "environment recreated" notice to that command, whose result the model never sees."""
    discover()
    from tools.file_tools import read_file_tool, write_file_tool

    out = {"write": terminal("echo kept > /workspace/marker.txt")}
    env = active_env()
    env._client.stop(env.namespace, env.workspace)
    out["status_after_stop"] = env._client.get_workspace(env.namespace, env.workspace)
    out["read"] = json.loads(read_file_tool("/workspace/marker.txt"))  # its `cat` meets the restored workspace
    out["write_after"] = json.loads(write_file_tool("/workspace/other.txt", "x\n"))
    out["terminal"] = terminal("cat /workspace/marker.txt")
    out["terminal_again"] = terminal("true")
    cleanup_all()
    return out


def _wait_exited(session_id, seconds=60):
    from tools.process_registry import process_registry

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        session = process_registry.get(session_id)
        if session is not None and getattr(session, "exited", False):
            return session
        time.sleep(0.3)
    return process_registry.get(session_id)


def s_background_workdir(args):
    """terminal(background=True, workdir=…) runs in the workdir, whatever cwd the previous command left, and leaves
    the foreground cwd alone."""
    discover()
    out = {"setup": terminal("mkdir -p /workspace/bgdir /workspace/elsewhere && cd /workspace/elsewhere && pwd")}
    started = terminal("pwd > /workspace/bg-pwd.txt", background=True, workdir="/workspace/bgdir")
    out["started"] = started
    session = _wait_exited(started.get("session_id"))
    out["exited"] = getattr(session, "exited", None)
    out["bg_pwd"] = terminal("cat /workspace/bg-pwd.txt")
    out["fg_pwd"] = terminal("pwd")
    cleanup_all()
    return out


def s_background_kill(args):
    """`process kill` of a background job ends the job itself, not only Hermes' wrapper subshell around it."""
    discover()
    from tools.process_registry import process_registry

    marker = args["marker"]  # a sleep length nothing else uses, to find the job's processes by
    started = terminal(f"sleep {marker}; echo never", background=True)
    out = {"started": started}
    probe = f"pgrep -fx 'sleep {marker}' >/dev/null && echo alive || echo gone"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and terminal(probe)["output"].strip() != "alive":
        time.sleep(0.2)
    out["before"] = terminal(probe)["output"].strip()
    out["kill"] = process_registry.kill_process(started["session_id"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and terminal(probe)["output"].strip() != "gone":
        time.sleep(0.2)
    out["after"] = terminal(probe)["output"].strip()
    out["wrapper_left"] = terminal(f"pgrep -fx 'bash -lc sleep {marker}; echo never' || echo none")["output"]
    cleanup_all()
    return out


def s_dotenv_terminal(args):
    """The profile's .env, loaded the way Hermes' CLI loads it, is the only source of the Flarebox settings."""
    from hermes_cli.env_loader import load_hermes_dotenv

    load_hermes_dotenv(hermes_home=os.environ["HERMES_HOME"])
    import hashlib

    token = os.environ.get("HERMES_CF_TOKEN") or ""
    out = {"token_sha": hashlib.sha256(token.encode()).hexdigest(), "endpoint": os.environ.get("HERMES_CF_ENDPOINT")}
    discover()
    out["terminal"] = terminal("echo via-dotenv")
    cleanup_all()
    return out


# --- scenarios on hermes-agent 0.19.0 (no provider plugins: BaseEnvironment level) -------------------------


def _env_019(plugin, persistent=True):
    from flarebox_plugin_under_test.config import load_settings
    from flarebox_plugin_under_test.environment import CloudflareSandboxEnvironment

    settings = load_settings()
    return CloudflareSandboxEnvironment(
        settings=settings,
        workspace=settings.persistent_workspace("t019"),
        cwd="/workspace",
        timeout=60,
        persistent=persistent,
    )


def s_base_019(args):
    plugin = load_plugin()
    out = {}

    class Ctx:  # a 0.19.0 PluginContext has no register_terminal_environment_provider
        pass

    plugin.register(Ctx())
    env = _env_019(plugin)
    out["snapshot_ready"] = env._snapshot_ready
    out["cd"] = env.execute("mkdir -p d && cd d && export V=1 && pwd")
    out["persist"] = env.execute('pwd; echo "V=$V"')
    out["exit"] = env.execute("exit 5")
    out["stdin"] = env.execute("cat", stdin_data="héllo 🙂\n" * 3)
    big = "x" * 900_000 + "\n"
    out["big_stdin"] = env.execute("wc -c", stdin_data=big)
    out["timeout"] = env.execute("sleep 20", timeout=2)
    # Hermes 0.19.0's own tools, with the factory patched to return our environment
    import tools.terminal_tool as tt

    tt._create_environment = lambda *a, **k: env
    from tools.file_tools import read_file_tool, write_file_tool

    out["write_tool"] = json.loads(write_file_tool("/workspace/w.txt", "hello from 0.19\n"))
    out["read_tool"] = json.loads(read_file_tool("/workspace/w.txt"))
    out["terminal_tool"] = json.loads(tt.terminal_tool("cat /workspace/w.txt"))
    # 0.19.0's execute_code has only the per-call path: an RPC poller thread runs env.execute every 100 ms while
    # the script runs — a backend that serialises commands deadlocks here.
    from tools.code_execution_tool import execute_code

    code = "from hermes_tools import terminal\nprint('INNER', terminal('echo via-rpc')['output'].strip())\n"
    started = time.monotonic()
    out["execute_code"] = json.loads(execute_code(code, task_id="default"))
    out["execute_code_seconds"] = time.monotonic() - started
    results = {}

    def concurrent(i):
        results[i] = env.execute(f"sleep 1; echo c{i}")

    threads = [threading.Thread(target=concurrent, args=(i,)) for i in range(4)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    out["concurrent"] = {str(k): v for k, v in results.items()}
    out["concurrent_seconds"] = time.monotonic() - started
    env.cleanup(force_remove=True)
    env.cleanup()
    # the server unreachable: 0.19.0 has no EnvironmentConnectionError; the plugin's fallback is a RuntimeError
    import dataclasses

    from flarebox_plugin_under_test.config import load_settings
    from flarebox_plugin_under_test.environment import CloudflareSandboxEnvironment

    dead = dataclasses.replace(load_settings(), endpoint="http://127.0.0.1:9")
    try:
        CloudflareSandboxEnvironment(settings=dead, workspace="dead", cwd="/workspace", timeout=10, persistent=True)
        out["dead"] = None
    except Exception as exc:
        out["dead"] = [type(exc).__name__, isinstance(exc, RuntimeError), str(exc), getattr(exc, "retry_hint", "")]
    return out


SCENARIOS = {name[2:]: fn for name, fn in globals().items() if name.startswith("s_")}


def main() -> int:
    name = sys.argv[1]
    args = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    if name != "base_019":
        load_plugin()  # lets scenarios import helpers from the installed copy
    try:
        result = SCENARIOS[name](args)
    except Exception as exc:
        import traceback

        emit("RESULT", {"crashed": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        return 1
    emit("RESULT", result)
    return 0


# Scenarios that test Hermes' own atexit teardown: they end with a normal interpreter exit.
EXITS_NORMALLY = {"exit_after_execute_code"}

if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    if sys.argv[1] in EXITS_NORMALLY:
        sys.exit(code)
    os._exit(code)  # skip Hermes' atexit teardown races; scenarios clean up themselves
