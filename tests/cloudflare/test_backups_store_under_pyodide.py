"""cloudflare.backups.R2BackupStore under Pyodide over the harness's fake R2 bucket (env.BACKUPS as the Workers SDK
hands it to an object): multipart upload with R2's part rules, verification before the marker, pagination, a full,
gone or lying bucket, an export that breaks midway, a backup damaged in the bucket, leftovers — and the fake's own
rules (put of a stream of unknown length, part sizes at complete, unknown upload ids, list limits)."""

import hashlib
import json

import httpx
import pytest

pytestmark = pytest.mark.timeout(300)

MiB = 1024 * 1024
PART = 8 * MiB
NS, WS = "team", "r2"
T0 = 1_764_406_800_000


def bid(n: int) -> str:
    return f"b-{T0 + n:013d}-{n:06x}"


def payload(size: int, seed: int = 1) -> bytes:
    block = hashlib.sha256(str(seed).encode()).digest() * 2048  # 64 KiB, then a counter so parts differ
    out = bytearray()
    i = 0
    while len(out) < size:
        out += i.to_bytes(8, "big") + block
        i += 1
    return bytes(out[:size])


def store(harness, op: str, body: bytes | None = None, **args) -> dict:
    params = {"op": op, "ns": NS, "ws": WS, **{k: str(v) for k, v in args.items()}}
    if body is None:
        return harness.admin.get("/__harness/backups", params=params).json()

    def chunks():  # a chunked body: its length unknown to the harness, like an export stream
        for i in range(0, len(body), 300_000):
            yield body[i : i + 300_000]

    return harness.admin.post("/__harness/backups", params=params, content=chunks()).json()


def read_backup(harness, backup_id: str) -> tuple[dict, bytes]:
    with harness.admin.stream(
        "GET", "/__harness/backups", params={"op": "open", "ns": NS, "ws": WS, "id": backup_id}
    ) as r:
        if r.headers.get("content-type", "").startswith("application/json"):
            return json.loads(r.read()), b""
        return json.loads(r.headers["x-backup-info"]), r.read()


def r2_calls(harness, since: int = 0) -> list[dict]:
    return [c for c in harness.calls()[since:] if c["api"].startswith("r2.")]


def bucket(harness) -> dict:
    return harness.admin.get("/__harness/r2").json()


@pytest.fixture(autouse=True)
def clean_knobs(harness):
    yield
    harness.knobs(r2Fault=None, r2FailAfterParts=None, r2CorruptReads=False, r2ListPage=1000, backupsBinding=True)


def test_the_fakes_rules(harness):
    results = harness.admin.get("/__harness/r2probe").json()
    assert "must have a known length" in results["putUnknownLengthStream"]
    assert results["putKnownLengthStream"] == "ok"
    assert "must be a string" in results["putCustomMetadataNotString"]
    assert "unknown option" in results["putUnknownOption"]
    assert "must have a known length" in results["uploadPartUnknownLengthStream"]
    assert "(10029)" in results["uploadPartBadNumber"]
    assert results["completeOnePartAnySize"] == "ok"
    assert "(10011)" in results["completeSmallFirstPart"]  # EntityTooSmall: a part but the last under 5 MiB
    assert "(10048)" in results["completeUnequalParts"]  # BadUpload: parts but the last of different sizes
    assert "(10048)" in results["completeLastPartLarger"]
    assert results["completeEqualParts"] == "ok"
    assert "(10025)" in results["completeWrongEtag"]  # InvalidPart
    assert "at least one part" in results["completeNoParts"]
    assert "(10024)" in results["completeTwice"]  # NoSuchUpload once completed
    assert "(10024)" in results["uploadPartAfterAbort"]
    assert "(10024)" in results["resumeUnknownUploadId"]
    assert "(10024)" in results["resumeOtherKey"]
    assert results["resumeAndComplete"] == "ok"
    assert "(10001)" in results["abortUnknownUpload"]
    assert "(10022)" in results["listLimitZero"] and "(10022)" in results["listLimitTooLarge"]
    assert results["listPages"] == "ok"
    assert results["getMissing"] == "ok" and results["getKnownLength"] == "ok"


