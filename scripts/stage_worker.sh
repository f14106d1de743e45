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
rm -rf "$out"  # a refused bundle leaves nothing staged

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
