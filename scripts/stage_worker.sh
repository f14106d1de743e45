#!/usr/bin/env bash
# wrangler's custom build step (wrangler.jsonc "build"): stages exactly the Worker's own modules into build/worker/.
#
# Why: wrangler uploads every *.py under the directory of "main" and does not let a config exclude Python files,
# so pointing "main" at src/entry.py would ship src/standalone too. The staged copy holds only the glue
# (entry.py, cloudflare/) and the packages it imports (protocol, worker, durable, directory). The vendored SDK comes from
# python_modules/ (pywrangler sync, or scripts/vendor_workers_sdk.sh when that is missing).
set -euo pipefail
cd "$(dirname "$0")/.."

out=build/worker
rm -rf "$out"
mkdir -p "$out"
cp src/entry.py "$out/"
for pkg in cloudflare protocol worker durable directory; do
  cp -R "src/$pkg" "$out/$pkg"
done
find "$out" -name __pycache__ -type d -prune -exec rm -rf {} +

[ -d python_modules/workers ] || scripts/vendor_workers_sdk.sh
