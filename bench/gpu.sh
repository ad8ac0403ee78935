#!/usr/bin/env bash
# The GPU run.
#
#   bash bench/gpu.sh            # the one-shot budget run (bench/gpu_oneshot.py): offline, at most 8 minutes,
#                                # results in $OUT (bench/results/gpu/ when $OUT is unset); docs/testing.md
#   bash bench/gpu.sh --full [run.py arguments]
#                                # the whole suite on the GPU, then every benchmark suite's GPU cases
#                                # (bench/run.py --gpu --save-baseline: the record gains a GPU section): needs make,
#                                # a venv and a package index; tens of minutes
#
# The one-shot run uses $PYTHON (default python3) as it is: it must import a CUDA build of
# torch.  It never calls make, pip against an index or venv: the checkout goes on the path
# here, and the only installs are the wheels carried in .gpu-carry/ (`make gpu-carry`).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)

if [[ "${1:-}" != "--full" ]]; then
    PY=${PYTHON:-python3}
    if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.version.cuda else 1)' >/dev/null 2>&1; then
        echo "bench/gpu.sh: $PY does not import a CUDA build of torch; the one-shot run uses the GPU machine's" \
             "own Python (set PYTHON=... to pick another). Nothing run."
        exit 2
    fi
    export PYTHONPATH="$ROOT:$ROOT/python:$ROOT/build/gpu-oneshot/site${PYTHONPATH:+:$PYTHONPATH}"
    exec "$PY" bench/gpu_oneshot.py "$@"
fi
shift

# --full: the whole suite with STREAMMEM_REQUIRE_GPU=1 (every "cuda" case of the device
# parametrisation must run: a case that cannot run fails instead of skipping), then the
# benchmark suites with STREAMMEM_BENCH_DEVICE=cuda; results in bench/results/gpu-<gpu
# name>-<mode>-<date>.json, merged by bench/report.py next to the CPU run.
run_args=("$@")

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi --query-gpu=name --format=csv,noheader >/dev/null 2>&1; then
    echo "bench/gpu.sh: no NVIDIA GPU found (nvidia-smi missing or failing); nothing to do."
    exit 0
fi

PY=.venv/bin/python
if [[ ! -x "$PY" ]]; then
    # make's venv recipe installs a CUDA torch on a CUDA machine only if none is importable
    # system-wide; the venv sees system site-packages, so a preinstalled CUDA torch is reused.
    echo "bench/gpu.sh: creating .venv through make build"
    make build
fi

if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.version.cuda and torch.cuda.is_available() else 1)"; then
    echo "bench/gpu.sh: the torch in .venv ($("$PY" -c 'import torch; print(torch.__version__)')) is not a CUDA build" \
         "or sees no GPU; install a CUDA torch into .venv and rerun. Nothing to do."
    exit 0
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

echo "bench/gpu.sh: building the native modules (CPU and CUDA)"
"$PY" setup.py -q build_ext --inplace -j "$(nproc)"

echo "bench/gpu.sh: kernel tests on the GPU (compiled Triton, CUDA kernels)"
tests_status=0
env -u TRITON_INTERPRET STREAMMEM_REQUIRE_CPP=1 STREAMMEM_REQUIRE_GPU=1 \
    "$PY" -m pytest -q -p no:cacheprovider -rs tests || tests_status=$?
if [[ $tests_status -ne 0 ]]; then
    echo "bench/gpu.sh: kernel tests FAILED on the GPU (exit $tests_status); benchmarking anyway, read the failures above"
fi

echo "bench/gpu.sh: benchmark suites with STREAMMEM_BENCH_DEVICE=cuda"
bench_status=0
"$PY" -m bench.run --gpu --save-baseline ${run_args[@]+"${run_args[@]}"} || bench_status=$?

echo "bench/gpu.sh: done (tests exit code $tests_status, benchmarks exit code $bench_status); results in" \
     "bench/results/, baseline in bench/baseline/, record in bench/RESULTS.md"
[[ $tests_status -eq 0 && $bench_status -eq 0 ]]
