#!/usr/bin/env bash
# GPU check for albert_dist: ALBERT-base bf16 pretraining steps with DeepSpeed ZeRO-2 at sequence length 128
# and 512 on the bundled WikiText-2 sample, on one NVIDIA GPU, in under 8 minutes. Prints tokens/s, MFU
# against the device's dense bf16 peak, peak memory, and the model-step ratio ours / transformers on the GPU
# (details: bench/gpu_step.py). Writes gpu_check.log and gpu_check.json to $OUT (default runs/gpu_check).
#
#   bash bench/gpu_check.sh
#
# Python: the first of $PYTHON, .venv/bin/python, python3, python whose torch sees a CUDA device. Missing
# packages (deepspeed, transformers, sentencepiece, torchdata, omegaconf, datasets, ...) are installed into
# .venv-gpu (a venv with --system-site-packages over that python, so its CUDA torch is reused): offline from
# a wheel folder when one exists ($WHEELS, default ./.whl), else from the package index. Without any CUDA
# torch it installs $TORCH_SPEC (default: torch from the CUDA 12.8 index) the same way. To prepare a wheel
# folder for an offline machine (same Python version and platform):
#   pip download -d .whl deepspeed transformers sentencepiece torchdata omegaconf "datasets>=3" pyarrow \
#       zstandard psutil tqdm numpy            # plus the CUDA torch wheel if the machine has none
#   pip wheel --no-deps --no-build-isolation -w .whl deepspeed   # deepspeed ships as an sdist
# albert_dist itself is used from this checkout (PYTHONPATH), so no build step is needed.
set -euo pipefail
START=$SECONDS
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/runs/gpu_check}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
WHEELS=${WHEELS:-$ROOT/.whl}
TORCH_SPEC=${TORCH_SPEC:-"torch --index-url https://download.pytorch.org/whl/cu128"}
BUDGET_S=${BUDGET_S:-470}  # whole script, seconds: installs + the measurement stay under 8 minutes
REQUIRED="deepspeed transformers sentencepiece torchdata omegaconf datasets pyarrow zstandard psutil tqdm numpy"

echo "== gpu_check $(date -u +%FT%TZ) in $ROOT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "(nvidia-smi unavailable)"

has_cuda_torch() { "$1" -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; }
pip_install() {  # pip_install PYTHON ARGS...: offline from $WHEELS when it exists, else the index
  local py=$1; shift
  if [ -d "$WHEELS" ]; then
    timeout 180 "$py" -m pip install -q --no-index --find-links "$WHEELS" "$@"
  else
    timeout 180 "$py" -m pip install -q "$@"
  fi
}

PY=""
for cand in "${PYTHON:-}" "$ROOT/.venv/bin/python" "$ROOT/.venv-gpu/bin/python" python3 python; do
  [ -n "$cand" ] && command -v "$cand" >/dev/null 2>&1 || continue
  if has_cuda_torch "$cand"; then PY=$(command -v "$cand"); break; fi
done
if [ -z "$PY" ]; then
  BASE_PY=$(command -v "${PYTHON:-python3}")
  echo "== no python with a CUDA torch found; installing one into .venv-gpu from $BASE_PY"
  [ -x "$ROOT/.venv-gpu/bin/python" ] || "$BASE_PY" -m venv --system-site-packages "$ROOT/.venv-gpu"
  PY=$ROOT/.venv-gpu/bin/python
  # shellcheck disable=SC2086
  pip_install "$PY" $TORCH_SPEC
  has_cuda_torch "$PY" || { echo "gpu_check: torch in $PY sees no CUDA device"; exit 2; }
fi
echo "== python $PY: $("$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))')"

MISSING=$("$PY" - "$REQUIRED" <<'PYEOF'
import importlib.util, sys
print(" ".join(m for m in sys.argv[1].split() if importlib.util.find_spec(m) is None))
PYEOF
)
if [ -n "$MISSING" ]; then
  echo "== installing missing packages: $MISSING"
  if [ "$PY" != "$ROOT/.venv-gpu/bin/python" ]; then
    [ -x "$ROOT/.venv-gpu/bin/python" ] || "$PY" -m venv --system-site-packages "$ROOT/.venv-gpu"
    PY=$ROOT/.venv-gpu/bin/python
  fi
  # deepspeed builds no ops at install time (DS_BUILD_OPS=0): the check uses torch's AdamW, not fused DS ops.
  # shellcheck disable=SC2086
  DS_BUILD_OPS=0 pip_install "$PY" --no-build-isolation $MISSING
fi
echo "== environment ready after $((SECONDS - START)) s"

export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} TOKENIZERS_PARALLELISM=false
# The measurement gets what the installs left of the budget (at least 120 s), so a hang cannot run on.
STEP_TIMEOUT_S=$(( BUDGET_S - (SECONDS - START) ))
[ "$STEP_TIMEOUT_S" -ge 120 ] || STEP_TIMEOUT_S=120
timeout "$STEP_TIMEOUT_S" "$PY" "$ROOT/bench/gpu_step.py" --out "$OUT/gpu_check.json" "$@"
echo "== gpu_check done in $((SECONDS - START)) s; figures in $OUT/gpu_check.json"
