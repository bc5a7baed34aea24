#!/usr/bin/env bash
# README command 1: set up and run the main job. Until `capstan up` exists (the broker's
# issue), the main job is the store benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
# The repo root holds a folder named `operator`; never let the current directory onto
# sys.path, or it would shadow the standard library's `operator` module.
export PYTHONSAFEPATH=1
bash scripts/setup.sh
exec .venv/bin/capstan bench store "$@"
