#!/usr/bin/env bash
# Shared by scripts/test and scripts/demo: create .venv if missing and install pinned versions.
# Idempotent: a stamp file records the hash of what was installed, so a second run is instant.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    echo "[rubberband] creating .venv"
    "$py" -m venv .venv
fi
stamp=.venv/.rubberband-installed
want="$(cat requirements/pinned.txt pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "[rubberband] installing pinned dependencies (torch==2.13.0 CPU first)"
    log=.venv/install.log
    {
        # torch first and exactly 2.13.0: a bare `torch` would pull a multi-GB CUDA build.
        .venv/bin/python -m pip install "torch==2.13.0" &&
        .venv/bin/python -m pip install -r requirements/pinned.txt &&
        # the optional `optuna` extra (search: optuna), small and quick: its tests run in CI
        .venv/bin/python -m pip install "optuna==5.0.0" &&
        .venv/bin/python -m pip install --no-deps -e .
    } > "$log" 2>&1 || { tail -40 "$log"; echo "[rubberband] install failed; full log in $log" >&2; exit 1; }
    echo "$want" > "$stamp"
fi
export RAY_USAGE_STATS_ENABLED=0
