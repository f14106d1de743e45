"""GET /export and PUT /import: the portable "flarebox-export" archive of /workspace and the sandbox user's home
(container/supervisor/archive.py), through real supervisor processes and real files."""

import hashlib
import io
import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

from .harness import IS_ROOT, SANDBOX_USER, needs_root, wait_until

pytestmark = pytest.mark.timeout(120)


def _owned_dir(prefix: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(path, 0o755)
    if IS_ROOT:
        entry = pwd.getpwnam(SANDBOX_USER)
        os.chown(path, entry.pw_uid, entry.pw_gid)
    return path


@pytest.fixture
def pair(supervisor_factory):
    """Two supervisors, each with a workspace and a home of its own."""
    homes, sups = [], []
    for _ in range(2):
        home = _owned_dir("flarebox-home-")
        homes.append(home)
        sup = supervisor_factory({"FLAREBOX_ARCHIVE_HOME": str(home)})
        sup.extra["home"] = home
        sups.append(sup)
    yield sups
    for home in homes:
        _force_rmtree(home)


@pytest.fixture
def outside():
    """A directory outside both roots that hostile archives aim at; it must stay empty."""
    path = _owned_dir("flarebox-outside-")
    yield path
    _force_rmtree(path)


def _force_rmtree(path: Path) -> None:
    for dirpath, dirnames, _ in os.walk(path):
        for name in dirnames:
            full = os.path.join(dirpath, name)
            if not os.path.islink(full):
                os.chmod(full, 0o755)
    shutil.rmtree(path, ignore_errors=True)


def _chown_tree(root: Path, uid: int) -> None:
    gid = pwd.getpwuid(uid).pw_gid if IS_ROOT else os.getgid()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, gid)


