#!/usr/bin/env bash
# Create .venv in the repository root and install Capstan (editable) with its test tools and
# PySpark (about 500 MB; a minute or two the first time).
# Works on a fresh Debian 12 with Python 3.11: installs python3-venv first if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
# The repo root holds a folder named `operator`; never let the current directory onto
# sys.path, or it would shadow the standard library's `operator` module.
export PYTHONSAFEPATH=1
PYTHON=${PYTHON:-python3}

if ! "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then
    echo "Capstan needs Python 3.11 or newer as '$PYTHON'" >&2
    exit 1
fi
if [ ! -x .venv/bin/python ]; then
    if ! "$PYTHON" -m venv .venv 2>/dev/null; then
        rm -rf .venv
        echo "python venv module missing; installing python3-venv with apt" >&2
        SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
        $SUDO apt-get update -qq && $SUDO apt-get install -y -qq python3-venv >/dev/null
        "$PYTHON" -m venv .venv
    fi
fi
stamp=.venv/.capstan-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e '.[test,spark]'
    touch "$stamp"
fi
