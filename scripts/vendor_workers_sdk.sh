#!/usr/bin/env bash
# Vendors the Python Workers SDK into python_modules/ — what wrangler uploads as the Worker's "vendored modules".
#
# Why not `pywrangler sync`: it needs a Pyodide cross-build environment from GitHub and wheels from Pyodide's own
# index, neither reachable offline. The Worker imports nothing but the SDK (pure Python), so uv can vendor it from
# PyPI directly. The SDK version is pinned because production imports exactly this copy, and the offline test
# harness (tests/cloudflare/) runs the same copy under Pyodide. Idempotent: skips when the stamp matches.
set -euo pipefail
cd "$(dirname "$0")/.."

SDK_VERSION=1.9.5          # keep in step with [dependency-groups] in pyproject.toml
PYTHON_VERSION=3.14        # the Python of wrangler.jsonc's compatibility_date (>= 2026-09-08 → 3.14)
PLATFORM=wasm32-pyodide2025
stamp="workers-runtime-sdk==$SDK_VERSION python$PYTHON_VERSION $PLATFORM"

if [ -f python_modules/.flarebox-vendored ] && [ "$(cat python_modules/.flarebox-vendored)" = "$stamp" ]; then
  exit 0
fi
uv=${UV:-.venv/bin/uv}
[ -x "$uv" ] || uv=uv
rm -rf python_modules
"$uv" pip install --quiet --target python_modules --python-platform "$PLATFORM" --python-version "$PYTHON_VERSION" \
  --only-binary :all: "workers-runtime-sdk==$SDK_VERSION"
# A target install may leave scripts behind; the bundle wants modules only.
rm -rf python_modules/bin python_modules/.lock
printf '%s' "$stamp" > python_modules/.flarebox-vendored
echo "vendor: workers-runtime-sdk $SDK_VERSION -> python_modules/" >&2
