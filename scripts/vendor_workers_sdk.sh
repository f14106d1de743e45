#!/usr/bin/env bash
# Vendors the Python Workers SDK into python_modules/ — what wrangler uploads as the Worker's "vendored modules".
#
# Why not `pywrangler sync`: it needs a Pyodide cross-build environment from GitHub and wheels from Pyodide's own
# index, neither reachable offline. The Worker imports nothing but the SDK (pure Python), so uv can vendor it from
# PyPI directly. The version is the pin in pyproject.toml's [project] dependencies — the same pin `pywrangler sync`
# resolves for `pywrangler deploy` — because production imports exactly this copy, and the offline test harness
# (tests/cloudflare/) runs the same copy under Pyodide. Idempotent: skips when the stamp matches.
#
# `vendor_workers_sdk.sh --pin` prints the pinned version and exits (scripts/stage_worker.sh checks the bundle
# against it).
set -euo pipefail
cd "$(dirname "$0")/.."

py=${PYTHON:-.venv/bin/python}
command -v "$py" >/dev/null 2>&1 || py=python3
# The one place the version is written: `workers-runtime-sdk==X; sys_platform == 'emscripten'` in [project]
# dependencies (see the comment there). Anything but exactly one exact pin is an error.
SDK_VERSION=$("$py" - <<'PY'
import re, sys, tomllib

with open("pyproject.toml", "rb") as f:
    deps = tomllib.load(f).get("project", {}).get("dependencies", [])
name = re.compile(r"^\s*workers[-_.]runtime[-_.]sdk\b", re.IGNORECASE)
pins = [d for d in deps if name.match(d)]
exact = [m.group(1) for d in pins if (m := re.match(r"^[^=<>!~;]+===?\s*([\w.+!-]+)\s*(;.*)?$", d))]
if len(pins) != 1 or len(exact) != 1:
    sys.exit(f"pyproject.toml: [project] dependencies must pin workers-runtime-sdk exactly once with ==, found {pins}")
print(exact[0])
PY
)
if [ "${1:-}" = --pin ]; then
  echo "$SDK_VERSION"
  exit 0
fi
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
