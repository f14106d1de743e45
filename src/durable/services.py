"""A workspace's services and secrets: their records in the workspace's storage, and the supervisor calls that run
the services.

The workspace object owns the definitions (they outlive every container: processes never survive a snapshot, so
each boot starts them again); the supervisor owns the running processes, their state and their logs. Secrets are
stored sealed (ports.Cipher) and opened only to build the environment of a service or an exec that names them:
never returned, logged or written anywhere else.
"""

import base64
import binascii
import json
import logging
from typing import Any

from durable.ports import JSON_TYPE, Cipher, Container, ContainerGone, ContainerResponse, Storage
from durable.supervisor_client import error_of, query
from durable.timefmt import iso_ms
from protocol import limits
from protocol.errors import ProtocolError
from protocol.services import ServiceSpec, service_from_json, supervised

log = logging.getLogger("flarebox.services")

# The sealed format both runtimes' ciphers share (a value sealed by one opens with the other under the same key):
# a fresh nonce, then the AES-256-GCM ciphertext and its tag.
NONCE_BYTES = 12
KEY_BYTES = 32


def decode_secrets_key(text: str) -> bytes:
    """SECRETS_KEY's value as the key: base64 of exactly 32 bytes; ValueError (never holding the value) otherwise."""
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != KEY_BYTES:
        raise ValueError("SECRETS_KEY must be base64 of 32 random bytes (for example: openssl rand -base64 32)")
    return key


_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS services (name TEXT PRIMARY KEY, spec TEXT NOT NULL, updated_at_ms INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS secrets (name TEXT PRIMARY KEY, sealed TEXT NOT NULL, updated_at_ms INTEGER NOT NULL)",
)
TABLES = ("services", "secrets")

# What a defined service reports while its workspace sleeps (no supervisor to ask)
_RESTING = {"state": "stopped", "restarts": 0, "pid": None, "started_at": None, "last_exit": None}
_RUNTIME_FIELDS = tuple(_RESTING)


