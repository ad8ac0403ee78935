"""Killing a writer at random instants: the harness of the checkpoint kill tests.

``kill_writer(write, check, kills)`` forks a child (torch is already imported, so a fork costs
milliseconds, not the seconds of a fresh interpreter; the child runs on one thread) that calls ``write(i)`` for i = 1, 2, ...
until it is killed with SIGKILL after a random delay; this repeats ``kills`` times and after each
kill ``check()`` runs in the parent, which must find a whole state (the old or a new one).
"""
from __future__ import annotations

import os
import random
import signal
import time

import torch


def kill_writer(write, check, *, kills: int = 24, max_delay: float = 0.2, seed: int = 0) -> list:
    """Returns what ``check()`` returned after each kill."""
    rng = random.Random(seed)
    results = []
    for k in range(kills):
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: announce, then write until killed
            os.close(read_end)
            try:
                # The parent's OpenMP pool does not survive a fork: a parallel region would wait on
                # threads the child does not have.
                torch.set_num_threads(1)
                os.write(write_end, b"r")
                i = k * 1_000_000
                while True:
                    i += 1
                    write(i)
            finally:
                os._exit(1)
        os.close(write_end)
        os.read(read_end, 1)
        os.close(read_end)
        time.sleep(rng.uniform(0.0, max_delay))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        results.append(check())
    return results