def test_write_list_open_delete_round_trip(harness):
    assert store(harness, "available") == {"available": True}
    data = payload(2 * PART + 123_457)
    since = len(harness.calls())
    answer = store(harness, "write", data, id=bid(1), at=T0 + 1)
    info = answer["info"]
    assert info == {
        "id": bid(1),
        "size": len(data),
        "created_at_ms": T0 + 1,
        "sha256": hashlib.sha256(data).hexdigest(),
    }

    calls = r2_calls(harness, since)
    apis = [c["api"] for c in calls]
    assert apis == [
        "r2.createMultipartUpload",
        "r2.uploadPart",
        "r2.uploadPart",
        "r2.uploadPart",
        "r2.complete",
        "r2.get",  # read back and hashed...
        "r2.put",  # ...before the marker is written
    ]
    key = f"backups/{NS}/{WS}/{bid(1)}"
    assert calls[0]["key"] == key + ".tar.zst" and calls[-1]["key"] == key + ".json"
    parts = [c for c in calls if c["api"] == "r2.uploadPart"]
    assert [(p["partNumber"], p["length"]) for p in parts] == [(1, PART), (2, PART), (3, 123_457)]

    listed = store(harness, "list")["backups"]
    assert listed == [info]
    opened, body = read_backup(harness, bid(1))
    assert opened == {"info": info} and body == data

    store(harness, "write", b"second", id=bid(2), at=T0 + 2)
    assert [b["id"] for b in store(harness, "list")["backups"]] == [bid(2), bid(1)]  # newest first
    assert store(harness, "delete", id=bid(1)) == {"deleted": True}
    assert [b["id"] for b in store(harness, "list")["backups"]] == [bid(2)]
    assert read_backup(harness, bid(1))[0]["error"]["code"] == "backup_not_found"
    keys = {o["key"] for o in bucket(harness)["objects"]}
    assert not {k for k in keys if bid(1) in k}
    store(harness, "delete", id=bid(2))
    assert store(harness, "delete", id=bid(2)) == {"deleted": True}  # missing is fine


def test_part_boundaries(harness):
    for n, size, expected in [(10, 0, [0]), (11, 1, [1]), (12, PART, [PART]), (13, 2 * PART, [PART, PART])]:
        since = len(harness.calls())
        data = payload(size, seed=n)
        info = store(harness, "write", data, id=bid(n), at=T0 + n)["info"]
        assert info["size"] == size and info["sha256"] == hashlib.sha256(data).hexdigest()
        parts = [c["length"] for c in r2_calls(harness, since) if c["api"] == "r2.uploadPart"]
        assert parts == expected, (size, parts)
        assert read_backup(harness, bid(n))[1] == data
        store(harness, "delete", id=bid(n))


def test_list_follows_the_cursor(harness):
    ids = [bid(100 + i) for i in range(7)]
    for i, b in enumerate(ids):
        store(harness, "write", f"backup {i}".encode(), id=b, at=T0 + 100 + i)
    harness.knobs(r2ListPage=3)  # 14 objects (archives and markers): 5 pages
    since = len(harness.calls())
    listed = store(harness, "list")["backups"]
    assert [b["id"] for b in listed] == list(reversed(ids))
    lists = [c for c in r2_calls(harness, since) if c["api"] == "r2.list"]
    assert len(lists) == 5
    assert lists[0]["cursor"] is None and all(c["cursor"] for c in lists[1:])
    assert all(c["prefix"] == f"backups/{NS}/{WS}/" for c in lists)
    for b in ids:
        store(harness, "delete", id=b)
    assert store(harness, "list")["backups"] == []


def nothing_left(harness, backup_id: str) -> None:
    state = bucket(harness)
    assert not [o for o in state["objects"] if backup_id in o["key"]], state["objects"]
    assert not [u for u in state["uploads"] if backup_id in u["key"] and u["state"] == "open"], state["uploads"]
    assert backup_id not in {b["id"] for b in store(harness, "list")["backups"]}


def test_a_full_bucket_fails_the_backup(harness):
    harness.knobs(r2Fault="full")
    answer = store(harness, "write", payload(MiB), id=bid(200), at=T0)
    assert answer["error"]["code"] == "backup_failed" and "R2" in answer["error"]["message"]
    harness.knobs(r2Fault=None)
    nothing_left(harness, bid(200))


def test_a_failure_midway_aborts_the_upload(harness):
    harness.knobs(r2FailAfterParts=1)  # the second part fails
    since = len(harness.calls())
    answer = store(harness, "write", payload(3 * PART), id=bid(201), at=T0)
    assert answer["error"]["code"] == "backup_failed" and "(10001)" in answer["error"]["message"]
    apis = [c["api"] for c in r2_calls(harness, since)]
    assert apis == ["r2.createMultipartUpload", "r2.uploadPart", "r2.uploadPart", "r2.abort"]
    harness.knobs(r2FailAfterParts=None)
    nothing_left(harness, bid(201))
    assert [u["state"] for u in bucket(harness)["uploads"] if bid(201) in u["key"]] == ["aborted"]


