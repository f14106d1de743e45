"""Services: long-running processes the supervisor keeps up, by name (docs/protocol.md, "Supervisor API").

The workspace sends the whole set after every boot (PUT /services) and single changes later; the supervisor starts
each as `bash -c command` in its own session as the sandbox user, with stdout+stderr in a log ring (servicelog.py),
watches its port until it answers, and restarts it after an exit as its policy says, with backoff. States:

    starting --(port accepts, health path 2xx/3xx)--> running
    starting|running --(exit)--> backoff --(delay)--> starting       (restart policy says so)
                                 failed                              (SERVICE_MAX_QUICK_EXITS quick exits in a row,
                                                                      or a failure with restart "never")
                                 stopped                             (exit 0 under "on-failure"/"never", or a stop)

Services are not commands: exec's Registry never sees them, so /health's `running` (the idle alarm's signal)
does not count them — a service with no requests flowing lets its workspace sleep.
"""

import asyncio
import errno
import logging
import os
import signal
import subprocess
import time

import httptools

from flarebox_supervisor.groups import group_alive, signal_group
from flarebox_supervisor.httpio import no_query, read_large_json, stream_journal
from flarebox_supervisor.httpserver import Application, Request, Response, StreamResponse, json_response
from flarebox_supervisor.identity import Identity
from flarebox_supervisor.output import OutputPipe, make_pipe
from flarebox_supervisor.servicelog import ServiceLog
from flarebox_supervisor.settings import Settings
from protocol import limits
from protocol.errors import ProtocolError
from protocol.services import SupervisedService, parse_supervised_service, validate_service_name
from protocol.validate import _reject_unknown, validate_offset

log = logging.getLogger("flarebox_supervisor")

PROBE_SECONDS = 0.075  # how often a starting service's port (and health path) is tried
_PROBE_TIMEOUT_SECONDS = 2.0  # one connect or health GET; a slower answer counts as not ready yet
_GROUP_POLL_SECONDS = 0.05
_KILLED_WAIT_SECONDS = 2.0  # a SIGKILLed group is gone within this (unless a member is stuck in the kernel)
# After a run's process group is gone, its pipe is read this much longer: only a process that left the group (setsid)
# can still hold it, and it must not hold up the restart.
_DRAIN_SECONDS = 1.0
# Request bodies carry the secrets' values inside env, so they may exceed MAX_BODY_BYTES: a spec (at most 1 MiB on the
# public API) plus up to MAX_SERVICE_SECRETS values, with room for JSON escaping.
_PROBE_HEAD_BYTES = 64 * 1024  # what a probe reads at most: the answer's head must have come by then


class _Head:
    """httptools callbacks for a probe: only the answer's status matters (a redirect is not followed)."""

    def __init__(self) -> None:
        self.done = False

    def on_headers_complete(self) -> None:
        self.done = True


async def _probe_status(port: int, path: str) -> int | None:
    """One GET of `path` on a fresh connection to 127.0.0.1:`port`: the answer's status, None if it is not HTTP."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
        line = _Head()
        parser = httptools.HttpResponseParser(line)
        received = 0
        while not line.done and received < _PROBE_HEAD_BYTES and (data := await reader.read(4096)):
            received += len(data)
            try:
                parser.feed_data(data)
            except httptools.HttpParserError:
                return None
        return parser.get_status_code() if line.done else None
    finally:
        writer.close()


SERVICE_BODY_BYTES = 4 * (limits.MAX_BODY_BYTES + limits.MAX_SERVICE_SECRETS * limits.MAX_SECRET_VALUE_BYTES)
SERVICES_BODY_BYTES = 64 * 1024 * 1024
_ENDED = ("failed", "stopped")


def iso_now() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"


def restart_delay(quick_exits: int, settings: Settings) -> float:
    """The wait before the next start: the first delay after a long run, doubling with each quick exit in a row."""
    exponent = max(0, quick_exits - 1)
    return min(settings.service_backoff_max_seconds, settings.service_backoff_first_seconds * 2**exponent)


def after_exit(restart: str, failed: bool, quick_exits: int, settings: Settings) -> str:
    """What follows an exit: "restart", "failed" or "stopped". `failed`: non-zero code, a signal or no start."""
    if restart == "always" or (restart == "on-failure" and failed):
        return "failed" if quick_exits >= settings.service_max_quick_exits else "restart"
    return "failed" if failed else "stopped"


def _exit_future(process: subprocess.Popen) -> asyncio.Future:
    """Resolves once `process` has exited and been reaped (a pidfd where the kernel has them, else a thread)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def done() -> None:
        if not future.done():
            future.set_result(None)

    try:
        pidfd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):

        def wait() -> None:
            process.wait()
            loop.call_soon_threadsafe(done)

        loop.run_in_executor(None, wait)
        return future

    def on_exit() -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        process.wait()
        done()

    loop.add_reader(pidfd, on_exit)
    return future


