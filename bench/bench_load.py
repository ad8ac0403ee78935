"""Under load: each op's representative calls while background processes keep the cores busy, beside the peer.

Run:  .venv/bin/python -m bench.bench_load [--loads 0,1,2x] [--threads 1,2] [--seconds 1.0] [--out FILE]
      python -m bench.quality run load_levels   # the same, saved for the record
      (pytest-benchmark form, at whatever load the machine has: .venv/bin/python -m pytest bench/bench_load.py)

A model server sharing the machine is the usual setting: our calls then compete with busy processes
for every core.  For each load level (``0``, ``1`` or ``2x``: that many ``while True: pass``
processes, ``2x`` twice the cores) and each thread count (``torch.set_num_threads``, which the C++
kernels follow; faiss and OpenCV get the same count), every case alternates single calls of ours
and of its peer for ``--seconds`` each, so a load change hits both alike, and reports wall p20 /
p50 / p80 per call in microseconds with the 1-minute load average read when the level started and
ended.  ``ratio`` is our p50 over the peer's.  The package is imported before torch, so OpenMP
waits passively (``streammem_kernels.runtime.threads``) unless ``OMP_WAIT_POLICY`` is set: run with
``OMP_WAIT_POLICY=ACTIVE`` to see what a process that imported torch first gets.

Cases (D = 384, data from a fixed seed):

* ``topk Q=1 N=1e3`` / ``N=1e5``: ``cosine_topk(k=10)`` vs faiss ``IndexFlatIP`` over unit keys
  (the query normalised in the call, as ours is);
* ``topk Q=64 N=1e4``: the batched (BLAS) path vs faiss ``IndexFlatIP``;
* ``videoagent round``: ``CosineIndex.search(k=4, ranges=...)`` over 3,600 frames cut into 10 segments
  (the frame index our VideoAgent recipe keeps) vs the numpy loop VideoAgent's code runs over its
  normalised frames (a matrix-vector product and ``argsort`` per segment);
* ``depth_scores M=8``: one window of the segmenter vs the same rule in pure Python;
* ``motion 224x168``: ``motion_magnitude`` of one RGB pair (``size=224``) vs OpenCV DIS
  ULTRAFAST on the same pair (gray conversion included).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import streammem_kernels as sk  # before torch: the package's OpenMP wait policy applies  # isort: skip

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from bench import quality, timing  # noqa: E402
from bench.timing import fmt, optional, set_threads  # noqa: E402

DIM = 384


# --------------------------------------------------------------------------
# Cases: name -> (ours, peer or None, peer name)
# --------------------------------------------------------------------------
def unit(x: np.ndarray) -> np.ndarray:
    """Rows (or the vector) of ``x`` scaled to norm 1 (zero rows stay zero), as a numpy user prepares keys for cosine."""
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-30)


def topk_case(num_q: int, num_k: int, k: int = 10):
    g = np.random.default_rng(num_q * 7 + num_k)
    keys = g.standard_normal((num_k, DIM), dtype=np.float32)
    queries = g.standard_normal((num_q, DIM), dtype=np.float32)
    keys_t, queries_t = torch.from_numpy(keys), torch.from_numpy(queries)
    faiss = optional("faiss")
    if faiss is None:
        return (lambda: sk.cosine_topk(queries_t, keys_t, k)), None, "-"
    index = faiss.IndexFlatIP(DIM)
    index.add(unit(keys).astype(np.float32))
    return (lambda: sk.cosine_topk(queries_t, keys_t, k)), (lambda: index.search(unit(queries), k)), "faiss"


def segment_bounds(num_frames: int, segments: int) -> np.ndarray:
    edges = np.linspace(0, num_frames, segments + 1).astype(np.int64)
    return np.stack([edges[:-1], edges[1:]], 1)


def videoagent_case(num_frames: int = 3600, segments: int = 10, k: int = 4):
    g = np.random.default_rng(num_frames + segments)
    frames = g.standard_normal((num_frames, DIM), dtype=np.float32)
    queries = g.standard_normal((segments, DIM), dtype=np.float32)
    bounds = segment_bounds(num_frames, segments)
    frames_t, queries_t, ranges_t = torch.from_numpy(frames), torch.from_numpy(queries), torch.from_numpy(bounds)
    unit_frames = unit(frames)  # VideoAgent normalises its frame index once
    index = sk.CosineIndex(DIM)  # and so does our recipe: its frame index, ids = frame numbers
    index.add(frames_t)

    def numpy_round():
        out = []
        for q, (lo, hi) in zip(unit(queries), bounds):
            sims = unit_frames[lo:hi] @ q
            out.append(lo + np.argsort(-sims, kind="stable")[:k])
        return out

    return (lambda: index.search(queries_t, k, ranges=ranges_t)), numpy_round, "numpy loop"


def python_depths(s):
    """The climb rule in pure Python (what a segmenter without our kernels runs per window)."""
    out = []
    for i, v in enumerate(s):
        left = right = v
        for j in range(i - 1, -1, -1):
            if s[j] < left:
                break
            left = s[j]
        for j in range(i + 1, len(s)):
            if s[j] < right:
                break
            right = s[j]
        out.append(0.5 * ((left - v) + (right - v)))
    return out


def depth_case(window: int = 8):
    sims = np.random.default_rng(window).random(window).astype(np.float32)
    sims_t, sims_list = torch.from_numpy(sims), sims.tolist()
    return (lambda: sk.depth_scores(sims_t)), (lambda: python_depths(sims_list)), "pure Python"


def motion_case(width: int = 224, height: int = 168):
    g = np.random.default_rng(width)
    base = (g.random((height + 8, width + 8, 3)) * 255).astype(np.uint8)
    pair = np.stack([base[:height, :width], base[2:height + 2, 3:width + 3]])
    pair_t = torch.from_numpy(pair)
    cv2 = optional("cv2")
    if cv2 is None:
        return (lambda: sk.motion_magnitude(pair_t, size=224)), None, "-"
    dis = cv2.DISOpticalFlow_create(cv2.DISOPTICAL_FLOW_PRESET_ULTRAFAST)

    def opencv():
        a, b = (cv2.cvtColor(f, cv2.COLOR_RGB2GRAY) for f in pair)
        return dis.calc(a, b, None)

    return (lambda: sk.motion_magnitude(pair_t, size=224)), opencv, "OpenCV DIS"


CASES = {
    "topk Q=1 N=1e3": lambda: topk_case(1, 1000),
    "topk Q=1 N=1e5": lambda: topk_case(1, 100_000),
    "topk Q=64 N=1e4": lambda: topk_case(64, 10_000),
    "videoagent round": videoagent_case,
    "depth_scores M=8": depth_case,
    "motion 224x168": motion_case,
}


# --------------------------------------------------------------------------
# Load and timing
# --------------------------------------------------------------------------
def start_load(count: int) -> list[subprocess.Popen]:
    """``count`` busy processes (pure Python spin, no threads of their own)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def stop_load(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait()


def alternate(ours, peer, seconds: float) -> tuple[np.ndarray, np.ndarray | None]:
    """Single calls of ours and the peer, alternating, for about ``seconds`` (at least 15 each)."""
    times = timing.alternate([ours] if peer is None else [ours, peer], seconds, min_rounds=15)
    return times[0], (times[1] if peer is not None else None)


def load_counts(spec: str) -> list[int]:
    cores = os.cpu_count() or 1
    return [int(float(s[:-1]) * cores) if s.endswith("x") else int(s) for s in spec.split(",")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loads", default="0,1,2x", help="busy processes per level: ints, or Nx for N x cores")
    ap.add_argument("--threads", default="1,2", help="thread counts (torch.set_num_threads; peers alike)")
    ap.add_argument("--seconds", type=float, default=1.0, help="seconds of alternating calls per case")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    ap.add_argument("--out", help="also write the table (markdown) here")
    args = ap.parse_args(argv)
    cases = {name: CASES[name]() for name in args.cases.split(",")}
    started, load_before, records = time.time(), quality.load_average(), []
    lines = [f"cores: {os.cpu_count()}, torch {torch.__version__}; wall per call in us, p20 / p50 / p80",
             "", "| busy procs | load avg (start-end) | threads | case | ours | peer | peer p20 / p50 / p80 "
             "| ours/peer p50 |",
             "|---:|---|---:|---|---|---|---|---:|"]
    print("\n".join(lines), flush=True)
    for count in load_counts(args.loads):
        procs = start_load(count)
        try:
            time.sleep(1.0 if count else 0.0)
            rows = []
            load_start = os.getloadavg()[0]
            for threads in (int(t) for t in args.threads.split(",")):
                set_threads(threads)
                for name, (ours, peer, peer_name) in cases.items():
                    mine, theirs = alternate(ours, peer, args.seconds)
                    rows.append((threads, name, mine, peer_name, theirs))
            load_end = os.getloadavg()[0]
        finally:
            stop_load(procs)
        for threads, name, mine, peer_name, theirs in rows:
            ratio = f"{mine[1] / theirs[1]:.2f}" if theirs is not None else "-"
            line = (f"| {count} | {load_start:.1f}-{load_end:.1f} | {threads} | {name} | {fmt(mine)} | {peer_name} | "
                    f"{fmt(theirs)} | {ratio} |")
            lines.append(line)
            print(line, flush=True)
            records.append({"busy": count, "load": f"{load_start:.1f}-{load_end:.1f}", "threads": threads,
                            "case": name, "ours": fmt(mine), "ours_p50": float(mine[1]), "peer": peer_name,
                            "theirs": fmt(theirs), "ratio": ratio,
                            "ratio_p50": None if theirs is None else float(mine[1] / theirs[1])})
    verdicts = load_verdicts(records)
    for v in verdicts:
        print(f"{v['case']}, {v['threads']} thread(s), {v['busy']} busy: {v['verdict']}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    if quality.saving():  # python -m bench.quality run load_levels: the tables for the record
        quality.save("load_levels", [
            {"title": "Under load: the targets", "columns": [
                quality.column("case", "case"), quality.column("threads", "threads", "int"),
                quality.column("busy", "busy processes", "int"), quality.column("own", "ours / our 1-thread p50"),
                quality.column("relative", "ours/peer here / ours/peer idle"), quality.column("verdict", "verdict")],
             "rows": verdicts},
            {"title": "Wall time per call, p20 / p50 / p80 (us)", "columns": [
                quality.column("busy", "busy processes", "int"), quality.column("load", "load average (start-end)"),
                quality.column("threads", "threads", "int"), quality.column("case", "case"),
                quality.column("ours", "ours"), quality.column("peer", "peer"), quality.column("theirs", "peer's"),
                quality.column("ratio", "ours / peer (p50)")],
             "rows": [{k: r[k] for k in ("busy", "load", "threads", "case", "ours", "peer", "theirs", "ratio")}
                      for r in records]}],
            about="For each load level (that many `while True: pass` processes: 0, 1 and 2 x the cores) and thread "
                  "count (torch.set_num_threads, which the C++ kernels follow; faiss and OpenCV get the same), each "
                  "case alternates single calls of ours and of its peer for --seconds. The targets: under load no "
                  "case slower than its own 1-thread run at that load, and ours/peer no worse than on the idle "
                  "machine (a 10% margin for the run-to-run noise of a shared VM). See bench/bench_load.py's "
                  "docstring for the cases. Timings: only rows of one run compare.",
            started=started, load_before=load_before)
    return 0


NOISE = 1.10  # a ratio within 10% of its target counts as met: single runs on a shared VM vary that much


def load_verdicts(records: list[dict]) -> list[dict]:
    """Per case, thread count and load level above 0: ours against our 1-thread run at the same level, and
    ours/peer against ours/peer at level 0 with the same threads, with the verdict on both targets."""
    by_key = {(r["busy"], r["threads"], r["case"]): r for r in records}
    out = []
    for r in records:
        if r["busy"] == 0:
            continue
        one = by_key.get((r["busy"], 1, r["case"]))
        idle = by_key.get((0, r["threads"], r["case"]))
        own = r["ours_p50"] / one["ours_p50"] if one is not None else None
        relative = (r["ratio_p50"] / idle["ratio_p50"]
                    if idle is not None and r["ratio_p50"] is not None and idle["ratio_p50"] else None)
        misses = []
        if own is not None and own > NOISE:
            misses.append("slower than its 1-thread run")
        if relative is not None and relative > NOISE:
            misses.append("further behind the peer than when idle")
        out.append({"case": r["case"], "threads": r["threads"], "busy": r["busy"],
                    "own": "-" if own is None else f"{own:.2f}",
                    "relative": "-" if relative is None else f"{relative:.2f}",
                    "verdict": "; ".join(misses) if misses else "met"})
    return out


# --------------------------------------------------------------------------
# pytest-benchmark form: ours and the peer, at the machine's current load and torch's thread count
# --------------------------------------------------------------------------
@pytest.mark.parametrize("case", list(CASES))
def test_load_case(benchmark, case):
    ours, _, _ = CASES[case]()
    benchmark.group = f"load {case}"
    benchmark.extra_info["provider"] = "ours"
    benchmark(ours)


@pytest.mark.parametrize("case", list(CASES))
def test_load_peer(benchmark, case):
    _, peer, peer_name = CASES[case]()
    if peer is None:
        pytest.skip(f"no peer installed for {case}")
    benchmark.group = f"load {case}"
    benchmark.extra_info["provider"] = peer_name
    benchmark(peer)


if __name__ == "__main__":
    sys.exit(main())
