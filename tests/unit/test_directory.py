"""The directory object (directory/directory.py) over a real SQLite file: keys, the workspace index and the audit
log, through `call` as the edge uses it."""

import json
import sqlite3
from dataclasses import fields

import pytest
from edge_doubles import FixedClock

from directory import directory as directory_module
from directory.audit import AuditRecord
from directory.directory import Directory
from durable.settings import Settings
from protocol import limits
from protocol.errors import ProtocolError
from standalone.storage import SqliteStorage


@pytest.fixture
def clock():
    return FixedClock()


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "directory.sqlite3"


def make(db_path, clock, **settings):
    storage = SqliteStorage(db_path)
    return Directory(storage, clock, Settings(**settings)), storage


@pytest.fixture
def directory(db_path, clock):
    d, storage = make(db_path, clock)
    yield d
    storage.close()


def request(**extra):
    return {"namespace": "ns", "workspace": "ws", "scopes": ["exec"], "expires_in": None, "label": "ci", **extra}


async def mint(directory, **extra):
    return await directory.call("mint_key", {"request": request(**extra)})


async def test_a_minted_key_verifies_and_its_secret_is_stored_nowhere(directory, db_path):
    minted = await mint(directory)
    assert minted["key"].startswith(f"fbk_{minted['id']}_") and len(minted["key"]) == 4 + 16 + 1 + 32
    record = await directory.call("verify_key", {"key": minted["key"]})
    assert record == {k: v for k, v in minted.items() if k != "key"} | {"last_used_at": record["last_used_at"]}
    secret = minted["key"].split("_", 2)[2]
    raw = db_path.read_bytes() + (db_path.with_name(db_path.name + "-wal").read_bytes())
    assert secret.encode() not in raw and minted["key"].encode() not in raw
    assert all("key" not in k or k == "keys" for k in await directory.call("list_keys", {"namespace": None}))


async def test_two_keys_differ_in_id_and_secret(directory):
    a, b = await mint(directory), await mint(directory)
    assert a["id"] != b["id"] and a["key"][21:] != b["key"][21:]


@pytest.mark.parametrize(
    "presented",
    [
        "",
        "fbk_",
        "fbk_0123456789abcdef_" + "A" * 32,  # well-formed, never minted
        "fbk_0123456789ABCDEF_" + "A" * 32,  # id in upper case
        "token-like-but-not-a-key" * 3,
    ],
)
async def test_anything_but_a_minted_key_is_unauthorized(directory, presented):
    await mint(directory)
    with pytest.raises(ProtocolError) as err:
        await directory.call("verify_key", {"key": presented})
    assert err.value.code == "unauthorized"


async def test_the_right_id_with_a_wrong_secret_is_unauthorized(directory):
    minted = await mint(directory)
    forged = minted["key"][:21] + ("B" if minted["key"][21] != "B" else "C") + minted["key"][22:]
    with pytest.raises(ProtocolError) as err:
        await directory.call("verify_key", {"key": forged})
    assert err.value.code == "unauthorized"


async def test_a_key_expires_at_its_second(directory, clock):
    minted = await mint(directory, expires_in=10)
    clock.ms += 9_999
    await directory.call("verify_key", {"key": minted["key"]})
    clock.ms += 1
    with pytest.raises(ProtocolError) as err:
        await directory.call("verify_key", {"key": minted["key"]})
    assert err.value.code == "unauthorized"


async def test_a_revoked_key_stops_at_once_and_a_second_revoke_is_key_not_found(directory):
    minted = await mint(directory)
    revoked = await directory.call("revoke_key", {"key_id": minted["id"]})
    assert revoked["id"] == minted["id"] and "key" not in revoked
    with pytest.raises(ProtocolError) as err:
        await directory.call("verify_key", {"key": minted["key"]})
    assert err.value.code == "unauthorized"
    with pytest.raises(ProtocolError) as err:
        await directory.call("revoke_key", {"key_id": minted["id"]})
    assert err.value.code == "key_not_found"


async def test_last_used_is_written_at_most_once_a_minute(directory, clock):
    minted = await mint(directory)
    first = (await directory.call("verify_key", {"key": minted["key"]}))["last_used_at"]
    assert first is None  # the record as it was before this use
    clock.ms += 30_000
    await directory.call("verify_key", {"key": minted["key"]})
    listed = (await directory.call("list_keys", {"namespace": "ns"}))[0]
    clock.ms += 30_000
    await directory.call("verify_key", {"key": minted["key"]})
    later = (await directory.call("list_keys", {"namespace": "ns"}))[0]
    assert listed["last_used_at"] == "2027-01-15T08:00:00.000Z"
    assert later["last_used_at"] == "2027-01-15T08:01:00.000Z"


