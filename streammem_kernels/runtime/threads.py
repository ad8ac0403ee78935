"""How the OpenMP threads of the native kernels (and of torch, which shares their libgomp) wait.

A thread that finishes its share of a parallel region waits for the others at the barrier, and an
idle worker waits for the next region.  libgomp's default is to spin first (about 300,000
iterations) and sleep after: on an idle machine that saves a wake-up, on a machine whose cores run
other work (a model server, other jobs) the spinning thread takes its core from them and every
region then waits for the scheduler to run its slowest thread.  A batched top-k (Q = 64, N = 10^4,
2 threads, load average 19 on 2 cores) took 312 ms spinning and 11 ms waiting passively
(docs/performance.md).

Imported by the package before anything imports torch: when torch is not loaded yet and the
environment does not choose a policy, ``OMP_WAIT_POLICY=PASSIVE`` is set, which libgomp reads once,
when torch loads it.  A process that imports torch first, or sets the variable, keeps its choice.
Imports nothing (torch must not be loaded by this module).
"""
from __future__ import annotations

import os
import sys

__all__ = ["WAIT_POLICY", "prefer_passive_wait"]

WAIT_POLICY = "PASSIVE"


def prefer_passive_wait() -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` unless torch is loaded or the variable is set; True if it is now passive."""
    if "torch" not in sys.modules:
        os.environ.setdefault("OMP_WAIT_POLICY", WAIT_POLICY)
    return os.environ.get("OMP_WAIT_POLICY", "").upper() == WAIT_POLICY


prefer_passive_wait()