def _describe_exit(code: int | None, sig: int | None) -> str:
    if sig is not None:
        try:
            return f"killed by signal {sig} ({signal.Signals(sig).name})"
        except ValueError:
            return f"killed by signal {sig}"
    if code is None:
        return "did not start"
    return f"exited with code {code}"


class Service:
    def __init__(self, name: str, spec: SupervisedService, services: "Services", service_log: ServiceLog):
        self.name = name
        self.spec = spec
        self._services = services
        self.settings = services.settings
        self.identity = services.identity
        self.log = service_log
        self.state = "starting"
        self.restarts = 0
        self.pid: int | None = None
        self.started_at: str | None = None
        self.last_exit: dict | None = None
        self._stop = asyncio.Event()
        self._spawned = asyncio.Event()  # the first run's spawn was attempted (the PUT answer then shows its pid)
        self._task: asyncio.Task | None = None

    def to_json(self) -> dict:
        spec = self.spec  # env is never echoed: it holds the secrets' values
        return {
            "name": self.name,
            "command": spec.command,
            "port": spec.port,
            "state": self.state,
            "restarts": self.restarts,
            "pid": self.pid,
            "started_at": self.started_at,
            "last_exit": self.last_exit,
            "health_path": spec.health_path,
            "restart": spec.restart,
        }

    def end_event(self, **extra) -> dict:
        return {"type": "service", "state": self.state, "restarts": self.restarts, "last_exit": self.last_exit, **extra}

    def _set_state(self, state: str) -> None:
        self.state = state
        self._services.notify()

    # -- lifecycle -----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        self.log.reopen()
        self._task = asyncio.get_running_loop().create_task(self._supervise())
        await asyncio.wait(
            {self._task, asyncio.ensure_future(self._spawned.wait())}, return_when=asyncio.FIRST_COMPLETED
        )

    @property
    def stopping(self) -> bool:
        """A stop was requested (replace, delete, shutdown)."""
        return self._stop.is_set()

    async def stop(self) -> None:
        """Stop the current run (SIGTERM to its group, SIGKILL after the grace period) and end supervision."""
        self._stop.set()
        if self._task is not None:
            await asyncio.shield(self._task)

    async def _supervise(self) -> None:
        quick_exits = 0
        try:
            while True:
                started = time.monotonic()
                code, sig = await self._run()
                exit_text = _describe_exit(code, sig)
                if self._stop.is_set():
                    self.log.note(f"{exit_text}; stopped")
                    self._set_state("stopped")
                    return
                quick = time.monotonic() - started < self.settings.service_quick_exit_seconds
                quick_exits = quick_exits + 1 if quick else 0
                failed = code != 0 or sig is not None
                step = after_exit(self.spec.restart, failed, quick_exits, self.settings)
                if step == "restart":
                    delay = restart_delay(quick_exits, self.settings)
                    self.log.note(f"{exit_text}; restarting in {delay:g} s")
                    self._set_state("backoff")
                    try:
                        async with asyncio.timeout(delay):
                            await self._stop.wait()
                        self.log.note("stopped")
                        self._set_state("stopped")
                        return
                    except TimeoutError:
                        pass
                    self.restarts += 1
                    continue
                if step == "failed":
                    restart = self.spec.restart
                    why = "restart is never" if restart == "never" else f"{quick_exits} quick exits in a row"
                    self.log.note(f"{exit_text}\n[flarebox] failed: {why}")
                else:
                    self.log.note(f"{exit_text}; not restarted (restart is {self.spec.restart})")
                self._set_state(step)
                return
        except Exception as exc:  # never leave a service half-run: end its group and say so in its log
            log.exception("service %s: supervision failed", self.name)
            if self.pid is not None:
                signal_group(self.pid, signal.SIGKILL)
            self.log.note(f"failed: supervisor error {type(exc).__name__}")
            self._set_state("failed")
        finally:
            self.pid = None
            if self.state in _ENDED and not self._stop.is_set():
                self.log.finish(self.end_event())

    async def _run(self) -> tuple[int | None, int | None]:
        """One run, from spawn to the end of its process group and its output: (exit code, signal)."""
        self._set_state("starting")
        try:
            process, pipe = self._spawn()
        except (OSError, subprocess.SubprocessError) as exc:
            if isinstance(exc, OSError) and exc.errno == errno.EAGAIN:
                reason = "the sandbox's process limit is reached"
            else:
                reason = getattr(exc, "strerror", None) or type(exc).__name__
            self.log.note(f"could not start: {reason}")
            self.last_exit = {"code": None, "signal": None, "at": iso_now()}
            return None, None
        finally:
            self._spawned.set()
        pgid = process.pid  # start_new_session: the shell leads its own group
        self.pid = pgid
        self.started_at = iso_now()
        self.log.note(f"started, pid {pgid}")
        exited = _exit_future(process)
        probe = asyncio.ensure_future(self._probe())
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({exited, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            probe.cancel()
            stop.cancel()
        if not exited.done():
            self.log.note("stopping: SIGTERM to the process group")
        if not exited.done() or group_alive(pgid):
            # what the shell left running must not hold the port (or the pipe) into the next run
            await self._end_group(pgid, exited)
        self.last_exit = self._exit_record(process.returncode)
        self.pid = None
        try:
            async with asyncio.timeout(_DRAIN_SECONDS):
                await pipe.eof.wait()
        except TimeoutError:
            pass
        pipe.close()
        return self.last_exit["code"], self.last_exit["signal"]

    def _spawn(self) -> tuple[subprocess.Popen, OutputPipe]:
        env = self.identity.base_env()
        env.update(self.spec.env)
        argv, as_user = self.identity.spawn(["/bin/bash", "-c", self.spec.command])
        read_fd, write_fd = make_pipe()
        try:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=write_fd,
                stderr=write_fd,
                cwd=self.spec.cwd,
                env=env,
                start_new_session=True,
                close_fds=True,
                **as_user,
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        return process, OutputPipe(read_fd, self.log, lambda: None)  # a ring has no limit to hit

    async def _end_group(self, pgid: int, exited: asyncio.Future) -> None:
        signal_group(pgid, signal.SIGTERM)
        grace_end = time.monotonic() + self.settings.kill_grace_seconds
        while time.monotonic() < grace_end:
            if exited.done() and not group_alive(pgid):
                return
            await asyncio.sleep(_GROUP_POLL_SECONDS)
        signal_group(pgid, signal.SIGKILL)
        await exited
        # SIGKILL is delivered asynchronously: wait (briefly) until the group is really gone, so the next run
        # does not race a dying process for the port and a DELETE answers once nothing of the service is left
        killed_end = time.monotonic() + _KILLED_WAIT_SECONDS
        while time.monotonic() < killed_end:  # polled: no event tells when a group's last member is gone
            if not group_alive(pgid):
                return
            await asyncio.sleep(_GROUP_POLL_SECONDS / 5)

    @staticmethod
    def _exit_record(returncode: int) -> dict:
        if returncode < 0:
            return {"code": None, "signal": -returncode, "at": iso_now()}
        return {"code": returncode, "signal": None, "at": iso_now()}

    # -- readiness -----------------------------------------------------------------------------------------------

    async def _probe(self) -> None:
        while True:  # polled: nothing tells the supervisor when a process starts listening
            if await self._answers():
                break
            await asyncio.sleep(PROBE_SECONDS)
        health = f" and {self.spec.health_path} answers" if self.spec.health_path else ""
        self.log.note(f"running: port {self.spec.port} accepts connections{health}")
        self._set_state("running")

    async def _answers(self) -> bool:
        port, path = self.spec.port, self.spec.health_path
        try:
            async with asyncio.timeout(_PROBE_TIMEOUT_SECONDS):
                if path is None:
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.close()
                    return True
                status = await _probe_status(port, path)
            return status is not None and 200 <= status < 400
        except (OSError, TimeoutError):
            return False
        except Exception:  # a probe must never die silently and leave the service `starting` for good
            log.exception("service %s: health probe failed", self.name)
            return False


class Services:
    def __init__(self, settings: Settings, identity: Identity):
        self.settings = settings
        self.identity = identity
        self._services: dict[str, Service] = {}
        self._lock = asyncio.Lock()  # changes one at a time: a replace awaits the old run's end
        self._changed = asyncio.Event()
        self._closing = False

    def notify(self) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    def get(self, name: str) -> Service:
        service = self._services.get(name)
        if service is None:
            raise ProtocolError("service_not_found")
        return service

    def describe(self) -> list[dict]:
        return [self._services[name].to_json() for name in sorted(self._services)]

    async def put(self, name: str, spec: SupervisedService) -> Service:
        async with self._lock:
            if name not in self._services and len(self._services) >= limits.MAX_SERVICES:
                raise ProtocolError("invalid_field", f"a workspace runs at most {limits.MAX_SERVICES} services")
            return await self._replace(name, spec)

    async def put_all(self, specs: dict[str, SupervisedService]) -> list[dict]:
        async with self._lock:
            gone = [name for name in self._services if name not in specs]
            await asyncio.gather(*(self._remove(name) for name in gone))
            await asyncio.gather(*(self._replace(name, spec) for name, spec in specs.items()))
            return self.describe()

    async def delete(self, name: str) -> None:
        async with self._lock:
            self.get(name)
            await self._remove(name)

    async def _replace(self, name: str, spec: SupervisedService) -> Service:
        old = self._services.get(name)
        if old is not None:
            old.log.note("replaced: stopping the old definition")
            await old.stop()
        # the log (and its offsets) outlives a replace, so a follower keeps following; restarts count anew
        service = Service(name, spec, self, old.log if old else ServiceLog(self.settings.service_log_chars))
        self._services[name] = service
        await service.start()
        return service

    async def _remove(self, name: str) -> None:
        service = self._services.pop(name)
        await service.stop()
        service.log.finish(service.end_event(deleted=True))
        self.notify()

    async def wait_ready(self, name: str, timeout: float) -> tuple[bool, dict]:
        deadline = time.monotonic() + timeout
        while True:
            changed = self._changed
            service = self.get(name)
            # a service stopped because it is being replaced is not an answer: its successor is
            final = service.state in _ENDED and not service.stopping
            if service.state == "running" or final or self._closing:
                return service.state == "running", service.to_json()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False, service.to_json()
            try:
                async with asyncio.timeout(remaining):
                    await changed.wait()
            except TimeoutError:
                pass

    async def stop_all(self) -> None:
        """Supervisor shutdown: every service's group is ended (SIGTERM, then SIGKILL after the grace period)."""
        self._closing = True
        self.notify()
        services = list(self._services.values())
        await asyncio.gather(*(service.stop() for service in services), return_exceptions=True)
        for service in services:
            service.log.finish(service.end_event())


# -- routes ----------------------------------------------------------------------------------------------------------


def _parse(name: str, body: object) -> SupervisedService:
    if not isinstance(body, dict):
        raise ProtocolError("invalid_field", f"services.{name} must be an object")
    try:
        return parse_supervised_service(body)
    except ProtocolError as exc:
        raise ProtocolError(exc.code, f"services.{name}: {exc.message}") from None


async def put_service(request: Request) -> Response:
    name = validate_service_name(request.match_info["name"])
    no_query(request)
    spec = parse_supervised_service(await read_large_json(request, SERVICE_BODY_BYTES))
    service = await services_of(request.app).put(name, spec)
    return json_response(service.to_json())


async def put_services(request: Request) -> Response:
    no_query(request)
    body = await read_large_json(request, SERVICES_BODY_BYTES)
    _reject_unknown(body, frozenset(("services",)))
    named = body.get("services")
    if not isinstance(named, dict):
        raise ProtocolError("invalid_field", 'services must be an object {"name": service, ...}')
    if len(named) > limits.MAX_SERVICES:
        raise ProtocolError("invalid_field", f"a workspace runs at most {limits.MAX_SERVICES} services")
    specs = {validate_service_name(name): _parse(name, value) for name, value in named.items()}
    return json_response({"services": await services_of(request.app).put_all(specs)})


async def list_services(request: Request) -> Response:
    no_query(request)
    return json_response({"services": services_of(request.app).describe()})


async def delete_service(request: Request) -> Response:
    name = validate_service_name(request.match_info["name"])
    no_query(request)
    await services_of(request.app).delete(name)
    return json_response({"name": name, "deleted": True})


async def service_logs(request: Request) -> StreamResponse:
    name = validate_service_name(request.match_info["name"])
    no_query(request, frozenset({"offset"}))
    offset = validate_offset(request.query.get("offset", "0"))
    service = services_of(request.app).get(name)
    return await stream_journal(request, service.log, offset)


def _timeout(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise ProtocolError("invalid_query", "timeout is a number of seconds >= 0")
    return min(seconds, limits.SERVICE_READY_SECONDS)


async def service_ready(request: Request) -> Response:
    name = validate_service_name(request.match_info["name"])
    no_query(request, frozenset({"timeout"}))
    timeout = _timeout(request.query.get("timeout", str(limits.SERVICE_READY_SECONDS)))
    ready, service = await services_of(request.app).wait_ready(name, timeout)
    return json_response({"ready": ready, "service": service})


def services_of(app: Application) -> Services:
    """The workspace's services, made by the first request about them (this module loads then, not at the
    supervisor's start), with the shutdown hook that ends them."""
    services = app.get("services")
    if services is None:
        services = app["services"] = Services(app["settings"], app["identity"])

        async def on_shutdown(app: Application) -> None:
            await services.stop_all()

        app.on_shutdown.append(on_shutdown)
    return services