async def test_listing_keys_filters_by_namespace(directory):
    await mint(directory)
    await mint(directory, namespace="other", workspace=None)
    assert [k["namespace"] for k in await directory.call("list_keys", {"namespace": "other"})] == ["other"]
    assert len(await directory.call("list_keys", {"namespace": None})) == 2


async def test_the_key_cap_holds(directory, monkeypatch):
    monkeypatch.setattr(limits, "MAX_KEYS", 3)
    monkeypatch.setattr(directory_module.limits, "MAX_KEYS", 3)
    for _ in range(3):
        await mint(directory)
    with pytest.raises(ProtocolError) as err:
        await mint(directory)
    assert err.value.code == "quota_exceeded"
    assert len(await directory.call("list_keys", {"namespace": None})) == 3


async def test_expired_keys_do_not_hold_places_under_the_cap(directory, clock, monkeypatch):
    monkeypatch.setattr(directory_module.limits, "MAX_KEYS", 2)
    await mint(directory, expires_in=1)
    await mint(directory)
    with pytest.raises(ProtocolError):
        await mint(directory)
    clock.ms += 1000
    await mint(directory)
    assert len(await directory.call("list_keys", {"namespace": None})) == 3


async def test_the_namespace_cap_counts_distinct_workspaces_and_a_repeat_is_free(db_path, clock):
    d, storage = make(db_path, clock, max_workspaces_per_namespace=2)
    try:
        assert await d.call("reserve_workspace", {"namespace": "ns", "workspace": "a"}) == {"created": True}
        assert await d.call("reserve_workspace", {"namespace": "ns", "workspace": "a"}) == {"created": False}
        assert await d.call("reserve_workspace", {"namespace": "ns", "workspace": "b"}) == {"created": True}
        with pytest.raises(ProtocolError) as err:
            await d.call("reserve_workspace", {"namespace": "ns", "workspace": "c"})
        assert err.value.code == "quota_exceeded"
        assert await d.call("reserve_workspace", {"namespace": "other", "workspace": "c"}) == {"created": True}
        await d.call("unindex_workspace", {"namespace": "ns", "workspace": "a"})
        assert await d.call("reserve_workspace", {"namespace": "ns", "workspace": "c"}) == {"created": True}
    finally:
        storage.close()


async def test_the_workspace_index_pages_in_name_order(directory):
    names = [("a", "x"), ("a", "y"), ("b", "x"), ("b", "z"), ("c", "q")]
    for ns, ws in reversed(names):
        await directory.call("reserve_workspace", {"namespace": ns, "workspace": ws})
    seen, after = [], None
    while True:
        page = await directory.call(
            "list_workspaces", {"namespace": None, "workspace": None, "after": after, "limit": 2}
        )
        seen += [tuple(p) for p in page["workspaces"]]
        after = page["next"]
        if after is None:
            break
    assert seen == names
    only_b = await directory.call("list_workspaces", {"namespace": "b", "workspace": None, "after": None, "limit": 9})
    assert [tuple(p) for p in only_b["workspaces"]] == [("b", "x"), ("b", "z")] and only_b["next"] is None
    one = await directory.call("list_workspaces", {"namespace": "b", "workspace": "z", "after": None, "limit": 9})
    assert [tuple(p) for p in one["workspaces"]] == [("b", "z")]


def record(**extra):
    base = AuditRecord(
        key_id=None,
        key_label=None,
        namespace="ns",
        workspace="ws",
        operation="exec",
        request_id=None,
        status=200,
        code=None,
        duration_ms=3,
        detail={"command": "true"},
    )
    return {**base.to_json(), **extra}


