"""The standalone backup store (BACKUP_DIR) on real files: round trip with sha256, the commit point, a full disk,
a gone or failing directory, bytes that come back different, a backup damaged after it was listed, crash leftovers."""

import asyncio
import errno
import hashlib
import json
import os
from pathlib import Path

import httpx
import pytest
from e2e import tmpfs_at

from durable.ports import ContainerGone
from protocol.errors import ProtocolError
from standalone import backups as backups_module
from standalone.backups import DirectoryBackupStore
from standalone.config import backup_dir

NS, WS = "team", "ws1"
T0 = 1_764_406_800_123


def bid(n: int = 0) -> str:
    return f"b-{T0 + n:013d}-{n:06x}"


def payload(size: int, seed: int = 1) -> bytes:
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(f"{seed}-{counter}".encode()).digest()
        counter += 1
    return bytes(out[:size])


async def chunks(data: bytes, sizes=(1, 4096, 65_536, 1_000_003)):
    """`data` as an export stream: chunks of irregular sizes, as a socket gives them."""
    i = k = 0
    while i < len(data):
        step = sizes[k % len(sizes)]
        yield data[i : i + step]
        i += step
        k += 1
        await asyncio.sleep(0)


async def read_all(stream) -> bytes:
    out = bytearray()
    async for chunk in stream:
        out += chunk
    return bytes(out)


