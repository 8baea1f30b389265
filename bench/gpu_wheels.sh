#!/usr/bin/env bash
# `make gpu-kit`: what bench/gpu_check.sh needs on a machine without a package index, built where pip reaches one.
#   .whl/       wheels for CPython $PYVER (default 3.12, the device image's; several: PYVER="3.12 3.11") on
#               manylinux x86_64, and .whl/kit.txt, the requirements gpu_check.sh installs from them (--no-index)
#   .gpu_data/  GLUE SST-2 (train.tsv, dev.tsv and their README with the licence) for the `downstream` phase
# The kit is what albert_dist's check imports (deepspeed, datasets, torchdata, omegaconf, mlflow-skinny, tenacity,
# zstandard, accelerate for `albert-dist finetune`) with every dependency, less what a Python with torch,
# transformers, sentencepiece, pyarrow and numpy already has and the device image has too (torch's own closure,
# bench/gpu_image_packages.txt): so it completes both that image and a bare venv with only those five. Pins: the versions in $PYTHON's environment (the tested ones) where it has them.
#
#   make gpu-kit [PYVER="3.12 3.11"] [SST2=DIR]   # prints the kit's size; the device tool carries [".whl", ".gpu_data"]
# SST2: a folder with GLUE SST-2's train.tsv and dev.tsv (GLUE's SST-2.zip unpacked, or `albert-dist finetune`'s
# --data-dir layout: <dir>/glue-sst2); default ../shared/corpora/glue-sst2 beside the checkout (this project's
# machines). It is checked first: a clone without it is refused in a second, before any download.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEST=${WHEELS:-$ROOT/.whl}
DATA=${GPU_DATA:-$ROOT/.gpu_data}
PY=${PYTHON:-$ROOT/.venv/bin/python}
PYVERS=${PYVER:-3.12}
SST2=${SST2:-$ROOT/../shared/corpora/glue-sst2}
LIMIT_MIB=48
# deepspeed's own requirements are listed because deepspeed is an sdist (built below, without them)
NEED="deepspeed datasets torchdata omegaconf mlflow-skinny tenacity zstandard accelerate einops hjson msgpack ninja packaging
psutil py-cpuinfo pydantic tqdm"
BASE="torch transformers sentencepiece pyarrow numpy"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
for f in train.tsv dev.tsv; do
  [ -f "$SST2/$f" ] || { echo "gpu kit: no SST-2 at $SST2 ($f missing): set SST2 to a folder with GLUE SST-2's" \
    "train.tsv and dev.tsv (GLUE's SST-2.zip unpacked), e.g. make gpu-kit SST2=/data/glue/SST-2" >&2; exit 2; }
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$DEST" "$DATA"

# name==version of $NEED as installed in $PY's environment (mlflow-skinny follows mlflow), else the bare name
# shellcheck disable=SC2086
PINS=$("$PY" - $NEED <<'PYEOF'
import sys
from importlib.metadata import PackageNotFoundError, version
for name in sys.argv[1:]:
    try:
        print(f"{name}=={version('mlflow' if name == 'mlflow-skinny' else name)}")
    except PackageNotFoundError:
        print(name)
PYEOF
)
: > "$TMP/kit.txt"
for v in $PYVERS; do
  # shellcheck disable=SC2086,SC2046  # $PINS and $BASE are lists of requirements: split on purpose
  "$PY" -m pip install -q --dry-run --ignore-installed --report "$TMP/report-$v.json" --only-binary=:all: \
    --python-version "$v" --implementation cp "${platforms[@]}" --target "$TMP/target" \
    $(echo "$PINS" | grep -v '^deepspeed') $BASE
  # the resolved set less (the closure of $BASE, walked in the report, that the image has too)
  # shellcheck disable=SC2086
  "$PY" - "$TMP/report-$v.json" "$ROOT/bench/gpu_image_packages.txt" "$v" $BASE > "$TMP/kit-$v.txt" <<'PYEOF'
import json, re, sys
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as canon
report, image_file, pyver, base = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
image = {canon(w) for line in open(image_file) if not line.startswith("#") for w in line.split()}
items = {canon(i["metadata"]["name"]): i["metadata"] for i in json.load(open(report))["install"]}
env = dict(default_environment(), python_version=pyver, python_full_version=pyver + ".0", extra="")
def closure(roots):
    seen, todo = set(), [canon(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in seen or name not in items:
            continue
        seen.add(name)
        for spec in items[name].get("requires_dist") or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate(env):
                todo.append(canon(req.name))
    return seen
# torch comes with its own CUDA libraries and triton wherever it is installed (the image's are cu13, these cu12)
present = closure(base) & (image | closure(["torch"]))
for name, meta in sorted(items.items()):
    if name not in present:
        print(f"{name}=={meta['version']}")
PYEOF
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$v" --implementation cp \
    "${platforms[@]}" -d "$DEST" -r "$TMP/kit-$v.txt"
  cat "$TMP/kit-$v.txt" >> "$TMP/kit.txt"
done
# deepspeed is an sdist: a pure-Python wheel built here (no ops compiled: DS_BUILD_OPS=0; the check JIT-builds none)
DS=$(echo "$PINS" | grep '^deepspeed')
if ! compgen -G "$DEST/deepspeed-${DS#deepspeed==}-*.whl" >/dev/null; then
  DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DEST" "$DS"
fi
{ echo "$DS"; sort -u "$TMP/kit.txt"; } > "$DEST/kit.txt"
cp "$SST2/train.tsv" "$SST2/dev.tsv" "$DATA/"
[ ! -f "$SST2/README.md" ] || cp "$SST2/README.md" "$DATA/"  # the licence, where the folder has it
SIZE_MIB=$(du -scm "$DEST" "$DATA" | tail -1 | cut -f1)
echo "gpu kit: $(grep -c . "$DEST/kit.txt") requirements, $(find "$DEST" -name '*.whl' | wc -l) wheels for CPython $PYVERS" \
  "in $DEST, SST-2 in $DATA: $SIZE_MIB MiB (limit $LIMIT_MIB)"
[ "$SIZE_MIB" -le $LIMIT_MIB ] || echo "gpu kit: over the device tool's $LIMIT_MIB MiB (built for CPython $PYVERS: the device needs 3.12 only)" >&2
