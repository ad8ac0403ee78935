"""One torch / OpenMP thread per CPU a worker was given, in every thread that runs kernels.

What we found (torch 2.13 CPU wheel, this package's C++ modules linked with
``-fopenmp``): torch ships ``libgomp.so.1`` and our modules link
``libgomp.so.1`` by the same soname, so a process that imports torch first
(``streammem_kernels`` always does) has exactly one OpenMP runtime, shared by
torch and our kernels (faiss-cpu wheels bring their own, separate one).  Our
kernels size their parallel regions with ``omp_get_max_threads()``, which is a
*per-thread* setting in libgomp:

* ``OMP_NUM_THREADS`` at process start sets it for every thread (Ray sets it
  to the task's ``num_cpus`` in its workers unless it is already set);
* ``torch.set_num_threads(n)`` sets torch's own pool for every thread, but
  libgomp's value only for the *calling* thread: a kernel called from another
  thread (a pipeline thread, a Ray threaded actor's concurrency group) still
  uses the process default.

So ``configure_threads`` sets all three (torch, this thread's OpenMP value, and
the environment for child processes), and workers call it once per thread
that runs kernels (``ShardMemory`` does so on each of its methods' threads).
"""
from __future__ import annotations

import ctypes
import os
import threading

import torch

__all__ = ["configure_threads", "thread_settings"]

_local = threading.local()


def _libgomp():
    try:
        return ctypes.CDLL("libgomp.so.1")  # the runtime already loaded by torch (same soname)
    except OSError:
        return None


def configure_threads(num_threads: int, *, environment: bool = True) -> None:
    """torch intra-op threads, this thread's OpenMP threads and (``environment``) ``OMP_NUM_THREADS``.

    Setting the environment variable only matters for processes started
    afterwards (libgomp reads it once, at load).
    """
    if isinstance(num_threads, bool) or int(num_threads) != num_threads or num_threads < 1:
        raise ValueError(f"num_threads must be an int >= 1, got {num_threads!r}")
    n = int(num_threads)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    if environment:
        os.environ["OMP_NUM_THREADS"] = str(n)
    gomp = _libgomp()
    if gomp is not None:
        gomp.omp_set_num_threads(n)
    _local.threads = n


def ensure_thread(num_threads: int) -> None:
    """``configure_threads`` (environment untouched) once per calling thread (cheap on later calls)."""
    if getattr(_local, "threads", None) != num_threads:
        configure_threads(num_threads, environment=False)


def thread_settings() -> dict:
    """What the calling thread would use: torch threads, OpenMP max threads, ``OMP_NUM_THREADS``."""
    gomp = _libgomp()
    return {"torch_threads": torch.get_num_threads(),
            "omp_max_threads": None if gomp is None else int(gomp.omp_get_max_threads()),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "thread": threading.current_thread().name}