def files_of(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "backups"
    path.mkdir()
    return path


async def test_write_list_open_delete_round_trip(root):
    store = DirectoryBackupStore(root)
    assert store.available
    data = payload(3 * 1024 * 1024 + 17)
    info = await store.write(NS, WS, bid(1), chunks(data), T0 + 1)
    assert (info.id, info.size, info.created_at_ms) == (bid(1), len(data), T0 + 1)
    assert info.sha256 == hashlib.sha256(data).hexdigest()
    assert files_of(root) == [f"{NS}/{WS}/{bid(1)}.json", f"{NS}/{WS}/{bid(1)}.tar.zst"]
    assert (root / NS / WS / f"{bid(1)}.tar.zst").read_bytes() == data
    manifest = json.loads((root / NS / WS / f"{bid(1)}.json").read_text())
    assert manifest["sha256"] == info.sha256 and manifest["kind"] == "flarebox-backup" and manifest["version"] == 1

    second = await store.write(NS, WS, bid(2), chunks(b"small"), T0 + 2)
    assert [b.id for b in await store.list(NS, WS)] == [bid(2), bid(1)]  # newest first
    assert await store.list(NS, "other") == []
    assert await store.list("nobody", WS) == []

    opened, stream = await store.open(NS, WS, bid(1))
    assert opened == info
    assert await read_all(stream) == data
    opened2, stream2 = await store.open(NS, WS, bid(2))
    assert opened2 == second and await read_all(stream2) == b"small"

    # a fresh store over the same directory sees the same backups (the manifests are the truth)
    assert await DirectoryBackupStore(root).list(NS, WS) == [second, info]

    await store.delete(NS, WS, bid(1))
    await store.delete(NS, WS, bid(1))  # missing is fine
    assert [b.id for b in await store.list(NS, WS)] == [bid(2)]
    with pytest.raises(ProtocolError) as err:
        await store.open(NS, WS, bid(1))
    assert err.value.code == "backup_not_found"
    assert files_of(root) == [f"{NS}/{WS}/{bid(2)}.json", f"{NS}/{WS}/{bid(2)}.tar.zst"]


async def test_an_empty_export_is_a_backup_too(root):
    store = DirectoryBackupStore(root)
    info = await store.write(NS, WS, bid(), chunks(b""), T0)
    assert info.size == 0 and info.sha256 == hashlib.sha256(b"").hexdigest()
    _, stream = await store.open(NS, WS, bid())
    assert await read_all(stream) == b""


async def test_without_backup_dir_the_store_is_unavailable():
    store = DirectoryBackupStore(None)
    assert not store.available
    assert await store.list(NS, WS) == []
    for call in (store.write(NS, WS, bid(), chunks(b"x"), T0), store.open(NS, WS, bid())):
        with pytest.raises(ProtocolError) as err:
            await call
        assert err.value.code == "backups_unavailable"


def test_backup_dir_setting(tmp_path):
    assert backup_dir({}) is None
    assert backup_dir({"BACKUP_DIR": ""}) is None
    assert backup_dir({"BACKUP_DIR": "  "}) is None
    assert backup_dir({"BACKUP_DIR": str(tmp_path)}) == tmp_path
    with pytest.raises(ValueError, match="BACKUP_DIR"):
        backup_dir({"BACKUP_DIR": "relative/dir"})


async def test_ids_and_names_are_checked(root):
    store = DirectoryBackupStore(root)
    for bad in ("nope", "b-1-abc", "../" + bid(), bid() + "\n", "s-1764406800123-abcdef"):
        with pytest.raises(ProtocolError) as err:
            await store.open(NS, WS, bad)
        assert err.value.code == "backup_not_found"
        await store.delete(NS, WS, bad)  # nothing to delete
        with pytest.raises(ValueError):
            await store.write(NS, WS, bad, chunks(b"x"), T0)
    with pytest.raises(ProtocolError) as err:
        await store.list("../etc", WS)
    assert err.value.code == "invalid_name"
    assert files_of(root) == []


async def test_an_existing_id_is_never_overwritten(root):
    store = DirectoryBackupStore(root)
    first = await store.write(NS, WS, bid(), chunks(b"first"), T0)
    with pytest.raises(ValueError):
        await store.write(NS, WS, bid(), chunks(b"second"), T0)
    assert await store.list(NS, WS) == [first]
    _, stream = await store.open(NS, WS, bid())
    assert await read_all(stream) == b"first"


# ---- faults ---------------------------------------------------------------------------------------------------


async def test_a_full_disk_fails_the_backup_and_leaves_nothing(tmp_path):
    root = tmp_path / "disk"
    with tmpfs_at(root, "2m") as resize:
        store = DirectoryBackupStore(root)
        kept = await store.write(NS, WS, bid(1), chunks(payload(256 * 1024)), T0)
        with pytest.raises(ProtocolError) as err:
            await store.write(NS, WS, bid(2), chunks(payload(4 * 1024 * 1024, seed=2)), T0 + 1)
        assert err.value.code == "backup_failed"
        assert "full" in err.value.message and str(root) in err.value.message
        assert await store.list(NS, WS) == [kept]
        assert files_of(root) == [f"{NS}/{WS}/{bid(1)}.json", f"{NS}/{WS}/{bid(1)}.tar.zst"]  # no partial file
        resize("16m")  # space returns
        again = await store.write(NS, WS, bid(3), chunks(payload(4 * 1024 * 1024, seed=2)), T0 + 2)
        assert [b.id for b in await store.list(NS, WS)] == [again.id, kept.id]


async def test_a_gone_directory_fails_the_backup_and_is_not_recreated(tmp_path):
    root = tmp_path / "unmounted"
    store = DirectoryBackupStore(root)  # missing at start: the server still starts
    assert store.available
    with pytest.raises(ProtocolError) as err:
        await store.write(NS, WS, bid(), chunks(b"data"), T0)
    assert err.value.code == "backup_failed" and "gone" in err.value.message
    assert not root.exists()  # never written into the empty mount point of an absent disk
    assert await store.list(NS, WS) == []

    root.mkdir()
    await store.write(NS, WS, bid(1), chunks(b"data"), T0)
    for entry in sorted(root.rglob("*"), reverse=True):  # the disk goes away between two backups
        entry.rmdir() if entry.is_dir() else entry.unlink()
    root.rmdir()
    with pytest.raises(ProtocolError) as err:
        await store.write(NS, WS, bid(2), chunks(b"data"), T0)
    assert err.value.code == "backup_failed" and "gone" in err.value.message
    assert not root.exists()


async def test_an_unwritable_directory_fails_the_backup(root):
    store = DirectoryBackupStore(root)
    (root / NS).mkdir()
    (root / NS / WS).write_text("a file where the workspace's directory belongs")
    with pytest.raises(ProtocolError) as err:
        await store.write(NS, WS, bid(), chunks(b"data"), T0)
    assert err.value.code == "backup_failed"
    assert (root / NS / WS).read_text().startswith("a file")


async def test_an_io_error_fails_the_backup_and_removes_the_temp_file(root, monkeypatch):
    store = DirectoryBackupStore(root)
    real = backups_module._write_all
    calls = []

    def failing(fd, data):
        calls.append(len(data))
        if len(calls) > 1:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(fd, data)

    monkeypatch.setattr(backups_module, "_write_all", failing)
    with pytest.raises(ProtocolError) as err:
        await store.write(NS, WS, bid(), chunks(payload(3 * 1024 * 1024)), T0)
    assert err.value.code == "backup_failed" and "I/O error" in err.value.message
    assert len(calls) == 2
    assert files_of(root) == []


async def test_bytes_that_read_back_different_are_never_listed(root, monkeypatch):
    store = DirectoryBackupStore(root)
    real = backups_module._write_all

    def flipping(fd, data):  # a disk that stores other bytes than it was given
        real(fd, bytes([data[0] ^ 0xFF]) + data[1:])

    monkeypatch.setattr(backups_module, "_write_all", flipping)
    with pytest.raises(ProtocolError) as err:
        await store.write(NS, WS, bid(), chunks(payload(100_000)), T0)
    assert err.value.code == "backup_failed" and "other bytes" in err.value.message
    assert files_of(root) == [] and await store.list(NS, WS) == []


async def test_an_export_that_breaks_midway_leaves_nothing(root):
    store = DirectoryBackupStore(root)

    async def broken():
        yield payload(2 * 1024 * 1024)
        raise ContainerGone("the sandbox stopped while answering")

    with pytest.raises(ContainerGone):
        await store.write(NS, WS, bid(), broken(), T0)
    assert files_of(root) == [] and await store.list(NS, WS) == []


async def test_a_cancelled_backup_leaves_nothing(root):
    store = DirectoryBackupStore(root)
    started = asyncio.Event()

    async def slow():
        yield payload(2 * 1024 * 1024)
        started.set()
        await asyncio.sleep(3600)
        yield b"never"

    task = asyncio.ensure_future(store.write(NS, WS, bid(), slow(), T0))
    await started.wait()
    await asyncio.sleep(0.05)
    assert [p.name for p in (root / NS / WS).iterdir()] == [f".tmp-{bid()}.tar.zst"]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert files_of(root) == []


async def test_a_backup_damaged_on_disk_fails_while_it_streams(root):
    store = DirectoryBackupStore(root)
    data = payload(3 * 1024 * 1024)
    await store.write(NS, WS, bid(), chunks(data), T0)
    archive = root / NS / WS / f"{bid()}.tar.zst"
    with archive.open("r+b") as f:  # one byte flipped, same size: only the sha256 can tell
        f.seek(len(data) - 10)
        f.write(bytes([data[-10] ^ 1]))
    info, stream = await store.open(NS, WS, bid())
    assert info.size == len(data)
    received = bytearray()
    with pytest.raises(ProtocolError) as err:
        async for chunk in stream:
            received += chunk
    assert err.value.code == "backup_failed" and "sha256" in err.value.message
    assert len(received) == len(data)  # every byte went out, but the stream errors instead of ending

    # a shorter (or longer) archive is refused before a byte goes out
    with archive.open("r+b") as f:
        f.truncate(len(data) // 2)
    with pytest.raises(ProtocolError) as err:
        await store.open(NS, WS, bid())
    assert err.value.code == "backup_failed" and "bytes" in err.value.message

    archive.unlink()
    with pytest.raises(ProtocolError) as err:
        await store.open(NS, WS, bid())
    assert err.value.code == "backup_failed" and "lost its archive" in err.value.message


async def test_the_stream_is_a_request_body_httpx_sends_and_breaks_on_damage(root):
    """What SandboxContainer.fetch does with `body`: httpx's content= streams the async iterator; a damaged backup
    makes the request fail instead of completing."""
    store = DirectoryBackupStore(root)
    data = payload(2 * 1024 * 1024 + 5)
    await store.write(NS, WS, bid(), chunks(data), T0)
    received = {}

    async def handler(request: httpx.Request) -> httpx.Response:
        received["body"] = await request.aread()
        return httpx.Response(200, json={"files": 1})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://sv") as client:
        info, stream = await store.open(NS, WS, bid())
        answer = await client.put("/import", content=stream, headers={"content-length": str(info.size)})
        assert answer.status_code == 200 and received["body"] == data

        archive = root / NS / WS / f"{bid()}.tar.zst"
        archive.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
        received.clear()
        info, stream = await store.open(NS, WS, bid())
        with pytest.raises(ProtocolError) as err:
            await client.put("/import", content=stream, headers={"content-length": str(info.size)})
        assert err.value.code == "backup_failed"
        assert "body" not in received


async def test_crash_leftovers_are_ignored_then_cleaned(root):
    store = DirectoryBackupStore(root)
    good = await store.write(NS, WS, bid(1), chunks(b"good"), T0)
    ws_dir = root / NS / WS
    (ws_dir / f".tmp-{bid(2)}.tar.zst").write_bytes(b"half an archive")  # killed while writing
    (ws_dir / f"{bid(3)}.tar.zst").write_bytes(b"verified, manifest never written")  # killed before the commit
    (ws_dir / f".tmp-{bid(3)}.json").write_text('{"kind": "flarebox-backup"')  # killed while committing
    (ws_dir / f"{bid(4)}.json").write_text('{"kind": "flarebox-ba')  # a torn manifest (edited by hand)
    (ws_dir / f"{bid(4)}.tar.zst").write_bytes(b"x")
    (ws_dir / "notes.txt").write_text("the operator's")
    assert await store.list(NS, WS) == [good]
    with pytest.raises(ProtocolError) as err:
        await store.open(NS, WS, bid(3))
    assert err.value.code == "backup_not_found"

    assert DirectoryBackupStore(root).list is not None  # a restart cleans up at construction
    assert sorted(p.name for p in ws_dir.iterdir()) == sorted(
        [f"{bid(1)}.json", f"{bid(1)}.tar.zst", f"{bid(4)}.json", f"{bid(4)}.tar.zst", "notes.txt"]
    )
    assert await DirectoryBackupStore(root).list(NS, WS) == [good]


def test_the_registry_builds_the_store_from_backup_dir(tmp_path, monkeypatch):
    from durable.settings import Settings
    from standalone.clock import AsyncioClock
    from standalone.registry import WorkspaceRegistry

    def no_container(*_args):
        raise AssertionError("no workspace is built here")

    monkeypatch.setenv("BACKUP_DIR", str(tmp_path / "b"))
    registry = WorkspaceRegistry(tmp_path / "data", Settings.from_vars({}), AsyncioClock(), no_container)
    assert registry.backups.available and registry.backups.root == tmp_path / "b"
    monkeypatch.delenv("BACKUP_DIR")
    registry = WorkspaceRegistry(tmp_path / "data", Settings.from_vars({}), AsyncioClock(), no_container)
    assert not registry.backups.available
    given = DirectoryBackupStore(tmp_path)
    assert (
        WorkspaceRegistry(tmp_path / "d2", Settings.from_vars({}), AsyncioClock(), no_container, backups=given).backups
        is given
    )


async def test_a_source_error_is_not_blamed_on_the_disk(root):
    store = DirectoryBackupStore(root)

    async def reset():
        yield b"some"
        raise ConnectionResetError("the peer reset the connection")

    with pytest.raises(ContainerGone, match="export stream broke"):
        await store.write(NS, WS, bid(), reset(), T0)
    assert files_of(root) == []
