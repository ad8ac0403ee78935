"""Where the benchmark suites put their tensors: ``STREAMMEM_BENCH_DEVICE`` (``cpu`` or ``cuda``).

``bench/run.py --gpu`` (called by ``bench/gpu.sh``) sets ``STREAMMEM_BENCH_DEVICE=cuda``.
Each suite then adds GPU cases next to its CPU ones: our kernels on CUDA tensors
(``auto``, ``triton`` and, for motion, ``cuda``) and the GPU peers that exist
(torch on CUDA, faiss GPU when the installed faiss has GPU support).  GPU cases
are only parametrised in a GPU run; without a usable GPU each of them skips with
the reason, so ``STREAMMEM_BENCH_DEVICE=cuda`` on a CPU machine is harmless.

GPU timings synchronise the device after every call (``synced``): a CUDA launch
returns before the kernel ends, and timing the launch alone would flatter
everyone.
"""
from __future__ import annotations

import os

import pytest
import torch

DEVICE = os.environ.get("STREAMMEM_BENCH_DEVICE", "cpu").strip().lower() or "cpu"
if DEVICE not in ("cpu", "cuda"):
    raise ValueError(f"STREAMMEM_BENCH_DEVICE must be 'cpu' or 'cuda', got {DEVICE!r}")
GPU_RUN = DEVICE == "cuda"


def gpu_unavailable() -> str | None:
    """Why GPU cases cannot run here (None when they can)."""
    if not torch.cuda.is_available():
        return (f"STREAMMEM_BENCH_DEVICE=cuda but torch {torch.__version__} sees no CUDA device "
                "(CPU build or no GPU)")
    return None


def require_gpu() -> torch.device:
    """The CUDA device for a GPU case, or a skip that says why there is none."""
    why = gpu_unavailable()
    if why:
        pytest.skip(why)
    return torch.device("cuda")


def gpu_params(*values):
    """``values`` in a GPU run; in a CPU run a single skipped case whose reason says how to run them."""
    if GPU_RUN:
        return list(values)
    return [pytest.param(None, id="gpu-cases", marks=pytest.mark.skip(
        reason="GPU cases run only with STREAMMEM_BENCH_DEVICE=cuda (bench/gpu.sh, bench/run.py --gpu)"))]


def synced(fn, device):
    """``fn`` followed by a device synchronisation when ``device`` is a GPU."""
    if torch.device(device).type != "cuda":
        return fn

    def call(*args, **kwargs):
        out = fn(*args, **kwargs)
        torch.cuda.synchronize()
        return out

    return call


def faiss_gpu_resources():
    """``faiss.StandardGpuResources()`` when the installed faiss has GPU support and sees a GPU, else None."""
    try:
        import faiss
    except ImportError:
        return None
    if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() < 1:
        return None
    return faiss.StandardGpuResources()
