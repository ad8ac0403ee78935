"""Beam (5, 10), Q = 1, on one 10^6-leaf tree per process: the kernel-level A/B of two builds.

bench_latency.py's tree table keeps a plain and a half_scan tree resident side by side (4.1 GB),
which is the fair comparison of the two settings but slows both a little through the shared
caches and TLB.  This builds one tree (the same synthetic hierarchy, seed 4) and times its 200
queries in a loop, so that two builds of the C++ module (which must not share a process) can be
compared in alternating processes:

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.beam_one_tree [--half] [--seconds 12]

To compare two builds, run it from the root of each checkout (``git worktree add`` the other commit,
its modules built in place), alternating.
Prints wall p20 / p50 / p80 in µs per call and the number of calls.
"""
import argparse
import os
import time

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--half", action="store_true", help="CosineTree(half_scan=True)")
ap.add_argument("--seconds", type=float, default=12.0)
args = ap.parse_args()

import numpy as np  # noqa: E402

from bench import bench_latency as bl  # noqa: E402
import streammem_kernels as sk  # noqa: E402

keys, queries = bl.hierarchy(1_000_000, seed=4)
tree = bl.build_tree(keys, half_scan=args.half)
del keys
one = [queries[i : i + 1].contiguous() for i in range(len(queries))]
for q in one:
    sk.tree_search(tree, q, beam=(5, 10), k=10)  # warm up
times = []
start = time.perf_counter()
while time.perf_counter() - start < args.seconds:
    for q in one:
        t0 = time.perf_counter()
        sk.tree_search(tree, q, beam=(5, 10), k=10)
        times.append(time.perf_counter() - t0)
p20, p50, p80 = np.percentile(times, [20, 50, 80]) * 1e6
print(f"{'half_scan' if args.half else 'plain'} beam (5, 10) at 10^6 leaves: p20 / p50 / p80 "
      f"{p20:.1f} / {p50:.1f} / {p80:.1f} us, {len(times)} calls, load {os.getloadavg()[0]:.2f} "
      f"({sk.__file__})")
