"""Files through a real server and sandbox (issue 17): an empty download leaves the workspace's connection pool
healthy, /proc files come back with their content, and devices and sockets are 400 not_a_file, never 5xx."""

import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest
from e2e import put_workspace, run_ok, ws_url

pytestmark = [pytest.mark.timeout(180), pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")]

FILES = ws_url("special", "files", "files")


@pytest.fixture(scope="module")
def client(server):
    with server.client() as client:
        assert put_workspace(client, "special", "files").status_code in (200, 201)
        run_ok(client, "special", "files", "printf abc > /workspace/small && : > /workspace/empty")
        yield client


def _code(response) -> str:
    return response.json()["error"]["code"]


def test_an_empty_download_then_20_file_requests(client):
    def get(path):
        return client.get(FILES, params={"path": path})

    for _ in range(5):
        empty = get("/workspace/empty")
        assert (empty.status_code, empty.headers["content-length"], empty.content) == (200, "0", b"")
        with ThreadPoolExecutor(4) as pool:  # at once, while the supervisor side may still be closing
            answers = list(pool.map(get, ["/workspace/small", "/workspace/empty"] * 10))
        assert [(a.status_code, a.content) for a in answers] == [(200, b"abc"), (200, b"")] * 10, answers[0].text


def test_a_proc_file_has_its_content(client):
    got = client.get(FILES, params={"path": "/proc/self/status"})
    assert got.status_code == 200
    assert got.content.startswith(b"Name:") and got.headers["content-length"] == str(len(got.content))


def test_devices_and_sockets_are_not_files(client):
    run_ok(
        client,
        "special",
        "files",
        "python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('/workspace/sock')\"",
    )
    for path in ("/dev/null", "/workspace/sock"):
        for method in ("GET", "PUT"):
            response = client.request(method, FILES, params={"path": path}, content=b"x" if method == "PUT" else None)
            assert (response.status_code, _code(response)) == (400, "not_a_file"), (method, path, response.text)
    kept, _ = run_ok(client, "special", "files", "test -S /workspace/sock && test -c /dev/null && echo kept")
    assert kept == "kept\n"