class ServiceBook:
    def __init__(self, storage: Storage, cipher: Cipher, namespace: str, workspace: str):
        self._sql = storage.sql
        self._cipher = cipher
        self._where = f"{namespace}/{workspace}"
        for statement in _SCHEMA:
            self._sql(statement)

    def wipe(self) -> None:
        """A deleted workspace keeps no definition and no sealed secret."""
        for table in TABLES:
            self._sql(f"DELETE FROM {table}")  # noqa: S608 - fixed table names

    # --- definitions ----------------------------------------------------------------------------------------

    def specs(self) -> dict[str, ServiceSpec]:
        rows = self._sql("SELECT name, spec FROM services ORDER BY name")
        return {row["name"]: service_from_json(json.loads(row["spec"])) for row in rows}

    def spec(self, name: str) -> ServiceSpec:
        rows = self._sql("SELECT spec FROM services WHERE name = ?", name)
        if not rows:
            raise ProtocolError("service_not_found")
        return service_from_json(json.loads(rows[0]["spec"]))

    def by_port(self, port: int) -> tuple[str, ServiceSpec] | None:
        return next(((name, spec) for name, spec in self.specs().items() if spec.port == port), None)

    def define(self, name: str, spec: ServiceSpec, now_ms: int) -> bool:
        """Store `spec` under `name`; True when the service is new. Checks the limits the body alone cannot."""
        specs = self.specs()
        if name not in specs and len(specs) >= limits.MAX_SERVICES:
            raise ProtocolError("invalid_field", f"a workspace defines at most {limits.MAX_SERVICES} services")
        taken = next((other for other, s in specs.items() if other != name and s.port == spec.port), None)
        if taken is not None:
            raise ProtocolError("invalid_port", f"port {spec.port} is already the port of service {taken!r}")
        self.require_secrets((*spec.secrets, *((spec.bearer_secret,) if spec.bearer_secret else ())))
        self._sql(
            "INSERT INTO services (name, spec, updated_at_ms) VALUES (?, ?, ?) ON CONFLICT(name) DO UPDATE SET "
            "spec = excluded.spec, updated_at_ms = excluded.updated_at_ms",
            name,
            json.dumps(spec.to_json(), separators=(",", ":")),
            now_ms,
        )
        return name not in specs

    def remove(self, name: str) -> None:
        self.spec(name)  # service_not_found
        self._sql("DELETE FROM services WHERE name = ?", name)

    # --- secrets --------------------------------------------------------------------------------------------

    def require_secrets(self, names: tuple[str, ...]) -> None:
        """secret_not_found for the first of `names` the workspace does not hold (a service or exec naming it)."""
        missing = [name for name in names if not self._secret_exists(name)]
        if missing:
            raise ProtocolError("secret_not_found", f"no secret {missing[0]!r}: PUT …/secrets/{missing[0]} first")

    def _secret_exists(self, name: str) -> bool:
        return bool(self._sql("SELECT 1 AS one FROM secrets WHERE name = ?", name))

    def _aad(self, name: str) -> bytes:
        return f"{self._where}/{name}".encode()  # a sealed value only opens where it was stored

    async def put_secret(self, name: str, value: str, now_ms: int) -> bool:
        """Seal and store; True when the secret is new."""
        if not self._cipher.available:
            raise ProtocolError("secrets_unavailable")
        new = not self._secret_exists(name)
        if new and len(self.secrets()) >= limits.MAX_SECRETS:
            raise ProtocolError("invalid_field", f"a workspace holds at most {limits.MAX_SECRETS} secrets")
        sealed = await self._cipher.seal(value.encode("utf-8"), self._aad(name))
        self._sql(
            "INSERT INTO secrets (name, sealed, updated_at_ms) VALUES (?, ?, ?) ON CONFLICT(name) DO UPDATE SET "
            "sealed = excluded.sealed, updated_at_ms = excluded.updated_at_ms",
            name,
            base64.b64encode(sealed).decode("ascii"),
            now_ms,
        )
        return new

    def secrets(self) -> list[dict[str, Any]]:
        """Names and update times only: a value is never answered."""
        rows = self._sql("SELECT name, updated_at_ms FROM secrets ORDER BY name")
        return [{"name": row["name"], "updated_at": iso_ms(row["updated_at_ms"])} for row in rows]

    def delete_secret(self, name: str) -> None:
        if not self._secret_exists(name):
            raise ProtocolError("secret_not_found")
        self._sql("DELETE FROM secrets WHERE name = ?", name)

    async def open_secrets(self, names: tuple[str, ...]) -> dict[str, str]:
        """The values of the named secrets that exist. One that no longer opens (the deployment's key changed) is
        left out and logged by name, never by value."""
        values: dict[str, str] = {}
        for name in names:
            rows = self._sql("SELECT sealed FROM secrets WHERE name = ?", name)
            if not rows:
                continue
            try:
                plain = await self._cipher.open(base64.b64decode(rows[0]["sealed"]), self._aad(name))
                values[name] = plain.decode("utf-8")
            except (ValueError, UnicodeDecodeError):
                log.error("secret %s of %s does not open under this deployment's key; left out", name, self._where)
        return values

    # --- the supervisor ---------------------------------------------------------------------------------------

    async def _supervised_json(self, spec: ServiceSpec, default_cwd: str) -> dict[str, Any]:
        return supervised(spec, default_cwd, await self.open_secrets(spec.secrets)).to_json()

    async def start_all(self, container: Container, default_cwd: str) -> None:
        """Hand the supervisor every definition (at boot). A failure is logged, not raised: the workspace still
        serves commands, and GET …/services shows what runs."""
        specs = self.specs()
        if not specs:
            return
        body = {"services": {name: await self._supervised_json(spec, default_cwd) for name, spec in specs.items()}}
        try:
            resp = await container.fetch("PUT", "/services", body=_json(body), headers={"content-type": JSON_TYPE})
            if resp.status != 200:
                raise await error_of(resp, fallback="internal_error")
            await resp.read()
        except (ContainerGone, ProtocolError) as exc:
            log.warning("starting the services of %s failed: %s", self._where, exc)

    async def start(self, container: Container, name: str, spec: ServiceSpec, default_cwd: str) -> dict[str, Any]:
        """(Re)start one service in a running container; its runtime fields."""
        body = _json(await self._supervised_json(spec, default_cwd))
        resp = await container.fetch("PUT", f"/services/{name}", body=body, headers={"content-type": JSON_TYPE})
        return await _runtime(resp)

    async def stop(self, container: Container, name: str) -> None:
        resp = await container.fetch("DELETE", f"/services/{name}")
        if resp.status not in (200, 404):  # 404: it never ran in this container
            raise await error_of(resp, fallback="internal_error")
        await resp.read()

    async def runtime(self, container: Container | None) -> dict[str, dict[str, Any]]:
        """Each running service's runtime fields by name; {} when no container runs (or its supervisor fails)."""
        if container is None:
            return {}
        try:
            resp = await container.fetch("GET", "/services")
            if resp.status != 200:
                await resp.read()
                return {}
            listed = (await resp.json()).get("services")
        except (ContainerGone, ValueError, AttributeError):
            return {}
        if not isinstance(listed, list):
            return {}
        return {item["name"]: _fields(item) for item in listed if isinstance(item, dict) and "name" in item}

    async def ready(self, container: Container, name: str) -> None:
        """Wait (bounded) for a service to accept requests. Never raises: a service that is not ready answers the
        proxied request itself (502 when nothing listens)."""
        try:
            timeout = limits.SERVICE_READY_SECONDS
            resp = await container.fetch("GET", f"/services/{name}/ready?{query(timeout=timeout)}", timeout=timeout + 5)
            await resp.read()
        except ContainerGone:
            pass

    async def logs(self, container: Container, name: str, offset: int) -> ContainerResponse:
        resp = await container.fetch("GET", f"/services/{name}/logs?{query(offset=offset)}")
        if resp.status != 200:
            raise await error_of(resp, fallback="service_not_found")
        return resp


def describe(name: str, spec: ServiceSpec, runtime: dict[str, Any] | None) -> dict[str, Any]:
    """The service object of docs/protocol.md: the definition and, while its workspace runs, its process."""
    return {"name": name, **spec.to_json(), **(runtime or _RESTING)}


def _fields(item: dict[str, Any]) -> dict[str, Any]:
    """The runtime fields of the supervisor's service object, and only those (it is the sandbox's to forge)."""
    return {key: item.get(key, _RESTING[key]) for key in _RUNTIME_FIELDS}


async def _runtime(resp: ContainerResponse) -> dict[str, Any]:
    if resp.status != 200:
        raise await error_of(resp, fallback="internal_error")
    body = await resp.json()
    return _fields(body) if isinstance(body, dict) else dict(_RESTING)


def _json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()
