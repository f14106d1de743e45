#!/usr/bin/env bash
# wrangler's custom build step (wrangler.jsonc "build"): stages exactly the Worker's own modules into build/worker/.
#
# Why: wrangler uploads every *.py under the directory of "main" and does not let a config exclude Python files,
# so pointing "main" at src/entry.py would ship src/standalone too. The staged copy holds only the glue
# (entry.py, cloudflare/) and the packages it imports (protocol, worker, durable, directory). The vendored SDK comes from
# python_modules/ (pywrangler sync, or scripts/vendor_workers_sdk.sh when that is missing or its own copy is stale).
#
# Refuses (exit 1) when python_modules/ holds any other workers-runtime-sdk than the one pinned in pyproject.toml: the
# tests ran that one, so production must import it too.
set -euo pipefail
cd "$(dirname "$0")/.."

out=build/worker
assets=build/console
rm -rf "$out" "$assets"  # a refused bundle leaves nothing staged

if [ ! -d python_modules/workers ] || [ -f python_modules/.flarebox-vendored ]; then
  scripts/vendor_workers_sdk.sh  # missing, or vendored by this script: (re)vendor the pin; a no-op when it matches
fi
pinned=$(scripts/vendor_workers_sdk.sh --pin)
shopt -s nullglob
metadata=(python_modules/workers_runtime_sdk-*.dist-info/METADATA)
shopt -u nullglob
vendored=""
[ ${#metadata[@]} -eq 1 ] && vendored=$(sed -n 's/^Version:[[:space:]]*//p' "${metadata[0]}" | head -n 1 | tr -d '\r')
if [ "$vendored" != "$pinned" ]; then
  {
    echo "stage_worker: refusing to build the Worker bundle: python_modules/ holds workers-runtime-sdk" \
      "${vendored:-(no single version: ${#metadata[@]} METADATA files)}, but pyproject.toml pins $pinned" \
      "(the copy the tests ran)."
    echo "stage_worker: run \`pywrangler sync --force\` (it honours the pin), or delete python_modules/ and rerun to" \
      "vendor the pinned SDK with scripts/vendor_workers_sdk.sh."
  } >&2
  exit 1
fi

mkdir -p "$out"
cp src/entry.py "$out/"
for pkg in cloudflare protocol worker durable directory; do
  cp -R "src/$pkg" "$out/$pkg"
done
find "$out" -name __pycache__ -type d -prune -exec rm -rf {} +

# The web console as static assets (wrangler.jsonc "assets"): the page at /, its script and style, and the terminal
# widget's files under /console/vendor/ — the URLs src/standalone/console.py serves on the standalone runtime.
# (A stand-in checkout without console/, as tests/cloudflare/test_sdk_pin.py makes, stages no assets.)
if [ -d console ]; then
  widget=(node_modules/@xterm/xterm/lib/xterm.js node_modules/@xterm/xterm/css/xterm.css node_modules/@xterm/addon-fit/lib/addon-fit.js)
  for file in "${widget[@]}"; do
    [ -f "$file" ] || { echo "stage_worker: $file is missing: run npm ci (scripts/setup.sh dev installs it)" >&2; exit 1; }
  done
  mkdir -p "$assets/console/vendor"
  cp console/index.html console/_headers "$assets/"
  cp console/console.js console/console.css "$assets/console/"
  cp "${widget[@]}" "$assets/console/vendor/"
fi
