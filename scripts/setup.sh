#!/usr/bin/env bash
# One-command, idempotent setup for a fresh Debian 12 machine (as root, or with sudo):
# system packages, uv, the project venv (.venv, from uv.lock), then the self-check table.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)

bash scripts/setup_system.sh

if ! command -v uv >/dev/null 2>&1; then
  echo "[setup] installing uv"
  python3 -m pip install --quiet uv || python3 -m pip install --quiet --break-system-packages uv
fi
UV=$(command -v uv || echo "$HOME/.local/bin/uv")

# The lock pins every version; uv's cache (~/.cache/uv) makes a second clone's setup download nothing.
echo "[setup] syncing .venv from uv.lock (first time: ~3 GB of wheels, a few minutes)"
"$UV" sync --frozen --all-extras --compile-bytecode --python 3.11

if .venv/bin/python scripts/selfcheck.py; then
  touch .venv/.setup-stamp
  echo "[setup] ready in $(( $(date +%s) - t0 )) s"
else
  echo "[setup] the self-check found problems (see the table above)" >&2
  exit 1
fi
