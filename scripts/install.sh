#!/usr/bin/env bash
# Install marl-orchestra into ./.venv from nothing: CPU torch first (a bare torch pulls CUDA), then the package.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[dev,llm,docs]"
echo "installed: $(.venv/bin/python -c 'import torch, ray, langgraph; print("torch", torch.__version__, "ray", ray.__version__)')"
