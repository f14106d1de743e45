"""Incremental snapshots through a real bubblewrap sandbox: the live base follows saves, restores and restarts, it
lives outside anything the sandbox reaches, and forks (snapshot_ref / adopt_snapshot) restore in another workspace."""

import asyncio
import json
import secrets
import time

import pytest
import sandbox_fixtures as fx
from sandbox_fixtures import tree_digest

from durable.ports import StartSpec
from protocol.errors import ProtocolError
from standalone import snapshots

short_tmp, make_sandbox = fx.short_tmp, fx.make_sandbox
pytestmark = pytest.mark.timeout(120)


def spec(snapshot_id: str | None = None) -> StartSpec:
    return StartSpec(image="hermes", instance="lite", env={}, enable_internet=False, snapshot_id=snapshot_id)


async def run(container, command: str) -> str:
    body = json.dumps({"request_id": secrets.token_hex(16), "command": command, "timeout": 30}).encode()
    response = await container.fetch("POST", "/exec", body=body, headers={"content-type": "application/json"})
    events = [json.loads(line) for line in (await response.read()).splitlines() if line.strip()]
    assert events[-1].get("exit_code") == 0, events
    return "".join(e["data"] for e in events if e["type"] == "output")


def _overlapped() -> bool:
    from standalone import sandbox as sandbox_module

    return not sandbox_module._binds_below_live_dirs()


# a restore overlaps its sandbox's start unless this Python is bound below a live dir (a checkout under /tmp)
overlapped = pytest.mark.skipif(not _overlapped(), reason="this Python lies below a sandbox live dir: no overlap")


def manifest(sandbox, snapshot_id: str, workspace: str | None = None) -> dict:
    path = sandbox.store.root / sandbox.namespace / (workspace or sandbox.workspace) / f"{snapshot_id}.json"
    return json.loads(path.read_text())


def settle() -> None:
    time.sleep(0.05)  # a tick of the kernel's coarse timestamp clock (see test_snapshot_incremental.py)


FILL = "cd /workspace && mkdir -p pkg && for i in $(seq 1 150); do head -c 3000 /dev/urandom > pkg/f$i; done"


async def test_saves_restores_and_restarts_keep_an_incremental_base(make_sandbox):
    sandbox = make_sandbox()
    await sandbox.start(spec())
    assert sandbox.store.live_base("ns", "ws", sandbox.base_dir) is None  # a fresh tree: the first save is full
    await run(sandbox, FILL)
    settle()
    full = await sandbox.snapshot()
    assert manifest(sandbox, full.id)["level"] == 0
    # the server's own files, beside the live dir: not inside it (nor bound into the sandbox)
    assert sandbox.base_dir.parent == sandbox.root_dir.parent
    assert sorted(p.name for p in sandbox.base_dir.iterdir()) == [f"{full.id}.snar"]
    assert await run(sandbox, "find / -name '*.snar*' 2>/dev/null; true") == ""

    await run(sandbox, "echo one > /workspace/pkg/f1; rm /workspace/pkg/f2")
    inc = await sandbox.snapshot()
    assert (manifest(sandbox, inc.id)["parent"], manifest(sandbox, inc.id)["level"]) == (full.id, 1)
    assert inc.size < full.size / 10

    await sandbox.stop()  # a restart on a surviving disk keeps the base
    await sandbox.start(spec())
    await run(sandbox, "echo two > /workspace/pkg/f3")
    after_restart = await sandbox.snapshot()
    assert manifest(sandbox, after_restart.id)["parent"] == inc.id
    state = tree_digest(sandbox.root_dir)

    # roll back to the full save: the restored tree becomes the base, the next save an increment of it
    await run(sandbox, "echo lost > /workspace/unsaved")
    await sandbox.stop()
    await sandbox.start(spec(full.id))
    assert sandbox.store.live_base("ns", "ws", sandbox.base_dir) == full.id
    assert await run(sandbox, "ls /workspace/pkg | wc -l; test -e /workspace/unsaved || echo gone") == "150\ngone\n"
    await run(sandbox, "echo branch > /workspace/branch.txt")
    branch = await sandbox.snapshot()
    assert manifest(sandbox, branch.id)["parent"] == full.id
    assert branch.size < full.size / 10

    await sandbox.destroy()
    assert not sandbox.base_dir.exists()  # the files went, and with them the base
    await sandbox.start(spec(after_restart.id))
    assert tree_digest(sandbox.root_dir) == state


async def test_a_fork_adopts_the_whole_chain_and_outlives_its_source(make_sandbox):
    source = make_sandbox("src")
    await source.start(spec())
    await run(source, FILL)
    full = await source.snapshot()
    await run(source, "echo changed > /workspace/pkg/f9; mkdir -p ~/cfg && echo x > ~/cfg/y")
    inc = await source.snapshot()
    state = tree_digest(source.root_dir)

    ref = await source.snapshot_ref(inc.id)
    assert ref == {"namespace": "ns", "workspace": "src", "id": inc.id}
    with pytest.raises(ProtocolError) as err:
        await source.snapshot_ref(snapshots.new_snapshot_id())
    assert err.value.code == "snapshot_not_found"

    forks = [make_sandbox(f"fork{i}") for i in range(2)]
    for fork in forks:
        adopted = await fork.adopt_snapshot(ref)
        assert adopted.id == inc.id and [s.id for s in fork.store.list("ns", fork.workspace)] == [inc.id]
    await source.destroy()
    for snapshot_id in (full.id, inc.id):
        await source.delete_snapshot(snapshot_id)
    assert source.store.list("ns", "src") == []

    for i, fork in enumerate(forks):  # they diverge without touching each other
        await fork.start(spec(inc.id))
        assert tree_digest(fork.root_dir) == state
        await run(fork, f"echo fork{i} > /workspace/mine.txt")
        saved = await fork.snapshot()
        assert manifest(fork, saved.id)["parent"] == inc.id  # an increment of the adopted chain
    assert [await run(fork, "cat /workspace/mine.txt") for fork in forks] == ["fork0\n", "fork1\n"]

    for bad in ({"namespace": "ns", "workspace": "src", "id": inc.id}, {"id": "../x"}, None, {"namespace": 1}):
        with pytest.raises(ProtocolError) as err:
            await forks[0].adopt_snapshot(bad)
        assert err.value.code == "snapshot_not_found"