async def test_audit_pages_newest_first_and_filters(directory, clock):
    for i in range(5):
        clock.ms += 1000
        await directory.call("append_audit", {"record": record(workspace=f"w{i % 2}", duration_ms=i)})
    page = await directory.call(
        "list_audit", {"namespace": None, "workspace": None, "since_ms": None, "before": None, "limit": 2}
    )
    assert [r["seq"] for r in page["records"]] == [5, 4] and page["next"] == 4
    page = await directory.call(
        "list_audit", {"namespace": None, "workspace": None, "since_ms": None, "before": 4, "limit": 2}
    )
    assert [r["seq"] for r in page["records"]] == [3, 2]
    w0 = await directory.call(
        "list_audit", {"namespace": "ns", "workspace": "w0", "since_ms": None, "before": None, "limit": 9}
    )
    assert [r["seq"] for r in w0["records"]] == [5, 3, 1]
    since = await directory.call(
        "list_audit", {"namespace": None, "workspace": None, "since_ms": clock.ms - 1000, "before": None, "limit": 9}
    )
    assert [r["seq"] for r in since["records"]] == [5, 4]
    newest = page["records"][0]
    assert newest["command"] == "true" and newest["actor"] == "admin" and newest["duration_ms"] == 2


async def test_an_audit_page_of_long_commands_ends_early_and_loses_nothing(directory, monkeypatch):
    monkeypatch.setattr(directory_module, "AUDIT_PAGE_DETAIL_BYTES", 25_000)
    for i in range(7):
        await directory.call("append_audit", {"record": record(detail={"command": f"{i}" * 10_000})})
    seen, before = [], None
    while True:
        page = await directory.call(
            "list_audit", {"namespace": None, "workspace": None, "since_ms": None, "before": before, "limit": 100}
        )
        assert 1 <= len(page["records"]) <= 2
        seen += [(r["seq"], r["command"]) for r in page["records"]]
        before = page["next"]
        if before is None:
            break
    assert seen == [(i + 1, f"{i}" * 10_000) for i in reversed(range(7))]


async def test_audit_retention_bounds_count_and_age(db_path, clock, monkeypatch):
    monkeypatch.setattr(directory_module, "PRUNE_EVERY", 1)
    d, storage = make(db_path, clock, audit_max_records=100, audit_max_age_days=1)
    try:
        for _ in range(130):
            await d.call("append_audit", {"record": record()})
        rows = sqlite3.connect(db_path).execute("SELECT min(seq), max(seq), count(*) FROM audit").fetchone()
        assert rows == (31, 130, 100)
        clock.ms += 86_400_000 + 1
        await d.call("append_audit", {"record": record()})
        assert sqlite3.connect(db_path).execute("SELECT seq FROM audit").fetchall() == [(131,)]
    finally:
        storage.close()


async def test_an_unknown_operation_is_not_found(directory):
    with pytest.raises(ProtocolError) as err:
        await directory.call("drop_everything", {})
    assert err.value.code == "not_found"


async def test_a_full_disk_does_not_lock_keys_out(directory, monkeypatch):
    minted = await mint(directory)
    real = directory._sql

    def full(query, *params):
        if query.startswith(("UPDATE", "INSERT", "DELETE")):
            raise ProtocolError("storage_full")
        return real(query, *params)

    monkeypatch.setattr(directory, "_sql", full)
    assert (await directory.call("verify_key", {"key": minted["key"]}))["id"] == minted["id"]
    with pytest.raises(ProtocolError) as err:
        await mint(directory)  # what must be written still fails as it should
    assert err.value.code == "storage_full"


def test_an_audit_record_round_trips_through_json_and_its_detail_is_a_copy():
    original = AuditRecord(
        key_id="k1",
        key_label="ci",
        namespace="ns",
        workspace="ws",
        operation="write_file",
        request_id="r1",
        status=200,
        code=None,
        duration_ms=4,
        detail={"path": "/workspace/a", "size": 3},
        at_ms=7,
    )
    wire = original.to_json()
    assert set(wire) == {f.name for f in fields(AuditRecord)}
    assert AuditRecord.from_json(json.loads(json.dumps(wire))) == original
    wire["detail"]["size"] = 99  # what the caller does with it never reaches the record
    assert original.detail == {"path": "/workspace/a", "size": 3}


async def test_each_audit_append_answers_its_own_rows_sequence_number(directory, clock):
    seqs = [(await directory.call("append_audit", {"record": record()}))["seq"] for _ in range(3)]
    assert seqs == [1, 2, 3]
    page = await directory.call(
        "list_audit", {"namespace": None, "workspace": None, "since_ms": None, "before": None, "limit": 9}
    )
    assert [r["seq"] for r in page["records"]] == [3, 2, 1]
