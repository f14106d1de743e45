#!/usr/bin/env bash
# Installs what Flarebox needs on a fresh Debian/Ubuntu machine: system packages, a virtualenv, and (for `dev`)
# the test and Cloudflare tooling. Idempotent: fast when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-runtime}

need_apt=()
for bin in bwrap:bubblewrap zstd:zstd curl:curl tar:tar slirp4netns:slirp4netns; do
  command -v "${bin%%:*}" >/dev/null 2>&1 || need_apt+=("${bin##*:}")
done
# libseccomp.so.2 for the sandboxes' seccomp filter (a substitution, not a pipe: grep -q + pipefail would misfire)
[[ "$(PATH="$PATH:/usr/sbin:/sbin" ldconfig -p 2>/dev/null || true)" == *libseccomp.so.2* ]] || need_apt+=(libseccomp2)
# the web console's terminal widget (package.json "dependencies", served by src/standalone/console.py)
widget=node_modules/@xterm/xterm/lib/xterm.js
if [ "$mode" = dev ]; then
  command -v node >/dev/null 2>&1 || need_apt+=(nodejs npm)
  command -v tmux >/dev/null 2>&1 || need_apt+=(tmux)  # the CLI tests drive a real terminal (Ctrl-C, progress)
  command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)  # the web console's tests drive a headless browser
elif [ ! -f "$widget" ]; then
  command -v npm >/dev/null 2>&1 || need_apt+=(nodejs npm)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing ${need_apt[*]} with apt-get" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "setup: Python 3.11+ is required" >&2; exit 1; }
  "$python" -m venv .venv
fi
extra=standalone; [ "$mode" = dev ] && extra=dev
stamp=.venv/.flarebox-$extra
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -e ".[$extra]"
  touch "$stamp"
fi
# Every sandbox runs the supervisor with -B (it cannot write next to its read-only sources), so without these it
# would compile them from source at every start (~40 ms and 2 MB each); stale ones are recompiled, never trusted.
.venv/bin/python -m compileall -q container/supervisor src/protocol >/dev/null
if [ "$mode" != dev ] && [ -f package.json ] && [ ! -f "$widget" ]; then
  omit=(--omit=dev --omit=optional)  # the runtime needs the widget alone...
  [ -d node_modules/wrangler ] && omit=()  # ...but a dev checkout keeps its Cloudflare tooling
  # a failure does not stop the server: the console then says in its terminal panel how to get the widget
  npm ci "${omit[@]}" --no-audit --no-fund --loglevel=error ||
    echo "setup: npm ci failed: the web console runs without its terminal until scripts/setup.sh succeeds" >&2
fi
if [ "$mode" = dev ] && [ -f package.json ]; then
  if [ ! -d node_modules ] || [ package-lock.json -nt node_modules ]; then
    npm ci --no-audit --no-fund --loglevel=error
  fi
  # The Python Workers SDK the Worker bundle and the Cloudflare tests import (idempotent).
  scripts/vendor_workers_sdk.sh
fi
