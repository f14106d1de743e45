// The Worker's cold start, in a fresh Pyodide booted as the harness boots it (pyodide_boot.mjs): what importing
// one module costs and loads, and what the Worker's first requests then cost. Used by bench/bench_worker.py (the
// figures) and tests/cloudflare/test_cold_start_under_pyodide.py (the module set).
//
//   node cold_start.mjs <module> [requests]
//
// Imports <module> ("entry" for the Worker's entry, "workers" for the SDK alone) and prints one JSON line:
//   boot_ms      loadPyodide and the mounts
//   import_ms    the import of <module>
//   loaded       the modules the import added to sys.modules (sorted)
// With "requests" (module "entry" only), the Worker's Default.fetch then answers GET /v1/health and an audited
// POST /v1/workspaces/ns/w/exec (whose Durable Object stubs answer at once: no object runs), each twice:
//   first_ms     the first round (the health request, then the exec one)    warm_ms  the second round
//   statuses     the four answers' statuses
//   request_loaded  the modules the requests imported
//   ran          of the modules loaded at import, those some code of which ran during a third, profiled round
// Configuration: HARNESS_ROOT (the repository); COLD_DEBUG=1 prints each answer on stderr.

import path from "node:path";
import { bootPython } from "./pyodide_boot.mjs";

const ROOT = path.resolve(process.env.HARNESS_ROOT || path.join(import.meta.dirname, "..", ".."));
const [moduleName, withRequests] = process.argv.slice(2);
const TOKEN = "cold-start-token-" + "t".repeat(32);

// Durable Object namespaces whose stubs answer every call at once with small JSON; the class name is the one the
// SDK's env wrapper recognises.
class DurableObjectNamespace {
  constructor(answer) {
    this.answer = answer;
  }
  idFromName(name) {
    return { name, toString: () => name };
  }
  get(id) {
    return this.getByName(id.name);
  }
  getByName() {
    return {
      fetch: async (input) => {
        if (input instanceof Request && input.body) await input.arrayBuffer();
        return new Response(JSON.stringify(this.answer), { status: 200, headers: { "content-type": "application/json" } });
      },
    };
  }
}

const env = {
  SANDBOX_API_TOKEN: TOKEN,
  WORKSPACE: new DurableObjectNamespace({ exit_code: 0, stdout: "", stderr: "" }),
  DIRECTORY: new DurableObjectNamespace({}),
};

const started = performance.now();
const py = await bootPython(ROOT, env);
py.runPython("import sys; _cold_before = set(sys.modules)");
const booted = performance.now();
const imported = py.pyimport(moduleName);
const importMs = performance.now() - booted;
const loaded = py.runPython("sorted(set(sys.modules) - _cold_before)").toJs();
const out = { module: moduleName, boot_ms: booted - started, import_ms: importMs, loaded };

if (withRequests === "requests") {
  const Request_ = py.pyimport("workers").Request;
  const ctx = { waitUntil: (p) => Promise.resolve(p).catch(() => {}), passThroughOnException() {} };
  const headers = { authorization: `Bearer ${TOKEN}`, "cf-connecting-ip": "127.0.0.1" };
  let n = 0;
  const round = async () => {
    const statuses = [];
    n += 1;
    for (const [method, url, body] of [
      ["GET", "https://flarebox.example/v1/health", undefined],
      ["POST", "https://flarebox.example/v1/workspaces/ns/w/exec", JSON.stringify({ request_id: n.toString(16).padStart(32, "0"), command: "true" })],
    ]) {
      const request = new Request(url, { method, headers: { ...headers, "content-type": "application/json" }, body });
      const response = (await imported.Default(ctx, env).fetch(Request_(request))).js_object;
      const text = await response.text();
      if (process.env.COLD_DEBUG) console.error(response.status, text.slice(0, 300));
      statuses.push(response.status);
    }
    return statuses;
  };
  py.runPython("_cold_after_import = set(sys.modules)");
  let t = performance.now();
  const firstStatuses = await round();
  out.first_ms = performance.now() - t;
  t = performance.now();
  const warmStatuses = await round();
  out.warm_ms = performance.now() - t;
  out.statuses = [...firstStatuses, ...warmStatuses];
  out.request_loaded = py.runPython("sorted(set(sys.modules) - _cold_after_import)").toJs();
  // which of the modules loaded at import ran any code during a request: a profile of every Python call
  py.runPython(`
_cold_ran = set()
def _cold_profile(frame, event, arg):
    if event == "call":
        _cold_ran.add(frame.f_globals.get("__name__"))
`);
  py.runPython("sys.setprofile(_cold_profile)");
  await round();
  py.runPython("sys.setprofile(None)");
  out.ran = py.runPython(`sorted(_cold_ran & (_cold_after_import - _cold_before))`).toJs();
}

process.stdout.write(JSON.stringify(out) + "\n");
process.exit(0);
