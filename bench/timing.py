"""Timing helpers shared by the scripts that time single calls side by side (torch_vs_cpp, small_calls,
bench_load): calls alternated so that a load change on a shared machine hits every side alike, and the
thread count every library gets."""
from __future__ import annotations

import time

import numpy as np
import torch


def alternate(fns: list, seconds: float, min_rounds: int = 5) -> list[np.ndarray]:
    """Single calls of every function in turn for about ``seconds`` (at least ``min_rounds`` rounds, after one
    warm-up call each): per function, wall p20 / p50 / p80 in microseconds."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(times[0]) < min_rounds:
        for fn, out in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return [np.percentile(np.array(t) * 1e6, [20, 50, 80]) for t in times]


def fmt(p) -> str:
    """p20 / p50 / p80 in microseconds as a cell; ``-`` for none."""
    return "-" if p is None else " / ".join(f"{v:,.0f}" if v >= 100 else f"{v:.1f}" for v in p)


def optional(name: str):
    """The module ``name``, or None when it is not installed."""
    try:
        return __import__(name)
    except ImportError:
        return None


def set_threads(threads: int) -> None:
    """``threads`` for torch (and so our C++ kernels), faiss, OpenCV and numpy's BLAS (through threadpoolctl,
    scikit-learn's dependency), each when installed."""
    torch.set_num_threads(threads)
    faiss, cv2, threadpoolctl = optional("faiss"), optional("cv2"), optional("threadpoolctl")
    if faiss is not None:
        faiss.omp_set_num_threads(threads)
    if cv2 is not None:
        cv2.setNumThreads(threads)
    if threadpoolctl is not None:
        threadpoolctl.threadpool_limits(threads, user_api="blas")
