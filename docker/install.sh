#!/usr/bin/env bash
# Install gptforge from this checkout into the active Python, torch first, as given.
# docker/Dockerfile, docker/Dockerfile.cuda and .ci/run all install through this script.
#
#   docker/install.sh TORCH [EXTRAS]
#
#   TORCH   the pip arguments that install torch, e.g.
#             "torch==2.13.0"                                                  (PyPI's build)
#             "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" (CPU-only wheels)
#           or "none" to keep the torch already installed (the PyTorch CUDA image's).
#   EXTRAS  gptforge extras, comma-separated (e.g. "test" or "serve,hf"); default none.
#
# gptforge is installed editable (pip install -e), so the checkout it was installed from is the
# code that runs. The script ends by importing both and printing their versions.
set -euo pipefail
torch_install=${1:?usage: docker/install.sh TORCH [EXTRAS]  (TORCH: pip arguments for torch, or none)}
extras=${2:-}
root=$(cd "$(dirname "$0")/.." && pwd)

python -m pip install -q --upgrade pip
if [ "$torch_install" != none ]; then
  read -r -a torch_args <<< "$torch_install"  # several pip arguments: the spec and an index URL
  python -m pip install -q "${torch_args[@]}"
fi
python -m pip install -q -e "${root}${extras:+[$extras]}"
python - <<'PY'
import torch

import gptforge

cuda = torch.version.cuda or "none"
print(f"installed gptforge {gptforge.__version__} with torch {torch.__version__} (CUDA {cuda})")
PY
