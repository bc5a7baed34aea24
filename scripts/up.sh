#!/usr/bin/env bash
# README command 1: set up and run the main job. Until `capstan up` exists (the broker's
# issue), the main job is the store benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/capstan bench store "$@"
