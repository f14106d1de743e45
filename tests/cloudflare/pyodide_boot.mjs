// The Python the harness runs (harness.mjs) and the cold-start probe (cold_start.mjs) boot alike: Pyodide with
// src/ and the vendored SDK (python_modules/) mounted and on sys.path, plus the two modules workerd injects.
// `env` is what `cloudflare:workers` hands the SDK as its env.

import path from "node:path";
import { loadPyodide } from "pyodide";

export async function bootPython(root, env) {
  const py = await loadPyodide();
  for (const [dir, mount] of [[path.join(root, "src"), "/flarebox/src"], [path.join(root, "python_modules"), "/flarebox/python_modules"]]) {
    py.FS.mkdirTree(mount);
    py.FS.mount(py.FS.filesystems.NODEFS, { root: dir }, mount);
  }
  py.registerJsModule("_cloudflare_compat_flags", {
    python_workflows_implicit_dependencies: false,
    python_request_headers_preserve_commas: true,
  });
  py.registerJsModule("_pyodide_entrypoint_helper", {
    cloudflareWorkersModule: { env },
    cloudflareSocketsModule: {},
    doAnImport: async (name) => {
      throw new Error(`harness: no module ${name}`);
    },
    patchWaitUntil() {},
    *patch_env_helper() {
      yield;
    },
  });
  py.runPython(`
import sys
sys.path[:0] = ["/flarebox/src", "/flarebox/python_modules"]
`);
  return py;
}