def test_a_gone_bucket_fails_every_call(harness):
    store(harness, "write", b"kept", id=bid(202), at=T0)
    harness.knobs(r2Fault="gone")
    for op, body in (("write", payload(MiB)), ("list", None), ("open", None)):
        answer = (
            store(harness, op, body, id=bid(203)) if op != "write" else store(harness, op, body, id=bid(203), at=T0)
        )
        assert answer["error"]["code"] == "backup_failed", (op, answer)
        assert "(10006)" in answer["error"]["message"]  # NoSuchBucket
    harness.knobs(r2Fault=None)
    nothing_left(harness, bid(203))
    assert [b["id"] for b in store(harness, "list")["backups"]] == [bid(202)]
    store(harness, "delete", id=bid(202))


def test_bytes_read_back_different_are_never_marked(harness):
    harness.knobs(r2CorruptReads=True)
    since = len(harness.calls())
    answer = store(harness, "write", payload(PART + 5), id=bid(204), at=T0)
    assert answer["error"]["code"] == "backup_failed" and "other bytes" in answer["error"]["message"]
    apis = [c["api"] for c in r2_calls(harness, since)]
    assert "r2.put" not in apis and apis[-1] == "r2.delete"  # the archive went, no marker ever written
    harness.knobs(r2CorruptReads=False)
    nothing_left(harness, bid(204))


def test_an_export_that_breaks_midway_aborts(harness):
    since = len(harness.calls())
    answer = store(harness, "write", None, id=bid(205), at=T0, breakAfter=PART + MiB)
    assert answer["error"]["code"] == "container_gone"
    apis = [c["api"] for c in r2_calls(harness, since)]
    assert apis[-1] == "r2.abort" and "r2.complete" not in apis
    nothing_left(harness, bid(205))


def test_a_backup_damaged_in_the_bucket_breaks_its_stream(harness, tmp_path):
    data = payload(PART + 77, seed=9)
    store(harness, "write", data, id=bid(206), at=T0)
    archive = next(o for o in bucket(harness)["objects"] if o["key"].endswith(bid(206) + ".tar.zst"))
    with open(archive["file"], "r+b") as f:  # one byte flipped in place: same size, only the sha256 can tell
        f.seek(len(data) - 3)
        f.write(bytes([data[-3] ^ 1]))
    with pytest.raises(httpx.HTTPError):  # the body breaks instead of ending
        read_backup(harness, bid(206))
    with open(archive["file"], "r+b") as f:  # shorter than the marker says
        f.truncate(MiB)
    with pytest.raises(httpx.HTTPError):
        read_backup(harness, bid(206))
    harness.admin.post("/__harness/r2", params={"delete": archive["key"]})  # the archive lost, the marker kept
    answer, _ = read_backup(harness, bid(206))
    assert answer["error"]["code"] == "backup_failed" and "lost its archive" in answer["error"]["message"]
    store(harness, "delete", id=bid(206))


def test_unknown_ids_and_an_absent_binding(harness):
    assert read_backup(harness, bid(300))[0]["error"]["code"] == "backup_not_found"
    assert read_backup(harness, "not-an-id")[0]["error"]["code"] == "backup_not_found"
    assert store(harness, "list", ws="never")["backups"] == []
    harness.knobs(backupsBinding=False)
    assert store(harness, "available") == {"available": False}
    assert store(harness, "list") == {"backups": []}
    assert store(harness, "write", b"x", id=bid(301), at=T0)["error"]["code"] == "backups_unavailable"


def test_an_archive_without_its_marker_is_ignored_then_removed(harness):
    store(harness, "write", b"orphan", id=bid(400), at=T0)
    key = f"backups/{NS}/{WS}/{bid(400)}"
    harness.admin.post("/__harness/r2", params={"delete": key + ".json"})  # killed before the marker, in effect
    assert store(harness, "list")["backups"] == []
    assert key + ".tar.zst" in {o["key"] for o in bucket(harness)["objects"]}  # young: maybe a write in progress
    harness.advance(2 * 3600)
    assert store(harness, "list")["backups"] == []
    assert key + ".tar.zst" not in {o["key"] for o in bucket(harness)["objects"]}
