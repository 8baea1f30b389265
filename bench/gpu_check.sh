#!/usr/bin/env bash
# The one-shot GPU check: on a machine with one NVIDIA GPU and no package index, in under 9 minutes, six phases
# (bench/gpu_check.py: env, attention, step, exactness, pretrain, downstream), each time-boxed with `timeout` and
# recorded even when it fails, into $OUT/summary.json (default OUT=runs/gpu_check; each phase's log beside it).
#
#   make gpu-kit                           # where PyPI is reachable: .whl (wheels) and .gpu_data (SST-2)
#   bash bench/gpu_check.sh                # on the GPU machine; carry [".whl", ".gpu_data"] there
#   bash bench/gpu_check.sh --cpu          # every phase at tiny sizes on CPU (CI: test_gpu_check_smoke.py)
#
# Python: $PYTHON, else python3. What it lacks of the kit (.whl/kit.txt) is installed from .whl with --no-index
# --no-deps into $OUT/site (on PYTHONPATH); without a kit it stops in seconds, naming what is missing. Nothing is
# downloaded: the Hugging Face libraries run offline, tracking is off.
set -uo pipefail
START=$SECONDS
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
CPU=""
if [ "${1:-}" = "--cpu" ]; then CPU=--cpu; shift; fi
OUT=${OUT:-$ROOT/runs/gpu_check}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
exec > >(tee "$OUT/gpu_check.log") 2>&1
WHEELS=${WHEELS:-$ROOT/.whl}
SITE=${SITE:-$OUT/site}
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-$([ -n "$CPU" ] && echo 1100 || echo 530)}  # the whole check, install included (GPU: < 9 min)
export GPU_DATA=${GPU_DATA:-$ROOT/.gpu_data}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
[ -n "$CPU" ] && export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
MODULES="torch transformers sentencepiece pyarrow numpy deepspeed datasets torchdata omegaconf tenacity zstandard accelerate"

echo "== gpu_check $(date -u +%FT%TZ) in $ROOT, python $(command -v "$PY")${CPU:+ (CPU: tiny sizes)}"
missing() {  # the modules of $MODULES that $PY cannot import
  # shellcheck disable=SC2086  # $MODULES is a list of names: split on purpose
  "$PY" - $MODULES <<'PYEOF'
import importlib.util, sys
print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))
PYEOF
}
MISSING=$(missing)
if [ -n "$MISSING" ]; then
  if [ ! -f "$WHEELS/kit.txt" ]; then
    echo "gpu_check: $PY lacks $MISSING and there is no kit ($WHEELS/kit.txt): run \`make gpu-kit\` where PyPI is" \
         "reachable and carry [\".whl\", \".gpu_data\"] to this machine"
    exit 2
  fi
  # the kit's requirements whose distribution this python lacks (what it has, it keeps)
  REQS=$("$PY" - "$WHEELS/kit.txt" <<'PYEOF'
import sys
from importlib.metadata import PackageNotFoundError, version
for line in open(sys.argv[1]):
    req = line.strip()
    try:
        version(req.split("==")[0]) if req else None
    except PackageNotFoundError:
        print(req)
PYEOF
)
  echo "== installing $(echo "$REQS" | grep -c .) of the kit's $(grep -c . "$WHEELS/kit.txt") requirements into $SITE (no index)"
  # shellcheck disable=SC2086
  if ! DS_BUILD_OPS=0 timeout 120 "$PY" -m pip install -q --no-index --find-links "$WHEELS" --no-deps --no-compile \
      --upgrade --target "$SITE" $REQS; then
    echo "gpu_check: installing the kit failed: rebuild it for this python ($("$PY" -V)) with make gpu-kit PYVER=..."
    exit 2
  fi
  export PYTHONPATH=$PYTHONPATH:$SITE
  MISSING=$(missing)
  [ -z "$MISSING" ] || { echo "gpu_check: still missing after the kit: $MISSING (carry them as wheels in .whl)"; exit 2; }
fi
if [ -z "$CPU" ] && ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_check: torch sees no CUDA device (run with --cpu for the CPU rehearsal)"
  exit 2
fi
echo "== ready after $((SECONDS - START)) s"

: > "$OUT/phases.tsv"
run_phase() {  # run_phase NAME LIMIT_S: one phase under `timeout`, recorded whatever its end
  local name=$1 limit=$2 t0=$SECONDS left rc
  left=$(( BUDGET_S - (SECONDS - START) - 10 ))  # 10 s kept for the summary
  [ "$limit" -le "$left" ] || limit=$left
  [ "$limit" -ge 5 ] || limit=5
  timeout -k 10 "$limit" "$PY" "$ROOT/bench/gpu_check.py" "$name" --out "$OUT" $CPU > "$OUT/$name.log" 2>&1
  rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "$limit" >> "$OUT/phases.tsv"
  echo "== $name: exit $rc after $((SECONDS - t0)) s (limit $limit s)"
  tail -n 4 "$OUT/$name.log" | cut -c1-400
}
if [ -n "$CPU" ]; then
  for phase in env attention step exactness pretrain downstream; do run_phase "$phase" 400; done
else
  run_phase env 25
  run_phase attention 40
  run_phase step 120
  run_phase exactness 30
  run_phase pretrain 175  # its training: 140 s, SIGTERM at 70 s
  run_phase downstream 130
fi
"$PY" "$ROOT/bench/gpu_check.py" summary --out "$OUT"
rc=$?
echo "== gpu_check done in $((SECONDS - START)) s; $OUT/summary.json"
exit $rc
