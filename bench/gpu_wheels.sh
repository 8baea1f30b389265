#!/usr/bin/env bash
# Fill a wheel folder for bench/gpu_check.sh on a GPU machine that cannot reach a package index: this workplace's
# device image (/work/.library/device/KINDS.md: CPython 3.12, CUDA torch, transformers, sentencepiece, pyarrow,
# numpy, tqdm, psutil... but no deepspeed, datasets, torchdata, omegaconf or zstandard). Run it where pip reaches
# the index; the device tool then carries the folder (carry: [".whl"]) and gpu_check.sh installs it with
# --no-index --no-deps.
#
#   bash bench/gpu_wheels.sh [DIR]        # default ./.whl (git-ignored); prints the folder's size (limit 64 MiB)
#
# The versions are this project's tested ones (a CPU .venv from `make install`). Not carried: mlflow and tenacity
# (the check never tracks; albert_dist imports them only in its tracking code; mlflow's dependency tree alone
# would exceed the device tool's 64 MiB) and python-hostlist (Slurm node lists only).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEST=${1:-$ROOT/.whl}
PY=${PYTHON:-$ROOT/.venv/bin/python}
PYVER=${PYVER:-3.12}
mkdir -p "$DEST"
# What the image lacks, with the dependencies it lacks too (deepspeed: hjson, pydantic and pydantic's own;
# datasets: dill, multiprocess); everything else they need is in the image.
BINARY="datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 torchdata==0.11.0 omegaconf==2.4.0 zstandard==0.25.0
hjson==3.1.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
# shellcheck disable=SC2086
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  "${platforms[@]}" -d "$DEST" $BINARY
# deepspeed is an sdist: a pure-Python wheel built here (no ops compiled: DS_BUILD_OPS=0; it JIT-builds any op
# it needs, and the check needs none).
if ! compgen -G "$DEST/deepspeed-0.19.8-*.whl" >/dev/null; then
  DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DEST" deepspeed==0.19.8
fi
echo "$(find "$DEST" -name '*.whl' | wc -l) wheels in $DEST, $(du -sm "$DEST" | cut -f1) MiB (the device tool carries 64 MiB)"
