"""Helpers shared by the fault tests: files with known checksums, sandbox process lookup, tmpfs mounts."""

import hashlib
import os
from pathlib import Path

import httpx
from e2e import ServerProcess, sandbox_pids, tmpfs_at, ws_url  # noqa: F401 - tmpfs_at: for the fault tests


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sample_files(seed: int, big: int = 0) -> dict[str, bytes]:
    """A few files (text, binary, nested, optionally one big incompressible) whose sha256 the test knows."""
    files = {
        "/workspace/notes.txt": f"seed {seed}\n".encode() * 100,
        "/workspace/deep/a/b/data.bin": bytes(range(256)) * 64 + seed.to_bytes(4, "big"),
        "/home/sandbox/.profile_extra": b"export FLAREBOX_TEST=1\n",
    }
    if big:
        files["/workspace/big.bin"] = os.urandom(big)
    return files


def put_files(client: httpx.Client, ns: str, ws: str, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        resp = client.put(ws_url(ns, ws, "files"), params={"path": path}, content=data)
        assert resp.status_code in (200, 201), resp.text


def assert_files(client: httpx.Client, ns: str, ws: str, files: dict[str, bytes]) -> None:
    """Every file reads back with the same sha256 (no data lost, nothing truncated)."""
    for path, data in files.items():
        resp = client.get(ws_url(ns, ws, "files"), params={"path": path})
        assert resp.status_code == 200, (path, resp.status_code, resp.text[:300])
        assert sha(resp.content) == sha(data), f"{path}: {len(resp.content)} bytes, expected {len(data)}"


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def supervisor_pids(server: ServerProcess, workspace: str) -> list[int]:
    """The supervisor processes inside `workspace`'s sandbox: descendants of its bwrap process."""
    kids = _children()
    found: set[int] = set()
    todo = list(sandbox_pids(server, workspace))  # both bwrap processes (outside and the namespace's init)
    while todo:
        pid = todo.pop()
        for child in kids.get(pid, []):
            if _is_supervisor(child):
                found.add(child)
            else:
                todo.append(child)  # (a supervisor's own helpers are its business, not its peers)
    return sorted(found)


def _is_supervisor(pid: int) -> bool:
    line = cmdline(pid)
    # `python -m flarebox_supervisor`, or the standalone sandbox's site-less start of it (bwrap.supervisor_command)
    started = "-m flarebox_supervisor" in line or "run_module('flarebox_supervisor'" in line
    return started and not line.split(" ")[0].endswith("bwrap")
