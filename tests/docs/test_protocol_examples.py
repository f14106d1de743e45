"""The curl examples in docs/protocol.md work as printed, against a real `flarebox serve` with real sandboxes.

Each shell block is taken from the document and run with bash, unchanged; the only help it gets is FLAREBOX_URL,
a HOME in which the server generated its token (so the quick start's `cat ~/.local/share/flarebox/token` works),
and RID where a block reuses the one an earlier block created. Every JSON answer is checked against
docs/openapi.yaml, so the examples, the schemas and the server have to agree.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import pytest
import yaml
from jsonschema import Draft202012Validator

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8")
SPEC = yaml.safe_load((ROOT / "docs" / "openapi.yaml").read_text(encoding="utf-8"))

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(not (shutil.which("bwrap") and shutil.which("curl")), reason="needs bubblewrap and curl"),
]


def schema(name: str) -> Draft202012Validator:
    return Draft202012Validator({"components": SPEC["components"], "$ref": f"#/components/schemas/{name}"})


def sh_blocks(heading: str) -> list[str]:
    """The ```sh blocks of the section whose heading starts with `heading` (up to the next heading)."""
    match = re.search(rf"^#+ {re.escape(heading)}.*?$(.*?)(?=^#+ |\Z)", DOC, re.M | re.S)
    assert match, f"protocol.md has no section {heading!r}"
    blocks = re.findall(r"^```sh\n(.*?)^```$", match.group(1), re.M | re.S)
    assert blocks, f"section {heading!r} has no sh example"
    return blocks


def json_values(text: str) -> list:
    """Consecutive JSON values (curl prints bodies without a newline between them; NDJSON has one per line)."""
    decoder, values, pos = json.JSONDecoder(), [], 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            return values
        value, pos = decoder.raw_decode(text, pos)
        values.append(value)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Walkthrough:
    """A real server plus a bash runner for the document's examples."""

    def __init__(self, base: Path):
        self.home = base / "home"
        self.cwd = base / "cwd"
        self.backups = base / "backups"  # the backup store of §6.29 (BACKUP_DIR: it must exist)
        self.home.mkdir()
        self.cwd.mkdir()
        self.backups.mkdir()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_CF_", "SANDBOX_API_TOKEN"))}
        for name in ("FLAREBOX_DATA_DIR", "XDG_DATA_HOME", "FLAREBOX_URL", "TOKEN", "W", "RID"):
            env.pop(name, None)
        # python3 in the examples: this interpreter's venv, whatever the HOME
        env.update({"HOME": str(self.home), "PYTHONUNBUFFERED": "1", "BACKUP_DIR": str(self.backups)})
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.token = ""

    def start(self) -> None:
        script = Path(sys.executable).with_name("flarebox")
        cmd = [str(script)] if script.exists() else [sys.executable, "-m", "standalone.cli"]
        log = open(self.home / "server.log", "wb")
        self.proc = subprocess.Popen(
            cmd + ["serve", "--port", str(self.port)],
            env=self.env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        token_file = self.home / ".local" / "share" / "flarebox" / "token"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"flarebox serve exited:\n{self.log()}"
            if token_file.exists() and token_file.read_text().strip():
                self.token = token_file.read_text().strip()
                try:
                    if httpx.get(f"{self.url}/v1/health", headers=self.auth(), timeout=2).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
            time.sleep(0.1)
        raise AssertionError(f"flarebox serve did not come up:\n{self.log()}")

    def stop(self) -> None:
        if self.proc is None:
            return
        pid = self.proc.pid
        try:
            if self.proc.poll() is None:
                os.kill(pid, signal.SIGTERM)
                try:
                    self.proc.wait(15)
                except subprocess.TimeoutExpired:
                    os.kill(pid, signal.SIGKILL)
                    self.proc.wait(10)
        finally:
            try:
                os.killpg(pid, signal.SIGKILL)  # sandboxes left in the server's session, if any
            except ProcessLookupError:
                pass

    def log(self) -> str:
        path = self.home / "server.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def run(self, block: str, **variables: str) -> str:
        """Run one example block with bash; the variables the quick start defines are set beforehand."""
        prelude = (
            f"export FLAREBOX_URL={self.url}\n"
            f"export TOKEN=$(cat ~/.local/share/flarebox/token)\n"
            'W="$FLAREBOX_URL/v1/workspaces/personal/demo"\n'
        )
        prelude += "".join(f"{name}={value}\n" for name, value in variables.items())
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", prelude + block],
            env={**self.env, "FLAREBOX_URL": self.url},
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"example failed ({done.returncode}):\n{block}\n{done.stderr}\n{self.log()}"
        assert self.token not in done.stdout + done.stderr
        return done.stdout


@pytest.fixture
def walk():
    base = Path(tempfile.mkdtemp(prefix="fbdoc-"))  # short: sandbox sockets live under the data dir
    base.chmod(0o755)
    walk = Walkthrough(base)
    try:
        walk.start()
        yield walk
    finally:
        walk.stop()
        subprocess.run(["chmod", "-R", "u+rwX", str(base)], check=False, capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def events_of(text: str) -> list[dict]:
    events = [json.loads(line) for line in text.splitlines() if line]
    for event in events:
        schema("ExecEvent").validate(event)
    assert events[-1]["type"] in ("exit", "error") and all(e["type"] not in ("exit", "error") for e in events[:-1])
    return events


def output_of(events: list[dict]) -> str:
    text, offset = "", 0
    for event in events:
        if event["type"] == "output":
            assert event["offset"] == offset
            text += event["data"]
            offset += len(event["data"])
    return text


def exec_events(walk: Walkthrough, command: str, workspace: str = "demo") -> list[dict]:
    body = {"request_id": uuid.uuid4().hex, "command": command}
    w = f"{walk.url}/v1/workspaces/personal/{workspace}"
    response = httpx.post(f"{w}/exec", json=body, headers=walk.auth(), timeout=60)
    events = events_of(response.text)
    assert events[-1] == {**events[-1], "type": "exit", "exit_code": 0}, events[-1]
    return events


def exec_output(walk: Walkthrough, command: str, workspace: str = "demo") -> str:
    return output_of(exec_events(walk, command, workspace))


def started_of(events: list[dict]) -> dict:
    return next(e for e in events if e["type"] == "started")


def test_the_documents_curl_examples_work_as_printed(walk):
    w = f"{walk.url}/v1/workspaces/personal/demo"

    # §2 quick start: health, create, first command in a fresh workspace
    (quick,) = sh_blocks("2. Quick start")
    health, created, *events = json_values(walk.run(quick))
    schema("Health").validate(health)
    schema("Status").validate(created)
    assert created["state"] == "created" and created["booted"] is False
    events_of("\n".join(json.dumps(e) for e in events))
    started = next(e for e in events if e["type"] == "started")
    assert started["container"] == "fresh"
    assert events[-1]["exit_code"] == 0 and output_of(events).endswith("/workspace\n")

    # §3.1 token generation prints a token long enough for the server
    (generate,) = sh_blocks("3.1")
    assert len(walk.run(generate).strip()) >= 32

    # §6.2–6.4 health, PUT with the defaults spelled out (identical config → 200 status), GET
    schema("Health").validate(json.loads(walk.run(sh_blocks("6.2")[0])))
    confirmed = json.loads(walk.run(sh_blocks("6.3")[0]))
    schema("Status").validate(confirmed)
    assert confirmed["config"] == created["config"]
    status = json.loads(walk.run(sh_blocks("6.4")[0]))
    schema("Status").validate(status)
    assert status["state"] == "running" and status["booted"] is True

    # §6.6 three ways to exec
    ticks, heredoc, with_jq = sh_blocks("6.6")
    assert output_of(events_of(walk.run(ticks))) == "tick 1\ntick 2\ntick 3\n"
    rid = uuid.uuid4().hex
    first = events_of(walk.run(heredoc, RID=rid))
    assert first[0] == {"type": "started", "request_id": rid, "container": "continuing", "snapshot": None}
    assert re.fullmatch(r"2\nuser=\S+ greeting=hi\n", output_of(first))
    if shutil.which("jq"):
        assert "total" in walk.run(with_jq, RID=uuid.uuid4().hex)

    # §6.7 reattach replays the same output and terminal event; §6.8 cancel of a finished command
    again = events_of(walk.run(sh_blocks("6.7")[0], RID=rid))
    assert output_of(again) == output_of(first) and again[-1] == first[-1]
    cancelled = json.loads(walk.run(sh_blocks("6.8")[0], RID=rid))
    schema("CancelResult").validate(cancelled)
    assert cancelled == {"request_id": rid, "state": "finished"}

    # §6.15 mint a key (the secret is shown once), mint one for an agent and use it, list the keys
    mint, mint_and_use, list_keys = sh_blocks("6.15")
    minted = json.loads(walk.run(mint))
    schema("MintedKey").validate(minted)
    assert (minted["namespace"], minted["workspace"], minted["scopes"]) == ("personal", "demo", ["exec", "files"])
    status_by_key, *agent_events = json_values(walk.run(mint_and_use))
    schema("Status").validate(status_by_key)
    assert events_of("\n".join(json.dumps(e) for e in agent_events))[-1]["exit_code"] == 0
    keys = json.loads(walk.run(list_keys))
    schema("KeyList").validate(keys)
    assert [k["label"] for k in keys["keys"]] == ["ci runner", "agent"]
    assert all("key" not in k for k in keys["keys"])

    # §6.17 the list of workspaces; §6.18 the audit log holds the agent's command, never a secret
    listed = json.loads(walk.run(sh_blocks("6.17")[0]))
    schema("WorkspaceList").validate(listed)
    assert [(w["namespace"], w["workspace"]) for w in listed["workspaces"]] == [("personal", "demo")]
    audit = json.loads(walk.run(sh_blocks("6.18")[0]))
    schema("AuditPage").validate(audit)
    by_agent = [r for r in audit["records"] if r["key_label"] == "agent"]
    assert [(r["operation"], r["command"], r["status"]) for r in by_agent] == [("exec", "id -un", 200)]
    assert minted["key"] not in json.dumps(audit)

    # §6.16 revoke: the key is refused from then on
    revoked = json.loads(walk.run(sh_blocks("6.16")[0], KEY=minted["key"]))
    schema("Revoked").validate(revoked)
    assert revoked["key"]["id"] == minted["id"]
    refused = httpx.get(w, headers={"Authorization": f"Bearer {minted['key']}"})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"

    # §6.10 uploads (from local files), then §6.9 downloads (of files put there first)
    (walk.cwd / "data.csv").write_text("a,b\n1,2\n")
    (walk.cwd / "build.sh").write_text("#!/bin/sh\necho built\n")
    written = json_values(walk.run(sh_blocks("6.10")[0]))
    for item in written:
        schema("FileWritten").validate(item)
    assert written == [{"path": "/workspace/data/data.csv", "size": 8}, {"path": "/workspace/build.sh", "size": 21}]
    assert exec_output(walk, "stat -c %a /workspace/build.sh; ./build.sh") == "755\nbuilt\n"
    pdf, notes = os.urandom(70_000), "notes with a space ✓\n".encode()
    for path, data in (("/workspace/report.pdf", pdf), ("/workspace/my notes.txt", notes)):
        response = httpx.put(f"{w}/files", params={"path": path}, content=data, headers=walk.auth())
        assert response.status_code == 200, response.text
    walk.run(sh_blocks("6.9")[0])
    assert (walk.cwd / "report.pdf").read_bytes() == pdf
    assert (walk.cwd / "notes.txt").read_bytes() == notes

    # §6.12–6.14 snapshot, list, stop; the next command comes back restored with the files
    snapshot = json.loads(walk.run(sh_blocks("6.12")[0]))
    schema("Snapshot").validate(snapshot)
    listed = json.loads(walk.run(sh_blocks("6.13")[0]))
    schema("SnapshotList").validate(listed)
    assert snapshot in listed["snapshots"]
    stopped = json.loads(walk.run(sh_blocks("6.14")[0]))
    schema("Status").validate(stopped)
    assert stopped["state"] == "stopped" and stopped["running"] is False
    assert exec_output(walk, "cat /workspace/data/data.csv") == "a,b\n1,2\n"

    # §6.19 a service, §6.21 a crash loop's log, §6.22 the port proxy, §6.23 the key-resolved proxy, §6.24 secrets
    (define,) = sh_blocks("6.19")
    written, defined, listed = json_values(walk.run(define))
    schema("FileWritten").validate(written)
    schema("Service").validate(defined)
    schema("ServiceList").validate(listed)
    (broken,) = sh_blocks("6.21")
    put, *log, deleted = json_values(walk.run(broken))
    schema("Service").validate(put)
    for event in log:
        schema("ServiceLogEvent").validate(event)
    assert log[-1]["type"] == "service" and log[-1]["state"] == "failed" and log[-1]["restarts"] == 4
    assert deleted == {"name": "broken", "deleted": True}
    (ports,) = sh_blocks("6.22")
    out = walk.run(ports)
    echoed = json_values(re.sub(r"HTTP/1.1 [^\n]*\n(?:[^\n]*\S[^\n]*\n)*\r?\n", "", out))
    assert [e.get("method") for e in echoed[:-1]] == ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
    assert "authorization" not in echoed[0]["headers"] and echoed[0]["headers"]["cookie"] == "theme=dark"
    assert echoed[0]["headers"]["x-forwarded-for"] != "6.6.6.6"
    assert echoed[-1]["error"]["code"] == "path_not_allowed"
    (by_key,) = sh_blocks("6.23")
    out = walk.run(by_key)
    answers = json_values(re.sub(r"HTTP/1.1 [^\n]*\n(?:[^\n]*\S[^\n]*\n)*\r?\n", "", out))
    assert all(a["headers"]["x-forwarded-prefix"] == "/v1/proxy" for a in answers[:-2])
    assert [a["error"]["code"] for a in answers[-2:]] == ["path_not_allowed", "forbidden"]
    (secrets,) = sh_blocks("6.24")
    stored, listed, *rest = json_values(walk.run(secrets))
    schema("Secret").validate(stored)
    assert listed == {"secrets": [stored]}
    assert "sk-example-0123456789" not in json.dumps([stored, listed, *rest])

    # §6.12 a labelled, pinned checkpoint; a risky change; §6.25 relabel and unpin; §6.26 roll back to it
    (_, checkpoint) = sh_blocks("6.12")
    snap_id = walk.run(checkpoint).strip()
    listed = httpx.get(f"{w}/snapshots", headers=walk.auth()).json()
    schema("SnapshotList").validate(listed)
    checkpointed = next(s for s in listed["snapshots"] if s["id"] == snap_id)
    assert (checkpointed["label"], checkpointed["kept"]) == ("before-migration", True)
    exec_output(walk, "echo v2 > /workspace/schema.txt")
    patched = json.loads(walk.run(sh_blocks("6.25")[0], SNAP=snap_id))
    schema("Snapshot").validate(patched)
    assert (patched["id"], patched["label"], patched["kept"]) == (snap_id, "before-migration (schema v2)", False)
    restored = json.loads(walk.run(sh_blocks("6.26")[0], SNAP=snap_id))
    schema("RestoreResult").validate(restored)
    assert restored["snapshot"]["id"] == snap_id and restored["state"] == "stopped"
    assert restored["safety_snapshot"]["label"] == "before restore"  # the running files, saved first
    events = exec_events(walk, "test ! -e /workspace/schema.txt && cat /workspace/data/data.csv")
    assert output_of(events) == "a,b\n1,2\n"
    started = started_of(events)
    assert (started["container"], started["from"], started["snapshot"]["id"]) == ("restored", "snapshot", snap_id)

    # §6.27 three forks of the running workspace: each starts from its files, then they diverge
    forks = json_values(walk.run(sh_blocks("6.27")[0]))
    assert len(forks) == 3
    for fork in forks:
        schema("Status").validate(fork)
        assert (fork["state"], fork["booted"]) == ("stopped", True) and fork["last_snapshot"] is not None
    for n in (1, 2, 3):
        events = exec_events(walk, f"cat /workspace/data/data.csv; echo {n} > /workspace/try.txt", f"demo-try-{n}")
        assert output_of(events) == "a,b\n1,2\n" and started_of(events)["container"] == "restored"
    assert exec_output(walk, "cat /workspace/try.txt", "demo-try-2") == "2\n"
    assert exec_output(walk, "test ! -e /workspace/try.txt && echo untouched") == "untouched\n"

    # §6.28 export, then import into a new workspace: the same files
    imported = json_values(walk.run(sh_blocks("6.28")[0]))
    schema("Status").validate(imported[0])
    schema("ImportResult").validate(imported[1])
    assert imported[1]["files"] > 0 and imported[1]["snapshot"] is not None
    assert (walk.cwd / "demo.tar.zst").read_bytes()[:4] == b"\x28\xb5\x2f\xfd"  # a zstd frame
    digest = "sha256sum /workspace/data/data.csv /workspace/report.pdf"
    assert exec_output(walk, digest, "demo-copy") == exec_output(walk, digest)

    # §6.29 a backup, the list, and a rollback to it
    write_backup, roll_back = sh_blocks("6.29")
    made, backups = json_values(walk.run(write_backup))
    schema("Backup").validate(made)
    schema("BackupList").validate(backups)
    assert backups["backups"][0] == made
    exec_output(walk, "echo later > /workspace/later.txt")
    back = json.loads(walk.run(roll_back))
    schema("RestoreResult").validate(back)
    assert back["backup"] == made and back["safety_snapshot"] is None
    events = exec_events(walk, "test ! -e /workspace/later.txt && cat /workspace/data/data.csv")
    assert output_of(events) == "a,b\n1,2\n"
    started = started_of(events)
    assert (started["from"], started["backup"], started["snapshot"]) == ("backup", made, None)

    # §6.30 a plain GET of the terminal is refused: it is a WebSocket (the CLI's block is interactive, not run)
    refused = json.loads(walk.run(sh_blocks("6.30")[0]))
    schema("Error").validate(refused)
    assert refused["error"]["code"] == "websocket_required"

    # §6.31 the file tree: mkdir -p, a listing two levels deep, stat, move, a recursive delete
    made, listing, described, moved, deleted = json_values(walk.run(sh_blocks("6.31")[0]))
    schema("MkdirResult").validate(made)
    assert made == {"path": "/workspace/notes/drafts", "created": True}
    schema("FileList").validate(listing)
    assert listing["path"] == "/workspace" and listing["cursor"] is None
    listed = {e["path"]: e for e in listing["entries"]}
    assert listed["/workspace/notes/drafts"]["type"] == "directory"
    assert listed["/workspace/data/data.csv"] == {**listed["/workspace/data/data.csv"], "type": "file", "size": 8}
    schema("FileEntry").validate(described)
    assert (described["path"], described["name"], described["mode"]) == ("/workspace/build.sh", "build.sh", "0755")
    schema("Moved").validate(moved)
    assert moved == {"from": "/workspace/notes/drafts", "to": "/workspace/notes/final"}
    schema("FileDeleted").validate(deleted)
    assert deleted == {"path": "/workspace/notes", "deleted": True}
    assert exec_output(walk, "test ! -e /workspace/notes && echo gone") == "gone\n"

    # §6.32 a directory down as a tar.zst, and up again into a new directory
    (written,) = json_values(walk.run(sh_blocks("6.32")[0]))
    schema("ArchiveWritten").validate(written)
    assert written == {"path": "/workspace/data-copy", "files": 1, "directories": 0, "symlinks": 0, "bytes": 8}
    assert (walk.cwd / "src.tar.zst").read_bytes()[:4] == b"\x28\xb5\x2f\xfd"  # a zstd frame
    assert exec_output(walk, "cat /workspace/data-copy/data.csv") == "a,b\n1,2\n"

    # §6.34 what runs: a background `sleep 300` is listed, then signalled
    exec_output(walk, "setsid sleep 300 > /dev/null 2>&1 &")
    running, signalled = json_values(walk.run(sh_blocks("6.34")[0]))
    schema("ProcessList").validate(running)
    (sleeper,) = [p for p in running["processes"] if p["command"] == "sleep 300"]
    assert sleeper["request_id"] is None  # setsid: a session of its own, no exec's
    assert running["commands"][0]["command"] == "setsid sleep 300 > /dev/null 2>&1 &"
    schema("Signalled").validate(signalled)
    assert signalled == {"pid": sleeper["pid"], "signal": "TERM", "group": False}
    deadline = time.monotonic() + 10
    while any(p["pid"] == sleeper["pid"] for p in httpx.get(f"{w}/processes", headers=walk.auth()).json()["processes"]):
        assert time.monotonic() < deadline, "the signalled sleep is still listed"
        time.sleep(0.1)

    # §6.5 delete, after which the workspace is unknown
    assert json.loads(walk.run(sh_blocks("6.5")[0])) == {"deleted": True}
    gone = httpx.get(w, headers=walk.auth())
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "workspace_not_found"
