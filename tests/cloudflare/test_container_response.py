"""`JsContainerResponse.read()` under real Pyodide (Node): a control answer is read chunk by chunk and refused past
its limit, the JS stream cancelled, never buffered whole (a hostile sandbox's endless body must not fill the isolate).

The endless body stops producing after 64 MiB and stalls without ending: still endless to the reader, but code that
buffers all of it (arrayBuffer) hangs here instead of eating the host's memory.
"""

import json
import subprocess
from pathlib import Path

import pytest

from protocol.limits import CONTROL_BODY_BYTES

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
NODE = REPO / "node_modules" / ".bin" / "node"  # as in conftest.py (a module named conftest is ambiguous to import)

SCRIPT = r"""
const { loadPyodide } = await import(process.argv[3]);  // by path: this script lives outside the repository

const CHUNK = 64 * 1024, SAFETY = 64 * 1024 * 1024;
globalThis.stats = { pulled: 0, cancelled: false };
globalThis.endless = () => new Response(new ReadableStream({
  type: "bytes",
  async pull(controller) {
    if (stats.pulled >= SAFETY) return new Promise(() => {});  // stall: no more bytes, no end
    stats.pulled += CHUNK;
    controller.enqueue(new Uint8Array(CHUNK).fill(120));
  },
  cancel() { stats.cancelled = true; },
}, { highWaterMark: 0 }));
globalThis.small = () => new Response('{"ok":true,"running":2}', { status: 200 });
globalThis.empty = () => new Response(null, { status: 204 });

const py = await loadPyodide();
py.FS.mkdirTree("/flarebox/src");
py.FS.mount(py.FS.filesystems.NODEFS, { root: process.argv[2] + "/src" }, "/flarebox/src");
const out = await py.runPythonAsync(`
import json, sys
sys.path[:0] = ["/flarebox/src"]
import js
from cloudflare.container import JsContainerResponse
from durable.ports import ContainerGone

result = {}
result["small"] = await JsContainerResponse(js.small()).json()
result["empty"] = (await JsContainerResponse(js.empty()).read()).decode()
try:
    await JsContainerResponse(js.endless()).read()
    result["endless"] = "read it all"
except ContainerGone as gone:
    result["endless"] = str(gone)
result["pulled"], result["cancelled"] = js.stats.pulled, js.stats.cancelled
json.dumps(result)
`);
console.log(out);
"""


def test_an_endless_control_answer_is_refused_and_cancelled(tmp_path):
    if not NODE.exists():
        pytest.fail("node_modules is missing: run `scripts/setup.sh dev` (npm ci)")
    script = tmp_path / "read.mjs"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [str(NODE), "--no-warnings", str(script), str(REPO), str(REPO / "node_modules" / "pyodide" / "pyodide.mjs")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["small"] == {"ok": True, "running": 2}
    assert result["empty"] == ""
    assert result["endless"] == f"the container sent more than {CONTROL_BODY_BYTES} bytes for a control answer"
    assert result["pulled"] <= CONTROL_BODY_BYTES + 2 * 64 * 1024
    assert result["cancelled"] is True
