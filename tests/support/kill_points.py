"""Killing a writer at random instants: the harness of the checkpoint kill tests.

``kill_writer(module_file, function, args, check, kills)`` starts one helper interpreter that
imports ``function`` from ``module_file`` (a test module) once (and calls ``setup(*args)`` once,
when given: build the object that every child then changes and saves); for each kill the helper
forks a child that calls ``function(*args, i)`` for i = first + 1, first + 2, ... (``first`` is
``kill * 1_000_000``, so steps of later kills are larger) until the test kills it with SIGKILL
after a random delay, and ``check()`` then runs in the test, which must find a whole state (the
old or a new one).  The helper runs no threads (torch's pool is never started there, OpenMP runs
one thread), so its forks are safe, and a child costs milliseconds where a fresh interpreter costs
seconds.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

_HELPER = r"""
import importlib.util, json, os, sys, tempfile
import torch
torch.set_num_threads(1)
# One save before any fork: the lazy imports of a first save cost a child more than its kill delay.
from streammem_kernels import checkpoint
with tempfile.TemporaryDirectory() as scratch:
    checkpoint.save(os.path.join(scratch, "warm"), "Warmup", {"x": torch.zeros(1)})
    checkpoint.load(os.path.join(scratch, "warm"), "Warmup")
spec = importlib.util.spec_from_file_location("_kill_target", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
write, args = getattr(module, sys.argv[2]), json.loads(sys.argv[3])
if sys.argv[4]:
    getattr(module, sys.argv[4])(*args)
print("ready", flush=True)
for line in sys.stdin:
    first = int(line)
    pid = os.fork()
    if pid == 0:
        i = first
        try:
            while True:
                i += 1
                write(*args, i)
        finally:
            os._exit(1)
    print(pid, flush=True)
    os.waitpid(pid, 0)
    print("reaped", flush=True)
"""


def kill_writer(module_file: str, function: str, args: list, check, *, kills: int = 24, max_delay: float = 0.2,
                seed: int = 0, setup: str | None = None) -> list:
    """Returns what ``check()`` returned after each kill."""
    rng = random.Random(seed)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), OMP_NUM_THREADS="1")
    helper = subprocess.Popen([sys.executable, "-c", _HELPER, module_file, function, json.dumps(args), setup or ""],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
    try:
        if helper.stdout.readline().strip() != "ready":
            raise RuntimeError("the writer helper did not start")
        results = []
        for k in range(kills):
            helper.stdin.write(f"{k * 1_000_000}\n")
            helper.stdin.flush()
            pid = int(helper.stdout.readline())
            time.sleep(rng.uniform(0.0, max_delay))
            os.kill(pid, signal.SIGKILL)
            if helper.stdout.readline().strip() != "reaped":
                raise RuntimeError("the writer helper lost its child")
            results.append(check())
        return results
    finally:
        helper.kill()
        helper.wait()