async def test_a_failed_stat_walk_after_a_restore_only_makes_the_next_save_full(make_sandbox, monkeypatch):
    sandbox = make_sandbox()
    await sandbox.start(spec())
    await run(sandbox, FILL)
    first = await sandbox.snapshot()
    await sandbox.stop()

    def broken(*args):
        raise snapshots._PipelineError("tar failed (2): simulated")

    monkeypatch.setattr(sandbox.store, "track", broken)
    await sandbox.start(spec(first.id))
    assert sandbox.running()
    assert sandbox.store.live_base("ns", "ws", sandbox.base_dir) is None
    second = await sandbox.snapshot()
    assert manifest(sandbox, second.id)["parent"] is None


@overlapped
async def test_a_restore_is_extracted_while_its_sandbox_starts(make_sandbox, monkeypatch):
    sandbox = make_sandbox()
    await sandbox.start(spec())
    await run(sandbox, FILL)
    saved = await sandbox.snapshot()
    state = tree_digest(sandbox.root_dir)
    await sandbox.destroy()

    extract, seen = sandbox.store.extract, []

    def extract_once_the_sandbox_runs(*args):
        deadline = time.monotonic() + 20
        while not sandbox.running() and time.monotonic() < deadline:
            time.sleep(0.005)
        seen.append(sandbox.running())  # false when the sandbox only starts after the extraction
        return extract(*args)

    monkeypatch.setattr(sandbox.store, "extract", extract_once_the_sandbox_runs)
    await sandbox.start(spec(saved.id))
    assert seen == [True]
    assert tree_digest(sandbox.root_dir) == state  # and the sandbox's /workspace is that tree, not the staging copy
    assert await run(sandbox, "ls /workspace/pkg | wc -l; echo new > /workspace/pkg/new") == "150\n"
    assert (sandbox.root_dir / "workspace" / "pkg" / "new").read_text() == "new\n"
    assert sandbox.store.live_base("ns", "ws", sandbox.base_dir) == saved.id
    assert not [p for p in sandbox.root_dir.parent.iterdir() if p.name.startswith(".tmp-restore-")]


async def test_a_snapshot_whose_workspace_is_no_directory_starts_on_fresh_live_dirs(make_sandbox):
    sandbox = make_sandbox()
    await sandbox.start(spec())
    await sandbox.stop()
    workspace = sandbox.root_dir / "workspace"
    workspace.rmdir()
    workspace.write_text("a file where the directory was\n")  # tar replaces the staged directory with it
    saved = await sandbox.snapshot()
    await sandbox.destroy()

    await sandbox.start(spec(saved.id))
    # without a restart on the real live dirs, the sandbox would write into the deleted staged directory
    assert await run(sandbox, "echo kept > /workspace/out.txt; cat /workspace/out.txt") == "kept\n"
    assert (sandbox.root_dir / "workspace" / "out.txt").read_text() == "kept\n"


@overlapped
async def test_a_restore_whose_sandbox_cannot_start_leaves_the_live_dir_and_no_staging(make_sandbox, monkeypatch):
    sandbox = make_sandbox()
    await sandbox.start(spec())
    await run(sandbox, "echo saved > /workspace/file.txt")
    saved = await sandbox.snapshot()
    await run(sandbox, "echo unsaved > /workspace/file.txt")
    await sandbox.stop()
    before = tree_digest(sandbox.root_dir)

    def broken(*args):
        raise OSError("simulated: bwrap cannot start")

    monkeypatch.setattr(sandbox, "_spawn", broken)
    with pytest.raises(ProtocolError) as err:
        await sandbox.start(spec(saved.id))
    assert err.value.code == "container_unavailable"
    assert not sandbox.running()
    deadline = time.monotonic() + 20  # the abandoned extraction removes its staging dir when it ends
    while [p for p in sandbox.root_dir.parent.iterdir() if p.name.startswith(".tmp-restore-")]:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    assert tree_digest(sandbox.root_dir) == before


@pytest.mark.parametrize(
    ("sources", "below"),
    [(["/opt/py", "/srv/venv"], False), (["/opt/py", "/tmp/ci/.venv"], True), (["/home/sandbox/src"], True)],  # noqa: S108
)
def test_a_python_bound_below_a_live_dir_restores_before_the_sandbox_starts(monkeypatch, sources, below):
    """bwrap makes such a bind's mount point inside the live dir as it starts (a checkout under /tmp in CI), which
    it cannot do in a staged one that tar is extracting into: that restore is not overlapped with the start."""
    from standalone import sandbox as sandbox_module

    monkeypatch.setattr(sandbox_module, "_python_sources", lambda: sources)
    assert sandbox_module._binds_below_live_dirs() is below
