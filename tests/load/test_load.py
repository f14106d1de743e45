"""Load and soak against a real `flarebox serve`, reduced for CI (about a minute and a half): concurrent clients
mixing exec, file writes and reads (checked by sha256) and status on several workspaces; idle snapshot/restore
cycles on every workspace with its contents verified each time; requests racing idle saves. The goal is zero
errors; speed is bench/bench_load.py's business, so nothing here is timed."""

import shutil

import pytest

from bench import loadgen

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")]

CLIENTS, WORKSPACES, SECONDS = 8, 4, 25
SOAK_WORKSPACES, CYCLES, IDLE = 3, 3, 2


def test_concurrent_mix_has_no_errors():
    server = loadgen.Server(idle_seconds=600)
    try:
        names = loadgen.setup(server, WORKSPACES)
        tally = loadgen.mix(server, names, CLIENTS, SECONDS)
        assert tally.errors == [], (tally.errors[:10], server.log_tail())
        # every kind really ran, on every workspace's behalf, many times
        assert all(len(tally.samples[kind]) >= 10 for kind in loadgen.KINDS), {
            k: len(v) for k, v in tally.samples.items()
        }
        with server.client() as client:
            for name in names:
                status = client.get_workspace(loadgen.NS, name)
                assert status["state"] == "running" and status["busy"] is False, status
    finally:
        server.stop()


def test_idle_snapshot_restore_soak_keeps_every_file():
    server = loadgen.Server(idle_seconds=IDLE)
    try:
        names = loadgen.setup(server, SOAK_WORKSPACES)
        tally = loadgen.soak(server, names, CYCLES, IDLE)
        assert tally.errors == [], (tally.errors, server.log_tail())
        assert len(tally.samples["restore"]) == SOAK_WORKSPACES * CYCLES
        with server.client() as client:
            for name in names:
                assert len(client.snapshots(loadgen.NS, name)) >= 1
    finally:
        server.stop()


def test_requests_racing_idle_saves_and_restores_have_no_errors():
    """IDLE_SECONDS=1 and clients pausing about that long between requests: idle saves, stops and restores keep
    interleaving with execs and file transfers arriving mid-save. Every answer must still be right (files by
    sha256), and the workspaces really went through saves."""
    server = loadgen.Server(idle_seconds=1)
    try:
        names = loadgen.setup(server, 2)
        tally = loadgen.mix(server, names, 4, 20, think=(0.5, 1.6))
        assert tally.errors == [], (tally.errors[:10], server.log_tail())
        assert len(tally.samples["read"]) >= 5 and len(tally.samples["exec"]) >= 10
        with server.client() as client:
            assert all(client.snapshots(loadgen.NS, name) for name in names)
    finally:
        server.stop()
