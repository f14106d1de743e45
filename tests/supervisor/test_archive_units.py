"""Units of container/supervisor/archive.py that an HTTP test cannot time: a file shrinking while it is exported,
header edge cases, the worker's limits and roots."""

import hashlib
import io
import os
import tarfile

import pytest

from flarebox_supervisor import archive
from protocol import limits


def test_a_large_file_that_shrinks_mid_export_is_padded_and_hashed_as_written(tmp_path):
    path = tmp_path / "shrinking"
    data = os.urandom(3 * 1024 * 1024)
    path.write_bytes(data)
    out = tmp_path / "out"
    with open(out, "wb") as sink, open(path, "rb") as source:
        exporter = archive._Exporter(sink.fileno())
        size = os.fstat(source.fileno()).st_size
        os.truncate(path, 1000)  # after the header promised `size`
        digest = hashlib.sha256()
        exporter.stream(source.fileno(), size, digest)
    written = out.read_bytes()
    assert written == data[:1000] + bytes(size - 1000)
    assert digest.hexdigest() == hashlib.sha256(written).hexdigest()


def test_a_small_file_records_what_was_read(tmp_path):
    (tmp_path / "f").write_bytes(b"abc")
    out = tmp_path / "out"
    with open(out, "wb") as sink:
        exporter = archive._Exporter(sink.fileno())
        fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            exporter.file(fd, "f", "workspace/f")
        finally:
            os.close(fd)
        exporter.flush()
    assert exporter.entries[0]["size"] == 3
    assert exporter.entries[0]["sha256"] == hashlib.sha256(b"abc").hexdigest()
    with tarfile.open(out, "r:") as tar:
        assert tar.extractfile("workspace/f").read() == b"abc"


@pytest.mark.parametrize(
    "name,target,size,mtime",
    [
        ("workspace/a.py", "", 10, 1_700_000_000),
        ("workspace/" + "x" * 300, "", 5, 0),
        ("workspace/名前", "", 1, 1),
        ("workspace/l", "t" * 200, 0, 2),
        ("workspace/old", "", 0, -5),
        ("workspace/big", "", 8**11 + 1, 3),
    ],
)
def test_headers_read_back_with_tarfile(name, target, size, mtime):
    kind = tarfile.SYMTYPE if target else tarfile.REGTYPE
    raw = archive._header(name, kind, size, 0o640, mtime, target)
    assert len(raw) % 512 == 0
    # only the header is read back (the first member's data is not needed to parse it): no 8 GiB of zeros
    stream = io.BytesIO(raw + bytes(1024))
    tar = tarfile.open(fileobj=stream, mode="r|")
    info = tar.next()
    assert (info.name, info.linkname, info.size, int(info.mtime)) == (name, target, size, mtime)


@pytest.mark.parametrize("data", [b"x", b"5 a=b\n", b"10 ab\n", b"99 a=b\n", b"-1 a=b\n"])
def test_malformed_pax_records_are_refused(data):
    with pytest.raises(archive.ArchiveError):
        archive._pax_records(data)


def test_pax_records_parse():
    assert archive._pax_records(b"12 path=abc\n13 size=1234\n") == {"path": "abc", "size": "1234"}


def test_import_limits_can_only_be_lowered():
    assert archive.import_limits({}) == (limits.MAX_IMPORT_BYTES, limits.MAX_IMPORT_ENTRIES)
    assert archive.import_limits({"FLAREBOX_MAX_IMPORT_BYTES": "10", "FLAREBOX_MAX_IMPORT_ENTRIES": "2"}) == (10, 2)
    big = str(limits.MAX_IMPORT_BYTES * 2)
    assert archive.import_limits({"FLAREBOX_MAX_IMPORT_BYTES": big})[0] == limits.MAX_IMPORT_BYTES
    with pytest.raises(SystemExit):
        archive.import_limits({"FLAREBOX_MAX_IMPORT_ENTRIES": "0"})


def test_home_is_left_out_when_it_is_not_a_directory_of_its_own(tmp_path):
    ws, home = tmp_path / "ws", tmp_path / "home"
    ws.mkdir()
    home.mkdir()
    assert archive.archive_roots(str(ws), str(home)) == [("workspace", str(ws)), ("home", str(home))]
    for bad in ("/", "", str(ws), str(tmp_path), str(tmp_path / "missing")):
        assert archive.archive_roots(str(ws), bad) == [("workspace", str(ws))]


def test_the_worker_path_limit_is_the_protocol_one():
    assert archive._MAX_PATH_BYTES == limits.MAX_PATH_BYTES
