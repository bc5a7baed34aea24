#!/usr/bin/env bash
# Static checks: ruff (lint + format), mypy (strict), import-linter (the layers in pyproject.toml).
# mypy and import-linter cannot follow setuptools' editable finder for the package-dir
# mapping, so they run on a tree of symlinks that lays out the `capstan` namespace.
set -euo pipefail
cd "$(dirname "$0")/.."
# The repo root holds a folder named `operator`; never let the current directory onto
# sys.path, or it would shadow the standard library's `operator` module.
export PYTHONSAFEPATH=1
repo=$PWD
echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== generated stubs"
bash scripts/gen_protos.sh --check
echo "== generated dashboards"
.venv/bin/python scripts/gen_dashboards.py --check
tree=build/namespace
rm -rf "$tree" && mkdir -p "$tree/capstan"
for entry in capstan/*; do ln -s "$repo/$entry" "$tree/capstan/"; done
for pkg in broker controller operator client spark bench; do ln -s "$repo/$pkg" "$tree/capstan/$pkg"; done
cd "$tree"
echo "== mypy (strict)"
"$repo/.venv/bin/mypy" --config-file "$repo/pyproject.toml" capstan
echo "== import layers"
PYTHONPATH=$PWD "$repo/.venv/bin/lint-imports" --config "$repo/pyproject.toml" --no-cache
