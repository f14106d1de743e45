"""Export and import archives vs the bare pipelines they replace, on bench_snapshots' mixed tree.

Baselines, measured in the same run on the same tree (rounds alternate, so a load spike hits both):
  export: tar -cf - workspace home | zstd -T0 -3 -q > file          (throughput; goal: ours >= 0.8x)
  import: zstd -d -q -c file | tar -xf -                            (time; reported)
Ours: GET /export through a real supervisor over its unix socket, read by curl (a Python client would take CPU the
figure measures) — the worker that walks the tree, hashes every file and writes the manifest, plus the supervisor's
relay; and PUT /import, which also verifies every member's sha256 against the manifest and swaps the tree in.
"""

import os
import pwd
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.bench_snapshots import MB, make_workspace
from bench.framework import figure

EXPORT_GOAL = 0.8


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _supervisor(base: Path) -> tuple[subprocess.Popen, Path]:
    sock = base / "sup.sock"
    cmd = [sys.executable, "-m", "flarebox_supervisor", "--unix", str(sock), "--workdir", str(base / "workspace")]
    if os.geteuid() == 0:  # as the sandbox runs it: an unprivileged user owning its files
        cmd += ["--user", "nobody"]
        entry = pwd.getpwnam("nobody")
        subprocess.run(["chown", "-R", f"{entry.pw_uid}:{entry.pw_gid}", str(base)], check=True)
    env = dict(os.environ, FLAREBOX_ARCHIVE_HOME=str(base / "home"))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://sv") as client:
        for _ in range(400):
            try:
                if client.get("/health").status_code == 200:
                    return proc, sock
            except httpx.TransportError:
                time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the supervisor did not start")


def run(quick: bool = False) -> list[dict]:
    size = (20 if quick else 200) * MB
    rounds = 3 if quick else 5
    base = Path(tempfile.mkdtemp(prefix="fbx-bench-archives-"))
    os.chmod(base, 0o755)
    proc = None
    try:
        files, total = make_workspace(base, size)
        (base / "home").mkdir(exist_ok=True)
        (base / "home" / ".bashrc").write_text("export X=1\n")
        proc, sock = _supervisor(base)
        ours, bare = base / "ours.tar.zst", base / "bare.tar.zst"

        def export_route():
            url = "http://sv/export"
            subprocess.run(["curl", "-sf", "--unix-socket", str(sock), url, "-o", str(ours)], check=True)

        def export_bare():
            subprocess.run(f"tar -C {base} -cf - workspace home | zstd -q -T0 -3 -c > {bare}", shell=True, check=True)

        export_bare()  # warm the page cache
        export_route()
        times: dict[str, list[float]] = {"ours": [], "bare": []}
        for _ in range(rounds):
            times["bare"].append(_seconds(export_bare))
            times["ours"].append(_seconds(export_route))
        ours_s, bare_s = statistics.median(times["ours"]), statistics.median(times["bare"])
        note = f"{files} files, {total / MB:.0f} MB → {ours.stat().st_size / MB:.0f} MB archive, median of {rounds}"
        rows = [
            figure(
                f"export {total / MB:.0f} MB: GET /export throughput",
                total / ours_s / MB,
                "MB/s",
                "tar | zstd -T0 -3",
                total / bare_s / MB,
                goal=EXPORT_GOAL,
                better="higher",
                note=note + "; the archive also carries every file's sha256 in its manifest",
            )
        ]

        target = base / "target"

        def fresh():
            shutil.rmtree(target, ignore_errors=True)
            (target / "workspace").mkdir(parents=True)
            (target / "home").mkdir()

        def import_route():
            with open(ours, "rb") as body:
                cmd = ["curl", "-sf", "-X", "PUT", "--unix-socket", str(sock), "-T", "-", "http://sv/import"]
                subprocess.run(cmd, stdin=body, stdout=subprocess.DEVNULL, check=True)

        def import_bare():
            subprocess.run(f"zstd -q -d -c {bare} | tar -C {target} -xf -", shell=True, check=True)

        times = {"ours": [], "bare": []}
        for _ in range(rounds):
            fresh()
            times["bare"].append(_seconds(import_bare))
            times["ours"].append(_seconds(import_route))  # into the supervisor's own live tree, replaced whole
        rows.append(
            figure(
                f"import {total / MB:.0f} MB: PUT /import",
                statistics.median(times["ours"]),
                "s",
                "zstd -d | tar -x",
                statistics.median(times["bare"]),
                note=note + "; ours verifies every sha256 against the manifest and swaps the tree in",
            )
        )
        return rows
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(base, ignore_errors=True)
