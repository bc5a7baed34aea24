#!/usr/bin/env bash
# Regenerate the capstan.v1 Python stubs from proto/ (into capstan/v1/).
# `scripts/gen_protos.sh --check` regenerates into a temp dir and fails if the committed
# stubs differ, so CI catches a .proto edited without regenerating.
set -euo pipefail
export PYTHONSAFEPATH=1
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
out=.
if [[ "${1:-}" == "--check" ]]; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
mkdir -p "$out/capstan/v1"
"$PY" -m grpc_tools.protoc -I proto \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  proto/capstan/v1/*.proto
if [[ "${1:-}" == "--check" ]]; then
  for f in "$out"/capstan/v1/*_pb2*.py*; do
    if ! cmp -s "$f" "capstan/v1/$(basename "$f")"; then
      echo "capstan/v1/$(basename "$f") is stale: run scripts/gen_protos.sh" >&2
      exit 1
    fi
  done
  echo "capstan.v1 stubs are up to date"
fi
