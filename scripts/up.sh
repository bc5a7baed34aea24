#!/usr/bin/env bash
# README command 1: set up .venv and run the main job, `capstan up`: a local controller and a
# broker group of a master and a slave on ./capstan-data (access point: the controller,
# gRPC 127.0.0.1:9876; metrics from :9100) until Ctrl-C. Extra arguments go to `capstan up` (e.g. --port 18081
# --controller-port 19876 --data-dir /tmp/capstan).
set -euo pipefail
cd "$(dirname "$0")/.."
# The repo root holds a folder named `operator`; never let the current directory onto
# sys.path, or it would shadow the standard library's `operator` module.
export PYTHONSAFEPATH=1
bash scripts/setup.sh
exec .venv/bin/capstan up "$@"
