#!/usr/bin/env bash
# GPU benchmark run: build the native modules (the CUDA ones need nvcc; a
# prebuilt streammem_kernels/_cuda_*.so from another x86-64 machine also works,
# they do not depend on the Python or torch version), run the kernel tests on
# the GPU (Triton compiled, CUDA kernels; no TRITON_INTERPRET) with
# STREAMMEM_REQUIRE_GPU=1, so every "cuda" case of the device parametrisation
# must run (a case that cannot run fails instead of skipping), then the
# benchmark suites with STREAMMEM_BENCH_DEVICE=cuda.  The results land in
# bench/results/gpu-<gpu name>-<mode>-<date>.json and bench/report.py merges
# them next to the CPU run: into bench/RESULTS.md for a full run, into the
# git-ignored bench/results/quick/RESULTS.md for --quick.
#
#   bash bench/gpu.sh                    # full run
#   bash bench/gpu.sh --quick            # small sizes, few rounds
#   bash bench/gpu.sh --save-baseline    # any further arguments go to bench/run.py
#
# Needs an NVIDIA GPU (nvidia-smi) and a CUDA build of torch.  Without them it
# says so and exits 0, so it is safe to call anywhere.
set -euo pipefail

cd "$(dirname "$0")/.."
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
"$PY" setup.py -q build_ext --inplace

echo "bench/gpu.sh: kernel tests on the GPU (compiled Triton, CUDA kernels)"
tests_status=0
env -u TRITON_INTERPRET STREAMMEM_REQUIRE_CPP=1 STREAMMEM_REQUIRE_GPU=1 \
    "$PY" -m pytest -q -p no:cacheprovider -rs tests || tests_status=$?
if [[ $tests_status -ne 0 ]]; then
    echo "bench/gpu.sh: kernel tests FAILED on the GPU (exit $tests_status); benchmarking anyway, read the failures above"
fi

echo "bench/gpu.sh: benchmark suites with STREAMMEM_BENCH_DEVICE=cuda"
"$PY" bench/run.py --gpu ${run_args[@]+"${run_args[@]}"}

echo "bench/gpu.sh: done (tests exit code $tests_status); results in bench/results/, report in bench/RESULTS.md"
exit "$tests_status"
