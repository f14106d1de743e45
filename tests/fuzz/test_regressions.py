"""Defects the fuzzer found, pinned as plain tests (the fuzz run is randomised; these always run)."""

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from e2e import put_workspace, run_ok, ws_url

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("config", "code"),
    [
        ({"image": None}, "invalid_field"),  # was a 500: null reached the image pattern
        ({"persistent": None}, "invalid_field"),
        ({"cwd": None}, "invalid_cwd"),
    ],
)
def test_null_where_the_config_takes_no_null_is_400(fuzz_server, config, code):
    with fuzz_server.client() as client:
        response = client.put(ws_url("regress", "nulls"), json=config)
        assert response.status_code == 400 and response.json()["error"]["code"] == code, response.text
        assert client.get(ws_url("regress", "nulls")).status_code == 404  # nothing was created
        # null where the spec allows it means the default
        assert client.put(ws_url("regress", "nulls"), json={"instance": None}).status_code == 201
        assert client.delete(ws_url("regress", "nulls"), params={"confirm": "true"}).status_code == 200


def test_a_since_in_non_ascii_digits_is_invalid_query(fuzz_server):
    with fuzz_server.client() as client:
        response = client.get("/v1/audit", params={"since": "２０２６-01-01T00:00:00Z"})
        assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_query", response.text


def test_a_snapshot_of_a_workspace_that_never_ran_boots_nothing(fuzz_server):
    """Was: a container started just to save the image's empty tree."""
    with fuzz_server.client() as client:
        assert put_workspace(client, "regress", "unrun").status_code == 201
        response = client.post(ws_url("regress", "unrun", "snapshot"))
        assert response.status_code == 409 and response.json()["error"]["code"] == "nothing_to_snapshot"
        status = client.get(ws_url("regress", "unrun")).json()
        assert (status["state"], status["booted"], status["running"]) == ("created", False, False)
        assert client.get(ws_url("regress", "unrun", "snapshots")).json() == {"snapshots": []}
        assert client.delete(ws_url("regress", "unrun"), params={"confirm": "true"}).status_code == 200


@pytest.mark.parametrize("other", ["stop", "delete"])
def test_a_snapshot_racing_a_stop_or_a_delete_is_never_a_5xx(fuzz_server, other):
    """Was: 503 container_exited, "the container stopped while the request ran". Whatever the order, the snapshot
    answers a snapshot (its own, or the one the stop took) or, after a delete, 404 workspace_not_found."""
    ws = f"race-{other}"
    with fuzz_server.client() as client, ThreadPoolExecutor(4) as pool:
        for _ in range(3):
            assert put_workspace(client, "regress", ws).status_code in (200, 201)
            run_ok(client, "regress", ws, "echo x > /workspace/f")
            calls = [
                pool.submit(client.post, ws_url("regress", ws, "snapshot")),
                pool.submit(client.post, ws_url("regress", ws, "stop"))
                if other == "stop"
                else pool.submit(client.delete, ws_url("regress", ws), params={"confirm": "true"}),
                pool.submit(client.post, ws_url("regress", ws, "snapshot")),
            ]
            snapshot, done, late = (call.result() for call in calls)
            assert done.status_code == 200, done.text
            for answer in (snapshot, late):
                if answer.status_code != 200:
                    assert (answer.status_code, answer.json()["error"]["code"]) == (404, "workspace_not_found")
                    assert other == "delete", answer.text
        assert client.delete(ws_url("regress", ws), params={"confirm": "true"}).status_code in (200, 404)


# Found by the fuzzer (and by hand) on the file tree and directory archive routes.
def test_an_archive_of_a_path_of_the_longest_length_is_a_400(fuzz_server):
    """Was: 500 internal_error "the archive failed: …" — the worker's JSON error quotes the 4096-byte path."""
    with fuzz_server.client() as client:
        assert put_workspace(client, "regress", "archives").status_code in (200, 201)
        response = client.get(ws_url("regress", "archives", "files", "archive"), params={"path": "/" + "0" * 4095})
        assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_path", response.text


def test_an_archive_upload_into_a_read_only_directory_is_a_403(fuzz_server):
    """Was: 500 internal_error "the import failed: [Errno 30] Read-only file system: '/.flarebox-import-…'"."""
    with fuzz_server.client() as client:
        assert put_workspace(client, "regress", "archives").status_code in (200, 201)
        response = client.put(ws_url("regress", "archives", "files", "archive"), params={"path": "/"}, content=b"")
        assert response.status_code == 403 and response.json()["error"]["code"] == "permission_denied", response.text


# a tmpfs inside the sandbox (the standalone /workspace is ext4, which keeps mtimes between 1901 and 2446 only)
SANDBOX_TMPFS = "/dev/shm/t"  # noqa: S108 - a path inside the sandbox, not on this machine


def test_a_listing_with_a_far_future_mtime_answers_timestamps(fuzz_server):
    """A file's mtime is the sandbox user's to set (tmpfs keeps 64-bit seconds): was 500 internal_error for the
    stat and the whole listing of its directory, and a `mtime` of five or more year digits below that."""
    with fuzz_server.client() as client:
        assert put_workspace(client, "regress", "mtimes").status_code in (200, 201)
        setup = f"mkdir -p {SANDBOX_TMPFS} && cd {SANDBOX_TMPFS} && touch -d @400000000000 far"
        run_ok(client, "regress", "mtimes", setup + " && touch -d @144115188075855872 farther")
        timestamp = r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z"
        listing = client.get(ws_url("regress", "mtimes", "files"), params={"path": SANDBOX_TMPFS, "list": "1"})
        assert listing.status_code == 200, listing.text
        assert all(re.fullmatch(timestamp, entry["mtime"]) for entry in listing.json()["entries"]), listing.text
        for name in ("far", "farther"):
            path = f"{SANDBOX_TMPFS}/{name}"
            stat = client.get(ws_url("regress", "mtimes", "files", "stat"), params={"path": path})
            assert stat.status_code == 200 and re.fullmatch(timestamp, stat.json()["mtime"]), stat.text
