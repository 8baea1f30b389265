#!/usr/bin/env bash
# GPU check for albert_dist, one command, under 8 minutes from a bare machine: ALBERT-base bf16 pretraining steps
# with DeepSpeed ZeRO-2 at sequence length 128 and 512 on the bundled WikiText-2 sample, on one NVIDIA GPU, eager
# and compiled (engine.compile_scope block and model), static and dynamic MLM gather; tokens/s, MFU against the
# device's dense bf16 peak, peak memory, host syncs (torch.cuda.set_sync_debug_mode), the compile time, and
# transformers' model in the same run (details: bench/gpu_step.py). Writes gpu_check.log and gpu_check.json to
# $OUT (default runs/gpu_check).
#
#   bash bench/gpu_check.sh [gpu_step.py options]      # on the GPU machine
#   bash bench/gpu_check.sh --cpu                      # CPU smoke run of the same code paths (no GPU needed)
#
# Python: the first of $PYTHON, python3, python, .venv/bin/python, .venv-gpu/bin/python whose torch sees a CUDA
# device. Missing packages, in this order:
#   1. wheels in $WHEELS (default ./.whl, git-ignored) are installed with --no-index --no-deps into a folder on
#      PYTHONPATH ($SITE, default /tmp/albert_dist_site): the way to a machine without a package index.
#      `bash bench/gpu_wheels.sh` fills .whl for the device image of this workplace (CPython 3.12, CUDA torch,
#      no deepspeed, datasets, torchdata, omegaconf, zstandard); the device tool carries it (carry: [".whl"]).
#   2. otherwise what is still missing is installed from the package index into .venv-gpu (a venv with
#      --system-site-packages over that python, so its CUDA torch is reused); without any CUDA torch it installs
#      $TORCH_SPEC (default: torch from the CUDA 12.8 index) there first.
# albert_dist itself is used from this checkout (PYTHONPATH), so no build step is needed.
set -euo pipefail
START=$SECONDS
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
CPU_SMOKE=0
if [ "${1:-}" = "--cpu" ]; then CPU_SMOKE=1; shift; fi
OUT=${OUT:-$ROOT/runs/gpu_check}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
WHEELS=${WHEELS:-$ROOT/.whl}
SITE=${SITE:-/tmp/albert_dist_site}
TORCH_SPEC=${TORCH_SPEC:-"torch --index-url https://download.pytorch.org/whl/cu128"}
BUDGET_S=${BUDGET_S:-470}  # whole script, seconds: installs + the measurement stay under 8 minutes
REQUIRED="deepspeed transformers sentencepiece torchdata omegaconf datasets pyarrow zstandard psutil tqdm numpy"

echo "== gpu_check $(date -u +%FT%TZ) in $ROOT$([ $CPU_SMOKE = 1 ] && echo ' (CPU smoke run)')"
if [ $CPU_SMOKE = 1 ]; then
  # The same script and code paths on CPU with a tiny model, two steps and the "eager" compile backend (dynamo
  # traces, nothing is generated): checks the check, measures nothing.
  PY=${PYTHON:-$ROOT/.venv/bin/python}
  export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
  timeout "$BUDGET_S" "$PY" "$ROOT/bench/gpu_step.py" --device cpu --model albert-tiny --seqs 64 --steps 2 \
    --warmup 1 --micro-batch 4 --compile-backend eager --out "$OUT/gpu_check.json" "$@"
  echo "== gpu_check (CPU smoke) done in $((SECONDS - START)) s; figures in $OUT/gpu_check.json"
  exit 0
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "(nvidia-smi unavailable)"

has_cuda_torch() { "$1" -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; }
missing() {  # missing PYTHON: the modules of $REQUIRED it cannot import
  "$1" - "$REQUIRED" <<'PYEOF'
import importlib.util, sys
print(" ".join(m for m in sys.argv[1].split() if importlib.util.find_spec(m) is None))
PYEOF
}

PY=""
for cand in "${PYTHON:-}" python3 python "$ROOT/.venv/bin/python" "$ROOT/.venv-gpu/bin/python"; do
  if [ -z "$cand" ] || ! command -v "$cand" >/dev/null 2>&1; then continue; fi
  if has_cuda_torch "$cand"; then PY=$(command -v "$cand"); break; fi
done

if compgen -G "$WHEELS/*.whl" >/dev/null; then
  echo "== installing $(find "$WHEELS" -name '*.whl' | wc -l) wheels from $WHEELS into $SITE (no index, no deps)"
  [ -n "$PY" ] || { echo "gpu_check: no python with a CUDA torch to install the wheels for"; exit 2; }
  # deepspeed builds no ops at install time (DS_BUILD_OPS=0): the check uses torch's AdamW, not fused DS ops.
  DS_BUILD_OPS=0 timeout 180 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$WHEELS"/*.whl
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
fi

pip_install() {  # pip_install PYTHON ARGS...: from the package index, with a time limit
  local py=$1; shift
  timeout 180 "$py" -m pip install -q "$@"
}
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

MISSING=$(missing "$PY")
if [ -n "$MISSING" ]; then
  echo "== still missing: $MISSING; installing from the package index into .venv-gpu"
  if [ "$PY" != "$ROOT/.venv-gpu/bin/python" ]; then
    [ -x "$ROOT/.venv-gpu/bin/python" ] || "$PY" -m venv --system-site-packages "$ROOT/.venv-gpu"
    PY=$ROOT/.venv-gpu/bin/python
  fi
  # shellcheck disable=SC2086
  DS_BUILD_OPS=0 pip_install "$PY" --no-build-isolation $MISSING
fi
echo "== environment ready after $((SECONDS - START)) s"

export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} TOKENIZERS_PARALLELISM=false
# The measurement gets what the installs left of the budget (at least 120 s), so a hang cannot run on; no new
# measurement starts in its last 150 s (gpu_step.py --budget-s lists what it skipped).
STEP_TIMEOUT_S=$(( BUDGET_S - (SECONDS - START) ))
[ "$STEP_TIMEOUT_S" -ge 120 ] || STEP_TIMEOUT_S=120
timeout "$STEP_TIMEOUT_S" "$PY" "$ROOT/bench/gpu_step.py" --budget-s $(( STEP_TIMEOUT_S - 150 )) \
  --out "$OUT/gpu_check.json" "$@"
echo "== gpu_check done in $((SECONDS - START)) s; figures in $OUT/gpu_check.json"