def _sha(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def tree(root: Path) -> dict:
    """Every entry below root: type, mode, mtime, and sha256 / symlink target — what a round trip must keep."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            full = os.path.join(dirpath, name)
            info = os.lstat(full)
            rel = os.path.relpath(full, root)
            if stat.S_ISLNK(info.st_mode):
                out[rel] = ("symlink", os.readlink(full))
            elif stat.S_ISDIR(info.st_mode):
                out[rel] = ("dir", stat.S_IMODE(info.st_mode), int(info.st_mtime))
            elif stat.S_ISREG(info.st_mode):
                out[rel] = ("file", stat.S_IMODE(info.st_mode), int(info.st_mtime), info.st_size, _sha(full))
            else:
                out[rel] = ("other", stat.S_IFMT(info.st_mode))
    return out


def both(sup) -> dict:
    return {"workspace": tree(sup.workspace), "home": tree(sup.extra["home"])}


def populate(sup) -> None:
    ws, home = sup.workspace, sup.extra["home"]
    (ws / "src/pkg/deep").mkdir(parents=True)
    (ws / "src/pkg/mod.py").write_text("print('hello')\n")
    (ws / "src/pkg/deep/data.bin").write_bytes(os.urandom(5 * 1024 * 1024 + 13))  # a large file (> 1 MiB)
    (ws / "empty").write_bytes(b"")
    (ws / "run.sh").write_text("#!/bin/sh\necho run\n")
    os.chmod(ws / "run.sh", 0o750)
    (ws / "secret.txt").write_text("only me")
    os.chmod(ws / "secret.txt", 0o600)
    (ws / "ünïcödé名前.txt").write_text("unicode")
    long_dir = ws / ("d" * 120) / ("e" * 120)
    long_dir.mkdir(parents=True)
    (long_dir / ("f" * 200)).write_text("a long path (pax header)")
    (ws / "link-abs").symlink_to("/etc/passwd")
    (ws / "link-rel").symlink_to("src/pkg/mod.py")
    (ws / "dangling").symlink_to("no/such/file")
    (ws / "src/pkg/hard").hardlink_to(ws / "src/pkg/mod.py")  # exported as a regular file
    (ws / "ro/inner").mkdir(parents=True)
    (ws / "ro/inner/f").write_text("in a read-only directory")
    os.chmod(ws / "ro/inner", 0o555)
    os.chmod(ws / "ro", 0o555)
    (ws / "sticky").mkdir()
    os.chmod(ws / "sticky", 0o1777)
    (home / ".bashrc").write_text("export EDITOR=vi\n")
    (home / ".cache/tool").mkdir(parents=True)
    (home / ".cache/tool/state.json").write_text("{}")
    _chown_tree(ws, sup.uid)
    _chown_tree(home, sup.uid)
    os.utime(ws / "src/pkg/mod.py", (1_600_000_000, 1_600_000_000))


def export(sup) -> bytes:
    response = sup.client.get("/export")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/zstd"
    return response.content


def put_import(sup, data: bytes):
    return sup.client.put("/import", content=data, headers={"content-type": "application/zstd"})


def unzstd(data: bytes) -> bytes:
    return subprocess.run(["zstd", "-q", "-d", "-c"], input=data, capture_output=True, check=True).stdout


def zstd(data: bytes) -> bytes:
    return subprocess.run(["zstd", "-q", "-c"], input=data, capture_output=True, check=True).stdout


def members(data: bytes) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    with tarfile.open(fileobj=io.BytesIO(unzstd(data)), mode="r:") as tar:
        return [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()]


def pack(items: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:", format=tarfile.PAX_FORMAT) as tar:
        for info, data in items:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return zstd(buffer.getvalue())


def manifest_of(items) -> dict:
    entries, total = [], 0
    for info, data in items:
        entry = {"path": info.name, "size": info.size, "mode": info.mode & 0o1777}
        if info.isdir():
            entry["type"] = "dir"
        elif info.issym():
            entry.update(type="symlink", target=info.linkname)
        elif info.isfile():
            entry.update(type="file", sha256=hashlib.sha256(data).hexdigest())
            total += info.size
        else:
            entry["type"] = "other"
        entries.append(entry)
    return {"format": "flarebox-export", "version": 1, "created_at": "x", "files": entries, "total_bytes": total}


def file_member(name: str, data: bytes, mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 1_700_000_000
    return info, data


def dir_member(name: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, 0o755
    return info, None


def special_member(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, 0o777 if kind == tarfile.SYMTYPE else 0o644
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        info.devmajor, info.devminor = 1, 3
    return info, None


def with_manifest(items, manifest: dict | None = None) -> bytes:
    manifest = manifest_of(items) if manifest is None else manifest
    return pack([*items, file_member("manifest.json", json.dumps(manifest).encode())])


def assert_refused(sup, data: bytes, before: dict, words: str = "") -> dict:
    response = put_import(sup, data)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_archive"
    assert words.lower() in error["message"].lower(), error["message"]
    assert both(sup) == before  # nothing changed, and no staging directory is left behind
    return error


# --- round trips --------------------------------------------------------------------------------------------------


def test_round_trip_gives_an_identical_tree(pair):
    source, target = pair
    populate(source)
    os.mkfifo(source.workspace / "fifo")  # not exportable: left out and reported
    expected = both(source)
    data = export(source)
    assert both(source) == expected  # exporting changes nothing
    response = put_import(target, data)
    assert response.status_code == 200, response.text
    del expected["workspace"]["fifo"]
    assert both(target) == expected
    files = [v for part in expected.values() for v in part.values() if v[0] == "file"]
    assert response.json() == {"files": len(files), "bytes": sum(v[3] for v in files)}
    if IS_ROOT:  # everything extracts as the sandbox user
        for root in (target.workspace, target.extra["home"]):
            for dirpath, dirnames, filenames in os.walk(root):
                for name in dirnames + filenames:
                    assert os.lstat(os.path.join(dirpath, name)).st_uid == target.uid


def test_manifest_lists_every_member_with_its_sha256_and_comes_last(pair):
    source, _ = pair
    populate(source)
    os.mkfifo(source.workspace / "fifo")
    items = members(export(source))
    assert items[-1][0].name == "manifest.json"
    manifest = json.loads(items[-1][1])
    assert (manifest["format"], manifest["version"]) == ("flarebox-export", 1)
    listed = {e["path"]: e for e in manifest["files"]}
    assert [m.name for m, _ in items[:-1]] == [e["path"] for e in manifest["files"]]
    for info, data in items[:-1]:
        assert info.name.startswith(("workspace/", "home/"))
        entry = listed[info.name]
        if info.isfile():
            assert entry["type"] == "file" and entry["sha256"] == hashlib.sha256(data).hexdigest()
            assert entry["size"] == len(data)
        elif info.issym():
            assert entry["type"] == "symlink" and entry["target"] == info.linkname
        else:
            assert info.isdir() and entry["type"] == "dir"
    assert listed["workspace/link-abs"]["target"] == "/etc/passwd"
    assert listed["workspace/src/pkg/hard"]["type"] == "file"
    assert listed["workspace/run.sh"]["mode"] == 0o750
    assert manifest["total_bytes"] == sum(e["size"] for e in manifest["files"] if e["type"] == "file")
    assert manifest["skipped"] == [
        {"path": "workspace/fifo", "reason": "not a regular file, directory or symlink (a socket, FIFO or device)"}
    ]


def test_import_over_existing_files_replaces_them_exactly(pair):
    source, target = pair
    populate(source)
    ws, home = target.workspace, target.extra["home"]
    (ws / "old/nested").mkdir(parents=True)
    (ws / "old/nested/file").write_text("old")
    (ws / "src").mkdir()
    (ws / "src/stale.py").write_text("stale")
    (ws / "run.sh").write_text("an older run.sh")
    (home / ".old-dotfile").write_text("old")
    (ws / "locked/inner").mkdir(parents=True)
    (ws / "locked/inner/f").write_text("x")
    _chown_tree(ws, target.uid)
    _chown_tree(home, target.uid)
    os.chmod(ws / "locked/inner", 0o555)
    os.chmod(ws / "locked", 0o555)  # read-only directories are replaced too
    response = put_import(target, export(source))
    assert response.status_code == 200, response.text
    assert both(target) == both(source)
    assert not any(name.startswith(".flarebox-") for name in os.listdir(ws))


def test_an_export_imported_twice_and_exported_again_is_the_same_tree(pair):
    source, target = pair
    populate(source)
    data = export(source)
    assert put_import(target, data).status_code == 200
    assert put_import(target, data).status_code == 200
    again = members(export(target))
    first = members(data)
    assert [(m.name, m.type, m.mode, m.linkname, d) for m, d in first[:-1]] == [
        (m.name, m.type, m.mode, m.linkname, d) for m, d in again[:-1]
    ]


# --- damaged archives ---------------------------------------------------------------------------------------------


def _damaged_cases(data: bytes) -> dict[str, tuple[bytes, str]]:
    items = members(data)
    body, manifest = items[:-1], json.loads(items[-1][1])
    index = next(i for i, (m, _) in enumerate(body) if m.name == "workspace/src/pkg/mod.py")
    flipped = list(body)
    info, content = flipped[index]
    flipped[index] = (info, bytes([content[0] ^ 1]) + content[1:])
    dropped = [item for i, item in enumerate(body) if i != index]
    extra = [*body, file_member("workspace/extra.txt", b"not in the manifest")]
    wrong_size = json.loads(json.dumps(manifest))
    next(e for e in wrong_size["files"] if e["path"] == "workspace/empty")["size"] = 1
    wrong_total = dict(manifest, total_bytes=manifest["total_bytes"] + 1)
    wrong_version = dict(manifest, version=2)
    wrong_target = json.loads(json.dumps(manifest))
    next(e for e in wrong_target["files"] if e["path"] == "workspace/link-abs")["target"] = "/etc/shadow"
    after = [*body, file_member("manifest.json", json.dumps(manifest).encode()), file_member("workspace/late", b"x")]
    return {
        "a flipped byte": (with_manifest(flipped, manifest), "sha256"),
        "a dropped member": (with_manifest(dropped, manifest), "not in the archive"),
        "an extra member": (with_manifest(extra, manifest), "not listed"),
        "a wrong size": (with_manifest(body, wrong_size), "size"),
        "a wrong total": (with_manifest(body, wrong_total), "total_bytes"),
        "a wrong version": (with_manifest(body, wrong_version), "version"),
        "a wrong symlink target": (with_manifest(body, wrong_target), "target"),
        "no manifest": (pack(body), "no manifest.json"),
        "a manifest that is not JSON": (pack([*body, file_member("manifest.json", b"{nope")]), "not JSON"),
        "a member after the manifest": (pack(after), "must be the last"),
        "a truncated stream": (data[: len(data) // 2], ""),
        "a truncated end": (data[:-7], ""),
        "garbage": (os.urandom(100_000), "zstd"),
        "an uncompressed tar": (unzstd(data), "zstd"),
        "an empty body": (b"", ""),
    }


def test_damaged_archives_are_refused_and_change_nothing(pair):
    source, target = pair
    populate(source)
    data = export(source)
    (target.workspace / "keep.txt").write_text("live file")
    (target.extra["home"] / ".profile").write_text("live home file")
    _chown_tree(target.workspace, target.uid)
    before = both(target)
    for name, (archive, words) in _damaged_cases(data).items():
        try:
            assert_refused(target, archive, before, words)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None
    assert put_import(target, data).status_code == 200  # the supervisor still imports a good one


HOSTILE = {
    "a parent-directory member": ([file_member("workspace/../escaped", b"x")], "normalized"),
    "an absolute member": ([file_member("/etc/flarebox-planted", b"x")], "absolute"),
    "a member outside workspace/ and home/": ([file_member("elsewhere/x", b"x")], "below workspace/ or home/"),
    "a bare root member": ([dir_member("workspace")], "below workspace/ or home/"),
    "a dot component": ([file_member("workspace/./x", b"x")], "normalized"),
    "a device node": ([special_member("workspace/null", tarfile.CHRTYPE)], "device"),
    "a block device": ([special_member("workspace/disk", tarfile.BLKTYPE)], "device"),
    "a fifo": ([special_member("workspace/pipe", tarfile.FIFOTYPE)], "fifo"),
    "a hardlink": (
        [file_member("workspace/a", b"x"), special_member("workspace/b", tarfile.LNKTYPE, "workspace/a")],
        "hard link",
    ),
    "a hardlink to outside": ([special_member("workspace/b", tarfile.LNKTYPE, "/etc/passwd")], "hard link"),
    "a 5000-byte path": ([file_member("workspace/" + "p" * 4990, b"x")], "longer than 4096"),
    "a 300-byte component": ([file_member("workspace/" + "c" * 300, b"x")], "255"),
    "duplicate paths": ([file_member("workspace/dup", b"1"), file_member("workspace/dup", b"2")], "twice"),
    "a file below a file": ([file_member("workspace/f", b"1"), file_member("workspace/f/g", b"2")], "parent"),
    "a file without its directory": ([file_member("workspace/nodir/f", b"1")], "parent"),
    "a reserved name": ([dir_member("workspace/.flarebox-import-abc")], "reserved"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_members_are_refused(pair, outside, case):
    _, target = pair
    (target.workspace / "keep.txt").write_text("live")
    before = both(target)
    parent = set(os.listdir(target.workspace.parent))
    items, words = HOSTILE[case]
    assert_refused(target, with_manifest(items), before, words)
    assert set(os.listdir(target.workspace.parent)) == parent
    assert not os.path.exists("/etc/flarebox-planted")


def test_a_symlink_member_never_redirects_a_later_member(pair, outside):
    _, target = pair
    before = both(target)
    for link_target in ("/etc", str(outside)):
        items = [
            special_member("workspace/l", tarfile.SYMTYPE, link_target),
            file_member("workspace/l/passwd", b"root::0:0::/:/bin/sh\n"),
        ]
        assert_refused(target, with_manifest(items), before, "parent")
        # a symlinked directory reached through a later directory member, too
        items = [
            special_member("workspace/l", tarfile.SYMTYPE, link_target),
            dir_member("workspace/l"),
        ]
        assert_refused(target, with_manifest(items), before, "twice")
    assert os.listdir(outside) == []
    assert "root::0:0" not in Path("/etc/passwd").read_text()


def test_a_symlink_in_the_live_tree_does_not_redirect_the_import(pair, outside):
    # the live workspace holds a symlink where the archive has a directory: staging never looks at live entries
    source, target = pair
    (source.workspace / "conf").mkdir()
    (source.workspace / "conf/app.ini").write_text("[app]\n")
    _chown_tree(source.workspace, source.uid)
    (target.workspace / "conf").symlink_to(outside)
    assert put_import(target, export(source)).status_code == 200
    assert os.listdir(outside) == []
    assert (target.workspace / "conf/app.ini").read_text() == "[app]\n"
    assert not (target.workspace / "conf").is_symlink()


# --- limits and requests ------------------------------------------------------------------------------------------


def test_entry_and_byte_caps(supervisor_factory):
    home = _owned_dir("flarebox-home-")
    try:
        source = supervisor_factory({"FLAREBOX_ARCHIVE_HOME": str(home)})
        for i in range(5):
            (source.workspace / f"f{i}").write_bytes(b"x" * 1000)
        _chown_tree(source.workspace, source.uid)
        data = export(source)
        # never the real home of whoever runs the tests: an import replaces the home's contents
        no_home = {"FLAREBOX_ARCHIVE_HOME": str(home / "missing")}
        few = supervisor_factory({**no_home, "FLAREBOX_MAX_IMPORT_ENTRIES": "4"})
        response = put_import(few, data)
        assert response.status_code == 413 and response.json()["error"]["code"] == "payload_too_large"
        assert "more than 4 entries" in response.json()["error"]["message"]
        small = supervisor_factory({**no_home, "FLAREBOX_MAX_IMPORT_BYTES": "4500"})
        response = put_import(small, data)
        assert response.status_code == 413, response.text
        assert "4500 bytes" in response.json()["error"]["message"]
        tiny = supervisor_factory({**no_home, "FLAREBOX_MAX_IMPORT_BYTES": "100"})  # the compressed body is over
        response = put_import(tiny, data)
        assert response.status_code == 413
        for sup in (few, small, tiny):
            assert os.listdir(sup.workspace) == []
        assert put_import(supervisor_factory(no_home), data).status_code == 200  # the archive's home is empty
        (home / ".profile").write_text("x")
        _chown_tree(home, source.uid)
        response = put_import(supervisor_factory(no_home), export(source))
        assert response.status_code == 400 and "has no home directory" in response.json()["error"]["message"]
    finally:
        _force_rmtree(home)


def test_queries_are_refused(shared_supervisor):
    response = shared_supervisor.client.get("/export", params={"x": "1"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_query"
    response = shared_supervisor.client.put("/import", params={"x": "1"}, content=b"")
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_query"


def test_a_streamed_body_without_length_is_imported(pair):
    source, target = pair
    populate(source)
    data = export(source)

    def chunks():
        for start in range(0, len(data), 65536):
            yield data[start : start + 65536]

    response = target.client.put("/import", content=chunks())
    assert response.status_code == 200, response.text
    assert both(target) == both(source)


def test_leftovers_of_a_killed_import_are_removed_and_never_exported(pair):
    source, target = pair
    populate(source)
    stale = source.workspace / ".flarebox-import-deadbeef"
    stale.mkdir()
    (stale / "half").write_text("half-written")
    names = [m.name for m, _ in members(export(source))]
    assert not any(".flarebox-" in name for name in names)
    (target.workspace / ".flarebox-trash-0123").mkdir()
    assert put_import(target, export(source)).status_code == 200
    assert not any(name.startswith(".flarebox-") for name in os.listdir(target.workspace))


@needs_root
def test_unreadable_files_are_left_out_and_reported(pair):
    source, target = pair
    (source.workspace / "mine.txt").write_text("mine")
    _chown_tree(source.workspace, source.uid)
    (source.workspace / "roots.txt").write_text("root's")  # root-owned, 0600: the sandbox user cannot read it
    os.chmod(source.workspace / "roots.txt", 0o600)
    items = members(export(source))
    manifest = json.loads(items[-1][1])
    assert [e["path"] for e in manifest["files"]] == ["workspace/mine.txt"]
    assert manifest["skipped"][0]["path"] == "workspace/roots.txt"
    assert "permission denied" in manifest["skipped"][0]["reason"].lower()
    assert put_import(target, bytes(export(source))).status_code == 200
    assert sorted(os.listdir(target.workspace)) == ["mine.txt"]


@pytest.fixture
def small_disk():
    """A 1 MiB tmpfs owned by the sandbox user (skipped where this process may not mount)."""
    path = _owned_dir("flarebox-smalldisk-")
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs", str(path)], capture_output=True
    )
    if result.returncode != 0:
        shutil.rmtree(path, ignore_errors=True)
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.decode().strip()}")
    try:
        if IS_ROOT:
            entry = pwd.getpwnam(SANDBOX_USER)
            os.chown(path, entry.pw_uid, entry.pw_gid)
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)
        shutil.rmtree(path, ignore_errors=True)


@needs_root
def test_a_full_disk_answers_storage_full_and_changes_nothing(pair, supervisor_factory, small_disk):
    source, _ = pair
    (source.extra["home"] / "big.bin").write_bytes(os.urandom(3 * 1024 * 1024))
    (source.workspace / "w.txt").write_text("workspace file")
    _chown_tree(source.extra["home"], source.uid)
    _chown_tree(source.workspace, source.uid)
    target = supervisor_factory({"FLAREBOX_ARCHIVE_HOME": str(small_disk)})
    target.extra["home"] = small_disk
    (target.workspace / "keep.txt").write_text("live")
    (small_disk / ".profile").write_text("live home")
    _chown_tree(target.workspace, target.uid)
    _chown_tree(small_disk, target.uid)
    before = both(target)
    response = put_import(target, export(source))
    assert response.status_code == 507, response.text
    assert response.json()["error"]["code"] == "storage_full"
    assert both(target) == before


def test_an_archive_refused_early_still_gets_its_answer(pair):
    # the worker stops at the first hostile member while most of the body is still unsent
    _, target = pair
    before = both(target)
    items = [file_member("../escape", b"x"), file_member("workspace/big", os.urandom(40 * 1024 * 1024))]
    data = with_manifest(items)
    assert len(data) > 30 * 1024 * 1024
    error = assert_refused(target, data, before, "normalized")
    assert "../escape" in error["message"]
    assert target.client.get("/health").status_code == 200


def _archive_workers(sup) -> list[int]:
    """The supervisor's archive workers still running (its children running flarebox_supervisor.archive)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
                stat_line = Path(f"/proc/{name}/stat").read_bytes()
            except OSError:
                continue
            fields = stat_line[stat_line.rfind(b")") + 2 :].split(b" ")
            if int(fields[1]) == sup.process.pid and fields[0] != b"Z" and b"flarebox_supervisor.archive" in cmdline:
                found.append(int(name))
    return found


def _settled_as(sup, expected: dict) -> bool:
    """Whether sup's trees are `expected` now. The worker removes its staging directories while this walks them, so
    an entry that vanishes between the listing and its lstat means: not settled yet, look again."""
    try:
        return both(sup) == expected
    except FileNotFoundError:
        return False


def test_a_client_that_goes_away_mid_import_changes_nothing(pair):
    source, target = pair
    populate(source)
    data = export(source)
    (target.workspace / "keep.txt").write_text("live")
    _chown_tree(target.workspace, target.uid)
    before = both(target)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(target.socket))
        head = f"PUT /import HTTP/1.1\r\nHost: sv\r\nContent-Length: {len(data)}\r\n\r\n".encode()
        sock.sendall(head + data[: len(data) // 2])
        time.sleep(0.5)
    assert wait_until(lambda: _settled_as(target, before), timeout=10)
    assert wait_until(lambda: not _archive_workers(target), timeout=10)  # the worker (and its zstd) are gone
    assert put_import(target, data).status_code == 200


def test_a_client_that_goes_away_mid_export_stops_the_worker(pair):
    source, _ = pair
    for i in range(4):
        (source.workspace / f"blob{i}").write_bytes(os.urandom(8 * 1024 * 1024))
    _chown_tree(source.workspace, source.uid)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(source.socket))
        sock.sendall(b"GET /export HTTP/1.1\r\nHost: sv\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        assert _archive_workers(source)
    assert wait_until(lambda: not _archive_workers(source), timeout=10)
    assert source.client.get("/health").status_code == 200
