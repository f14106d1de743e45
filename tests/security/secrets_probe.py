"""Helpers shared by the security tests: raw HTTP (no client-side path normalisation), a traffic mix that provokes
many errors, and a search of snapshot archives."""

import io
import json
import socket
import subprocess
import tarfile
from pathlib import Path

import httpx
from e2e import exec_events, rid, ws_url


def raw_request(port: int, head: bytes, body: bytes = b"", read_timeout: float = 20) -> tuple[int, bytes]:
    """Send exactly these bytes to 127.0.0.1:port; return (status, response body) — (0, b"") if the server closed
    the connection without answering."""
    with socket.create_connection(("127.0.0.1", port), timeout=read_timeout) as sock:
        try:
            sock.sendall(head + body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer and close before reading everything: read what it said
        chunks = []
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                if _complete(b"".join(chunks)):
                    break
        except (ConnectionResetError, TimeoutError):
            pass
    data = b"".join(chunks)
    if not data.startswith(b"HTTP/1.1 "):
        return 0, b""
    status = int(data[9:12])
    return status, data.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in data else b""


def _complete(data: bytes) -> bool:
    if b"\r\n\r\n" not in data:
        return False
    head, body = data.split(b"\r\n\r\n", 1)
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False


def request_head(method: str, target: str, token: str | None, extra: dict[str, str] | None = None) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    if token:
        lines.append(f"Authorization: Bearer {token}")
    lines += [f"{k}: {v}" for k, v in (extra or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def provoke_errors(server, secret: str) -> list[str]:
    """Send requests that fail in as many ways as possible — several carrying `secret` where a careless server
    would echo it — and return every response body and stream line (for searching)."""
    bodies: list[str] = []
    url = server.url
    ns = "errs"
    good = server.headers()
    with httpx.Client(base_url=url, timeout=60) as client:

        def send(method: str, path: str, headers=good, **kwargs) -> None:
            bodies.append(client.request(method, path, headers=headers, **kwargs).text)

        # authentication: missing, wrong, the right token mangled, another scheme, the token in odd places
        for headers in (
            {},
            {"Authorization": f"Bearer {secret}x"},
            {"Authorization": f"Bearer x{secret}"},
            {"Authorization": f"Basic {secret}"},
            {"Authorization": secret},
            {"Authorization": f"Bearer {secret.upper()}"},
            {"X-Token": secret},
        ):
            send("GET", "/v1/health", headers=headers)
            send("PUT", ws_url(ns, "w"), headers=headers, json={"image": secret})
        # the secret as names, ids, query keys and values, field names and values
        send("GET", ws_url(ns, secret))
        send("GET", ws_url(secret, "w"))
        send("GET", ws_url(ns, "w", "exec", secret))
        send("GET", f"/v1/{secret}")
        send("GET", "/v1/health", params={secret: "1"})
        send("GET", "/v1/health", params={"token": secret})
        send("DELETE", ws_url(ns, "w"), params={"confirm": secret})
        send("PUT", ws_url(ns, "w"), json={secret: 1})
        send("PUT", ws_url(ns, "w"), json={"image": secret})
        send("PUT", ws_url(ns, "w"), json={"instance": secret})
        send("PUT", ws_url(ns, "w"), json={"cwd": secret})
        send("PUT", ws_url(ns, "w"), content=secret.encode(), headers={**good, "Content-Type": "application/json"})
        send("PUT", ws_url(ns, "w"), content=b"{}", headers={**good, "Content-Type": secret})
        send("PUT", ws_url(ns, "w"), json={})
        send("PUT", ws_url(ns, "w"), json={"persistent": False})  # config_conflict
        send("POST", ws_url(ns, "w", "exec"), json={"request_id": secret, "command": "true"})
        send("POST", ws_url(ns, "w", "exec"), json={"request_id": rid(), "command": "true", secret: secret})
        send("POST", ws_url(ns, "w", "exec"), json={"request_id": rid(), "command": "true", "timeout": secret})
        send("POST", ws_url(ns, "w", "exec"), json={"request_id": rid(), "command": "true", "env": {secret + "=": "v"}})
        send("POST", ws_url(ns, "w", "exec"), json={"request_id": rid(), "command": secret * 2000})
        send("GET", ws_url(ns, "w", "files"), params={"path": secret})
        send("GET", ws_url(ns, "w", "files"), params={"path": "/nonexistent/" + secret})
        send("PUT", ws_url(ns, "w", "files"), params={"path": "/" + secret, "mode": secret}, content=b"x")
        send("PUT", ws_url(ns, "w", "files"), params={"path": "/etc/" + secret}, content=b"x")  # permission_denied
        send("POST", ws_url(ns, "w", "snapshot"))
        send("POST", ws_url(ns, "nope", "stop"))
        send("PATCH", ws_url(ns, "w"))
        # stream errors: a cwd that does not exist, a cancelled id, a duplicate id
        with server.client() as authed:
            for fields in ({"cwd": "/nonexistent/" + secret}, {}):
                bodies += [json.dumps(e) for e in exec_events(authed, ns, "w", "echo ok", **fields)]
        cancelled = rid()
        send("POST", ws_url(ns, "w", "exec", cancelled, "cancel"))
        send("POST", ws_url(ns, "w", "exec"), json={"request_id": cancelled, "command": "true"})
        send("GET", ws_url(ns, "w", "exec", rid()))
    # raw requests no client would send
    for head in (
        request_head("GET", f"/v1/health/../{secret}", server.token),
        request_head("GET", f"/v1/workspaces/{ns}/%2e%2e%2f{secret}", server.token),
        request_head("GET", "/v1/health", None, {"Authorization": f"Bearer {secret}", "X-Big": "y" * 40000}),
    ):
        bodies.append(raw_request(server.port, head)[1].decode("utf-8", "replace"))
    return bodies


def snapshot_members(archive: Path) -> dict[str, bytes]:
    """Every member of a tar+zstd snapshot archive: name → content (b"" for non-files; link targets included)."""
    raw = subprocess.run(["zstd", "-dc", str(archive)], check=True, capture_output=True).stdout
    members: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
        for member in tar:
            data = b""
            if member.isfile():
                data = tar.extractfile(member).read()
            members[member.name] = data + member.linkname.encode() + json.dumps(member.pax_headers).encode()
    return members
