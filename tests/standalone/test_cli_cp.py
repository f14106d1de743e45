"""`flarebox cp` both ways as a user runs it: real processes, real files, checked by sha256, against a real server."""

import hashlib
import os
import shutil
import stat

import pytest
from cli_helpers import client_env, run
from e2e import QUIET, serving

pytestmark = [pytest.mark.timeout(180), pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")]
WRITE_LIMIT = 4 * 1024 * 1024


@pytest.fixture(scope="module")
def server():
    with serving({**QUIET, "MAX_FILE_WRITE_BYTES": str(WRITE_LIMIT)}) as proc:
        yield proc


def sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_upload_and_download_a_large_binary_file_unchanged(server, tmp_path):
    env = client_env(server)
    assert run(env, "exec", "cpbig", "--", "true").returncode == 0
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(3 * 1024 * 1024 + 17))
    up = run(env, "cp", str(big), "cpbig:/workspace/data/big.bin")
    assert up.returncode == 0, up.stderr
    assert "%" not in up.stderr  # no progress line when stderr is not a terminal
    remote = run(env, "exec", "cpbig", "--", "sha256sum /workspace/data/big.bin")
    assert remote.stdout.split()[0] == sha(big)
    back = tmp_path / "back.bin"
    down = run(env, "cp", "cpbig:/workspace/data/big.bin", str(back))
    assert down.returncode == 0, down.stderr
    assert sha(back) == sha(big) and not list(tmp_path.glob(".*.part"))
    # into an existing directory, and to stdout
    into = tmp_path / "into"
    into.mkdir()
    assert run(env, "cp", "cpbig:/workspace/data/big.bin", str(into)).returncode == 0
    assert sha(into / "big.bin") == sha(big)
    piped = run(env, "cp", "cpbig:/workspace/data/big.bin", "-", text=False)
    assert piped.returncode == 0 and hashlib.sha256(piped.stdout).hexdigest() == sha(big)


def test_an_uploaded_executable_stays_executable(server, tmp_path):
    env = client_env(server)
    script = tmp_path / "hello.sh"
    script.write_text("#!/bin/sh\necho hello from a script\n")
    script.chmod(0o755)
    assert run(env, "cp", str(script), "cpmode:/workspace/bin/hello.sh").returncode == 0
    done = run(env, "exec", "cpmode", "--", "/workspace/bin/hello.sh; stat -c %a /workspace/bin/hello.sh")
    assert done.returncode == 0 and done.stdout == "hello from a script\n755\n", done.stderr
    plain = tmp_path / "notes.txt"
    plain.write_text("notes\n")
    plain.chmod(0o644)
    # a trailing slash, or an existing directory, copies into it as cp does
    assert run(env, "cp", str(plain), "cpmode:/workspace/bin/").returncode == 0
    assert run(env, "cp", str(plain), "cpmode:/workspace").returncode == 0
    listed = run(env, "exec", "cpmode", "--", "stat -c '%a %n' /workspace/bin/notes.txt /workspace/notes.txt")
    assert listed.stdout == "644 /workspace/bin/notes.txt\n644 /workspace/notes.txt\n"
    back = tmp_path / "back.sh"
    assert run(env, "cp", "cpmode:/workspace/bin/hello.sh", str(back)).returncode == 0
    assert back.read_text() == script.read_text() and stat.S_IMODE(back.stat().st_mode) & 0o700 == 0o600


def test_file_errors_name_the_path_and_exit_1(server, tmp_path):
    env = client_env(server)
    assert run(env, "exec", "cperr", "--", "mkdir -p /workspace/dir").returncode == 0
    missing = run(env, "cp", "cperr:/workspace/nope.txt", str(tmp_path / "x"))
    assert missing.returncode == 1 and "cperr:/workspace/nope.txt: file_not_found" in missing.stderr
    assert not (tmp_path / "x").exists() and not list(tmp_path.glob(".*"))
    directory = run(env, "cp", "cperr:/workspace/dir", str(tmp_path / "x"))
    assert directory.returncode == 1 and "cperr:/workspace/dir: not_a_file" in directory.stderr
    too_big = tmp_path / "big"
    too_big.write_bytes(b"\0" * (WRITE_LIMIT + 1))
    refused = run(env, "cp", str(too_big), "cperr:/workspace/big")
    assert refused.returncode == 1 and "cperr:/workspace/big: file_too_large" in refused.stderr
    local = run(env, "cp", str(tmp_path / "absent"), "cperr:/workspace/a")
    assert local.returncode == 1 and str(tmp_path / "absent") in local.stderr
    folder = run(env, "cp", str(tmp_path), "cperr:/workspace/a")
    assert folder.returncode == 1 and "is a directory" in folder.stderr
    # the old local file survives a failed download
    keep = tmp_path / "keep"
    keep.write_text("old")
    assert run(env, "cp", "cperr:/workspace/nope.txt", str(keep)).returncode == 1
    assert keep.read_text() == "old"


def test_usage_errors_exit_125(server, tmp_path):
    env = client_env(server)
    for args in (["cp", "a", "b"], ["cp", "w1:/x", "w2:/y"], ["cp", str(tmp_path), "cperr:relative/path"]):
        done = run(env, *args)
        assert done.returncode == 125, (args, done.stderr)
    relative = run(env, "cp", str(tmp_path), "cperr:relative/path")
    assert "absolute" in relative.stderr and "cperr:/workspace/relative/path" in relative.stderr


def test_namespace_applies(server, tmp_path):
    env = client_env(server)
    source = tmp_path / "f.txt"
    source.write_text("in a namespace\n")
    assert run(env, "cp", "-n", "cpns", str(source), "cpnsws:/workspace/f.txt").returncode == 0
    assert run(env, "-n", "cpns", "exec", "cpnsws", "--", "cat /workspace/f.txt").stdout == "in a namespace\n"
    assert run(env, "exec", "cpnsws", "--", "cat /workspace/f.txt").returncode == 1  # default ns: another workspace
