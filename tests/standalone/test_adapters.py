"""The standalone runtime's small adapters, run for real: JSONC config, the token file, SQLite storage, persisted
alarms and the queue-backed response streams."""

import asyncio
import os
import stat

import pytest

from durable.ports import ContainerGone
from standalone.alarms import PersistentAlarm
from standalone.clock import AsyncioClock
from standalone.config import load_settings, strip_jsonc
from standalone.storage import SqliteStorage
from standalone.streams import QueueSink, StreamClosed
from standalone.token import load_or_create_token, read_local_token, token_notice

pytestmark = pytest.mark.timeout(30)


def test_jsonc_comments_and_trailing_commas_outside_strings_only(tmp_path):
    text = '{\n // c\n "a": "x // not a comment, /* nor this */",\n /* b */ "b": [1, 2,],\n "c": "q\\"//",\n}'
    import json

    assert json.loads(strip_jsonc(text)) == {"a": "x // not a comment, /* nor this */", "b": [1, 2], "c": 'q"//'}


def test_settings_environment_overrides_wrangler_vars(tmp_path):
    wrangler = tmp_path / "wrangler.jsonc"
    wrangler.write_text('{"vars": {"IDLE_SECONDS": "30", "ENABLE_INTERNET": false, // off\n},}')
    assert load_settings({}, wrangler).idle_seconds == 30
    assert load_settings({}, wrangler).enable_internet is False
    settings = load_settings({"IDLE_SECONDS": "7", "ENABLE_INTERNET": "true"}, wrangler)
    assert (settings.idle_seconds, settings.enable_internet) == (7, True)
    with pytest.raises(ValueError, match="IDLE_SECONDS"):
        load_settings({"IDLE_SECONDS": "0"}, wrangler)
    # no wrangler.jsonc: the built-in defaults
    assert load_settings({}, tmp_path / "missing.jsonc").idle_seconds == 600


def test_the_repository_wrangler_jsonc_parses_and_feeds_the_settings():
    from standalone.config import REPO_ROOT, wrangler_vars

    path = REPO_ROOT / "wrangler.jsonc"
    if not path.is_file():
        pytest.skip("no wrangler.jsonc in this checkout")
    found = wrangler_vars(path)
    assert "IDLE_SECONDS" in found and "SANDBOX_API_TOKEN" not in found  # the secret is never a var
    assert load_settings({}, path).idle_seconds == int(found["IDLE_SECONDS"])


def test_token_generated_once_with_mode_0600_then_reused(tmp_path):
    first = load_or_create_token(tmp_path, {})
    assert first.source == "generated" and first.usable
    assert stat.S_IMODE(os.stat(tmp_path / "token").st_mode) == 0o600
    assert first.value in token_notice(first, "http://127.0.0.1:8787")
    again = load_or_create_token(tmp_path, {})
    assert (again.source, again.value) == ("file", first.value)
    assert first.value not in token_notice(again, "http://127.0.0.1:8787")
    assert read_local_token(tmp_path) == first.value
    env = load_or_create_token(tmp_path, {"SANDBOX_API_TOKEN": "x" * 40})
    assert env.source == "env" and env.value not in token_notice(env, "http://127.0.0.1:8787")


def test_storage_rows_as_dicts_survive_reopen(tmp_path):
    db = SqliteStorage(tmp_path / "s.sqlite3")
    db.sql("CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER); CREATE TABLE u (x)")
    db.sql("INSERT INTO t VALUES (?, ?)", "a", 1)
    assert db.sql("SELECT * FROM t") == [{"k": "a", "v": 1}]
    db.close()
    assert SqliteStorage(tmp_path / "s.sqlite3").sql("SELECT v FROM t WHERE k = ?", "a") == [{"v": 1}]


async def test_alarm_fires_replaces_and_is_rearmed_from_disk(tmp_path):
    clock = AsyncioClock()
    fired = asyncio.Event()
    calls = []

    async def fire():
        calls.append(clock.now_ms())
        fired.set()

    db = SqliteStorage(tmp_path / "s.sqlite3")
    alarm = PersistentAlarm(db, clock, fire, "t")
    await alarm.set(clock.now_ms() + 60_000)
    await alarm.set(clock.now_ms() + 50)  # replaces the first
    await asyncio.wait_for(fired.wait(), 5)
    assert len(calls) == 1 and alarm.scheduled_at() is None  # cleared before the handler ran

    # persisted: a new process (new alarm object on the same file) re-arms an overdue alarm and fires it
    await alarm.set(clock.now_ms() + 60_000)
    alarm.close()
    db.sql("UPDATE _standalone_alarm SET at_ms = ?", clock.now_ms() - 1000)
    fired.clear()
    second = PersistentAlarm(db, clock, fire, "t")
    assert second.rearm()
    await asyncio.wait_for(fired.wait(), 5)
    assert len(calls) == 2
    await alarm.clear()
    assert not second.rearm()
    await clock.shutdown()


async def test_stream_backpressure_and_dead_reader_stop_the_writer():
    sink = QueueSink(maxsize=2)
    await sink.write(b"a")
    await sink.write(b"b")
    blocked = asyncio.ensure_future(sink.write(b"c"))
    await asyncio.sleep(0.05)
    assert not blocked.done()  # bounded: the writer waits for the reader
    assert await sink.readable.__anext__() == b"ab"  # what was queued comes out as one chunk
    await asyncio.wait_for(blocked, 2)
    await sink.readable.aclose()  # the client went away
    with pytest.raises(StreamClosed):
        await sink.write(b"d")


async def test_pipe_from_reports_abnormal_end_as_container_gone_and_stops_for_dead_client():
    async def broken():
        yield b"x"
        raise ConnectionResetError("sandbox died")

    sink = QueueSink()
    with pytest.raises(ContainerGone):
        await sink.pipe_from(broken())
    assert await sink.readable.__anext__() == b"x"

    produced = []

    async def endless():
        while True:
            produced.append(1)
            yield b"y" * 10

    ended = QueueSink()
    await ended.write(b"1")
    await ended.write(b"2")
    await ended.close()
    assert [chunk async for chunk in ended.readable] == [b"12"]  # coalesced, and the end is not lost

    gone = QueueSink(maxsize=1)
    await gone.readable.aclose()
    await asyncio.wait_for(gone.pipe_from(endless()), 2)  # returns instead of relaying for nobody
    assert len(produced) <= 2
