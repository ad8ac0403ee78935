"""Single-item latency: one query, one push, one frame pair, next to the native kernel and faiss.

Run:  OMP_NUM_THREADS=1 .venv/bin/python -m bench.bench_latency [--quick] [--out bench/results/latency.md]
      python -m bench.quality run latency   # overhead, others and topk, saved for the record
      (``--tables tree --tree-sizes 1000000``: the 10^6-leaf tree row alone, two trees, ~8 GB and ~1 min)
      (pytest-benchmark form: .venv/bin/python -m pytest bench/bench_latency.py --benchmark-json ...)

Every case times the public function and, on the same input, the native call it ends in (the
C++ kernel reached through the same pointers, nothing else), so ``overhead = public - native``
is what the Python side costs per call.  Times are per call:

* wall p20 / p50 / p80 over single calls (``time.perf_counter``);
* CPU: the least thread CPU time per call over 15 batches (``time.thread_time_ns``), which a busy
  machine does not inflate with waiting for a core (the overhead column uses it; for the overhead
  rows the public and native batches alternate, 21 each, so load changes hit both alike).

Cases (D = 384 for retrieval, as bench_tree.py; synthetic hierarchical data from bench_tree.py):

* overhead table: cosine_topk Q=1 N=1,000; tree_search greedy and beam (5, 10) Q=1 on a
  10^4-leaf tree; StreamingSegmenter.push at D=768 for one stream and 1,000 streams;
  motion_magnitude on one 224x168 uint8 RGB pair; graph_retrieve Q=1 over 200 nodes (k=4, 2 hops,
  capacity 64; its fused C++ entry with the views and outputs made once, as cosine_topk's);
  MotionGate.push at 224 px (kernel share).
* ``others``: batched_kmeans, token_logprobs, divergence_point, detect_boundaries on small inputs,
  the native time read by wrapping their ``_cpu_<family>`` module's functions (the wrapper's own
  Python frame and clock reads, about 1 us, land on the public side).
* cosine_topk Q=1 vs faiss IndexFlatIP at N = 10^2 .. 10^6 (``--quick``: up to 10^5), their calls
  alternating (measure_alternating); "same ids" also holds when the ids differ only in the order
  of keys whose scores lie within 1e-6 (a tie at float32 precision).
* tree_search greedy / beam (5, 10) Q=1 vs faiss IndexHNSWFlat (M=32, efConstruction=40,
  efSearch=64) at N = 10^3 .. 10^5 (HNSW), and the tree alone at 10^6; recall over 200 queries
  (recall@1 for greedy: the path's leaf is the exact top-1; recall@10 for beam and HNSW: the
  fraction of the exact top-10 ids returned).  The beam also runs on a second tree built from the
  same keys with ``half_scan=True`` (the half-precision scan copy), runs of 200 calls (one per
  query) on each tree alternating; "same" says whether both returned equal ids and scores for all 200 queries, and
  the memory column gives both trees' ``nbytes``.

Threads: run it with OMP_NUM_THREADS=1 (faiss and torch get 1 thread too) so both sides do the
same work on one core; a shared machine's load otherwise decides the OpenMP barriers.
"""
from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import torch


import streammem_kernels as sk  # noqa: E402
from bench import quality  # noqa: E402
from streammem_kernels.runtime.dispatch import load_native  # noqa: E402
from streammem_kernels.runtime.native import view  # noqa: E402

DIM, TOPK, RECALL_QUERIES = 384, 10, 200


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------
def wall_percentiles(fn, reps: int) -> tuple[float, float, float]:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    p20, p50, p80 = np.percentile(np.array(times) * 1e6, [20, 50, 80])
    return float(p20), float(p50), float(p80)


def cpu_per_call(fn, reps: int, batches: int = 15) -> float:
    best = float("inf")
    for _ in range(batches):
        t0 = time.thread_time_ns()
        for _ in range(reps):
            fn()
        best = min(best, (time.thread_time_ns() - t0) / reps / 1e3)
    return best


def reps_for(fn, budget_s: float = 0.3) -> int:
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    return int(min(3000, max(5, budget_s / one)))


def measure(fn) -> dict:
    reps = reps_for(fn)
    p20, p50, p80 = wall_percentiles(fn, reps)
    return dict(p20=p20, p50=p50, p80=p80, cpu=cpu_per_call(fn, max(3, reps // 10)))


def measure_pair(public, native) -> tuple[dict, dict]:
    """Both sides of an overhead row, their CPU batches interleaved (public, native, public, ...)
    so that a load change on the shared machine hits both alike."""
    out = []
    for fn in (public, native):
        reps = reps_for(fn)
        p20, p50, p80 = wall_percentiles(fn, reps)
        out.append(dict(p20=p20, p50=p50, p80=p80, cpu=float("inf"), reps=max(3, reps // 10)))
    for _ in range(21):
        for fn, m in zip((public, native), out):
            m["cpu"] = min(m["cpu"], cpu_per_call(fn, m["reps"], batches=1))
    return out[0], out[1]


def measure_alternating(first, second, block: int = 1) -> tuple[dict, dict]:
    """Two functions compared side by side: single calls alternate (first, second, first, ...) for
    the wall percentiles and batches alternate for the CPU figure, so that the load of a shared
    machine, which changes from second to second, weighs on both alike.  ``block`` > 1 alternates
    runs of that many calls instead (each call still timed alone): two searches of two large
    trees evict each other's cached upper levels when every call switches trees."""
    reps = min(reps_for(first), reps_for(second))
    reps = max(block, reps // block * block)
    first(), second()
    times = ([], [])
    for _ in range(reps // block):
        for fn, out in zip((first, second), times):
            for _ in range(block):
                t0 = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t0)
    result = []
    for out in times:
        p20, p50, p80 = np.percentile(np.array(out) * 1e6, [20, 50, 80])
        result.append(dict(p20=float(p20), p50=float(p50), p80=float(p80), cpu=float("inf")))
    for _ in range(15):
        for fn, m in zip((first, second), result):
            m["cpu"] = min(m["cpu"], cpu_per_call(fn, max(3, reps // 10), batches=1))
    return result[0], result[1]


# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------
def hierarchy(n: int, seed: int = 0):
    from bench import bench_tree

    bench_tree.NUM_QUERIES = RECALL_QUERIES
    return bench_tree.synthetic_hierarchy(n, seed)


def build_tree(keys: torch.Tensor, half_scan: bool = False) -> sk.CosineTree:
    tree = sk.CosineTree(keys.shape[1], capacity=keys.shape[0] + keys.shape[0] // 9 + 16, half_scan=half_scan)
    for lo in range(0, keys.shape[0], 100_000):  # the same tree as one call, without a 1.5 GB normalised copy
        tree.add_leaves(keys[lo : lo + 100_000])
    tree.grow(10)
    return tree


def recall(ids: np.ndarray, exact: np.ndarray, k: int) -> float:
    """Fraction of each query's exact top-k ids that were returned (mean over queries)."""
    return float(np.mean([(np.isin(ids[i][ids[i] >= 0], exact[i][:k])).sum() / k for i in range(len(ids))]))


# --------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------
def overhead_rows(faiss) -> list[tuple]:
    rows = []
    tree_mod, _ = load_native("cpu", "tree")
    keys, queries = hierarchy(10_000, seed=1)
    q = queries[:1].contiguous()
    k1000 = keys[:1000].contiguous()
    topk_args = _native_topk_args(q, k1000)
    rows.append(("cosine_topk Q=1 N=1000 k=10", *measure_pair(
        lambda: sk.cosine_topk(q, k1000, TOPK),
        lambda: tree_mod.cosine_topk(*topk_args))))
    tree = build_tree(keys)
    greedy_args, beam_args = _native_search_args(tree, q)
    rows.append(("tree_search greedy Q=1 N=10^4", *measure_pair(
        lambda: sk.tree_search(tree, q),
        lambda: tree_mod.greedy(*greedy_args))))
    rows.append(("tree_search beam (5,10) Q=1 N=10^4", *measure_pair(
        lambda: sk.tree_search(tree, q, beam=(5, 10), k=TOPK),
        lambda: tree_mod.beam(*beam_args))))
    g = torch.Generator().manual_seed(2)
    for streams in (None, 1000):
        shape = (768,) if streams is None else (streams, 768)
        frames = [torch.randn(shape, generator=g) for _ in range(64)]
        seg = sk.StreamingSegmenter(backend="auto")
        for f in frames[:2]:
            seg.push(f)
        it = iter(range(10**9))
        views = [view(f) for f in frames]  # made once: the native side is the bound C++ step alone
        pub, nat = measure_pair(lambda: seg.push(frames[next(it) % 64]),
                                lambda: seg._fast_step(views[next(it) % 64], seg.frames_seen))
        label = "StreamingSegmenter.push D=768, 1 stream" if streams is None else \
            "StreamingSegmenter.push D=768, 1000 streams"
        rows.append((label, pub, nat))
    motion_mod, _ = load_native("cpu", "motion")
    pair = torch.randint(0, 256, (2, 168, 224, 3), dtype=torch.uint8, generator=g)
    pair_view, lk = pair.numpy().__dlpack__(), _lk_args(168, 224)

    def motion_native():  # the two entries, on buffers allocated per call as the public function's are
        gray = np.empty((2, 168, 224), np.float32).__dlpack__()
        motion_mod.gray_area(pair_view, gray)
        motion_mod.lk_flow(gray, *lk, *_lk_outputs(1))
    rows.append(("motion_magnitude 2x168x224 RGB uint8",
                 *measure_pair(lambda: sk.motion_magnitude(pair), motion_native)))
    graph_mod, _ = load_native("cpu", "graph")
    src, dst = torch.randint(0, 200, (800,), generator=g), torch.randint(0, 200, (800,), generator=g)
    graph = sk.CSRGraph.from_edges(src, dst, 200)
    emb, gq = torch.randn(200, 384, generator=g), torch.randn(1, 384, generator=g)
    retrieve_args = _native_retrieve_args(gq, emb, graph, k=4, hops=2, capacity=64)
    rows.append(("graph_retrieve Q=1 N=200 k=4 hops=2", *measure_pair(
        lambda: sk.graph_retrieve(gq, emb, graph, k=4, hops=2, capacity=64),
        lambda: graph_mod.retrieve(*retrieve_args))))
    return rows


def _native_topk_args(q: torch.Tensor, keys: torch.Tensor) -> tuple:
    """cosine_topk's C++ entry on (q, keys), k = TOPK: its views, the outputs made once."""
    out = (torch.empty((q.shape[0], TOPK), dtype=torch.int64), torch.empty((q.shape[0], TOPK)))
    return (view(q), view(keys), None, *map(view, out))


def _native_search_args(tree: sk.CosineTree, q: torch.Tensor) -> tuple:
    """The arguments of the C++ greedy and beam (5, 10) entries on the tree's snapshot and q: the views of
    the snapshot's tensors, the widths per level from the top, the outputs made once."""
    a = tree.search_arrays()
    emb, ptr, idx, roots, level, utility = map(view, a.tensors)
    lead = (q.shape[0],)
    greedy_out = (torch.empty(lead + (a.height + 1,), dtype=torch.int64), torch.empty(lead + (a.height + 1,)),
                  torch.empty(lead, dtype=torch.int64), torch.empty(lead))
    widths = view(torch.tensor([5] + [10] * (a.height - 1), dtype=torch.int64))
    beam_out = (torch.empty((q.shape[0], TOPK), dtype=torch.int64), torch.empty((q.shape[0], TOPK)))
    return ((emb, ptr, idx, roots, view(q), False, *map(view, greedy_out)),
            (emb, ptr, idx, roots, level, utility, view(q), widths, float("-inf"), False, *map(view, beam_out), None,
             0.0, 0.0))


def _native_retrieve_args(q: torch.Tensor, emb: torch.Tensor, graph: sk.CSRGraph, *, k: int, hops: int,
                          capacity: int) -> tuple:
    """graph_retrieve's fused C++ entry (seed top-k and expansion, no caps, no min_score): its views, the
    outputs made once."""
    num_q = q.shape[0]
    out = (torch.empty((num_q, k), dtype=torch.int64), torch.empty((num_q, k)),
           *(torch.empty((num_q, capacity), dtype=torch.int64) for _ in range(5)),
           torch.empty(num_q, dtype=torch.int64), torch.empty(num_q, dtype=torch.bool))
    no_cap = 2**31 - 1  # what the public function passes for max_fanout / max_frontier=None
    return (view(q), view(emb), view(graph.row_ptr), view(graph.col_idx), hops, no_cap, no_cap, float("-inf"),
            *map(view, out))


def inner_native_rows() -> list[tuple]:
    """The ops without a hand-written native twin here: the public function timed on its smallest
    realistic input while every function of its ``_cpu_<family>`` module is wrapped to add up the
    CPU time spent inside it (the wrapper's own clock reads, ~0.5 us a call, count as native)."""
    g = torch.Generator().manual_seed(5)
    pts = torch.randn(1, 64, 384, generator=g)
    logits, targets = torch.randn(16, 2048, generator=g), torch.randint(0, 2048, (16,), generator=g)
    lp = -torch.rand(64, generator=g)
    feats = torch.randn(1, 32, 384, generator=g)
    cases = [
        ("batched_kmeans 1x64x384 k=4", "kmeans", lambda: sk.batched_kmeans(pts, 4, iters=5)),
        ("token_logprobs T=16 V=2048", "logprobs", lambda: sk.token_logprobs(logits, targets)),
        ("divergence_point L=64", "logprobs", lambda: sk.divergence_point(lp)),
        ("detect_boundaries 1x32x384", "boundaries", lambda: sk.detect_boundaries(feats)),
    ]
    rows = []
    for label, family, fn in cases:
        mod, _ = load_native("cpu", family)
        if mod is None:
            continue
        spent = [0]
        originals = {}
        for name in dir(mod):
            f = getattr(mod, name)
            if name.startswith("_") or type(f).__name__ != "builtin_function_or_method":
                continue
            originals[name] = f

            def timed(*args, _f=f, **kwargs):
                t0 = time.thread_time_ns()
                try:
                    return _f(*args, **kwargs)
                finally:
                    spent[0] += time.thread_time_ns() - t0
            setattr(mod, name, timed)
        try:
            reps = reps_for(fn)
            best_total = best_inner = float("inf")
            for _ in range(15):
                spent[0] = 0
                t0 = time.thread_time_ns()
                for _ in range(max(3, reps // 10)):
                    fn()
                total = (time.thread_time_ns() - t0) / max(3, reps // 10) / 1e3
                if total < best_total:
                    best_total, best_inner = total, spent[0] / max(3, reps // 10) / 1e3
            p20, p50, p80 = wall_percentiles(fn, reps)
        finally:
            for name, f in originals.items():
                setattr(mod, name, f)
        rows.append((label, dict(p20=p20, p50=p50, p80=p80, cpu=best_total),
                     dict(p20=float("nan"), p50=float("nan"), p80=float("nan"), cpu=best_inner)))
    return rows


def _lk_args(h: int, w: int) -> tuple:
    """The C++ lk_flow arguments after the frames that motion_magnitude's defaults pass."""
    from streammem_kernels import motion

    return motion._cpp_lk_args(5, 1e-5, motion._resolve_levels("auto", (h, w), 5), "moving")


def _lk_outputs(pairs: int) -> tuple:
    """DLPack views of new lk_flow outputs flow_px, mean_uv and score for ``pairs`` pairs."""
    return tuple(np.empty(shape, np.float32).__dlpack__() for shape in ((pairs,), (pairs, 2), (pairs,)))


def motion_gate_row() -> tuple:
    from streammem import MotionGate

    motion_mod, _ = load_native("cpu", "motion")
    g = torch.Generator().manual_seed(3)
    video = torch.randint(0, 256, (16, 480, 640, 3), dtype=torch.uint8, generator=g).numpy()
    gate = MotionGate(size=224)
    gate.push(video[:1])
    it = iter(range(10**9))
    # The kernel work one push needs: the new frame's gray at 224 px, then LK on (reference, new)
    # gray; the reference's gray was made when it was pushed.
    anchor = np.empty((1, 168, 224), np.float32)
    motion_mod.gray_area(video[:1].__dlpack__(), anchor.__dlpack__())
    lk = _lk_args(168, 224)

    def gate_native():  # the reference's gray and the new frame's in one new stack, then LK on the pair
        stack = np.empty((2, 168, 224), np.float32)
        stack[0] = anchor[0]
        motion_mod.gray_area(video[1 + next(it) % 15][None].__dlpack__(), stack[1:].__dlpack__())
        motion_mod.lk_flow(stack.__dlpack__(), *lk, *_lk_outputs(1))
    pub, nat = measure_pair(lambda: gate.push(video[1 + next(it) % 15][None]), gate_native)
    return ("MotionGate.push 480x640 RGB -> 224 px", pub, nat)


def topk_vs_faiss(faiss, sizes) -> list[tuple]:
    rows = []
    rng = np.random.default_rng(0)
    for n in sizes:
        keys = rng.standard_normal((n, DIM), dtype=np.float32)
        keys /= np.linalg.norm(keys, axis=1, keepdims=True)
        q = keys[rng.integers(0, n, 1)] + 0.03 * rng.standard_normal((1, DIM), dtype=np.float32)
        index = faiss.IndexFlatIP(DIM)
        index.add(keys)
        kt, qt = torch.from_numpy(keys), torch.from_numpy(np.ascontiguousarray(q))
        ours, theirs = measure_alternating(lambda: sk.cosine_topk(qt, kt, TOPK), lambda: index.search(q, TOPK))
        mine, (their_scores, their_ids) = sk.cosine_topk(qt, kt, TOPK), index.search(q, TOPK)
        # Equal ids, or the same scores rank by rank: keys closer than float32 rounding are a tie
        # that either order answers correctly.
        same = np.array_equal(mine.ids.numpy(), their_ids) or \
            np.allclose(mine.scores.numpy(), their_scores, rtol=0, atol=1e-6)
        rows.append((n, ours, theirs, same))
        del index, keys, kt
    return rows


def tree_vs_hnsw(faiss, sizes, hnsw_max: int) -> list[tuple]:
    rows = []
    for n in sizes:
        keys, queries = hierarchy(n, seed=4)
        flat = faiss.IndexFlatIP(DIM)
        flat.add(keys.numpy())
        _, exact = flat.search(queries.numpy(), TOPK)
        del flat
        t0 = time.perf_counter()
        tree = build_tree(keys)
        tree_build = time.perf_counter() - t0
        # The same tree with the half-precision scan copy: beam calls of both alternate.
        half = build_tree(keys, half_scan=True)
        one = [queries[i : i + 1].contiguous() for i in range(len(queries))]
        it = iter(range(10**9))
        greedy = measure(lambda: sk.tree_search(tree, one[next(it) % len(one)]))
        beam, beam_half = measure_alternating(
            lambda: sk.tree_search(tree, one[next(it) % len(one)], beam=(5, 10), k=TOPK),
            lambda: sk.tree_search(half, one[next(it) % len(one)], beam=(5, 10), k=TOPK), block=len(one))
        same = all(torch.equal(a, b) for qq in one
                   for a, b in zip(sk.tree_search(tree, qq, beam=(5, 10), k=TOPK),
                                   sk.tree_search(half, qq, beam=(5, 10), k=TOPK)))
        memory = (tree.nbytes / 2**20, half.nbytes / 2**20)
        del half
        leaf = []
        for qq in one:
            path = sk.tree_search(tree, qq).path[0]
            leaf.append([int(path[(path >= 0).sum() - 1])])
        g_rec = recall(np.array(leaf), exact, 1)
        b_ids = np.concatenate([sk.tree_search(tree, qq, beam=(5, 10), k=TOPK).ids.numpy() for qq in one])
        b_rec = recall(b_ids, exact, TOPK)
        h = h_rec = h_build = None
        if n <= hnsw_max:
            index = faiss.IndexHNSWFlat(DIM, 32, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = 40
            t0 = time.perf_counter()
            index.add(keys.numpy())
            h_build = time.perf_counter() - t0
            index.hnsw.efSearch = 64
            qn = [x.numpy() for x in one]
            h = measure(lambda: index.search(qn[next(it) % len(qn)], TOPK))
            h_rec = recall(index.search(queries.numpy(), TOPK)[1], exact, TOPK)
            del index
        rows.append((n, greedy, g_rec, beam, b_rec, beam_half, same, memory, h, h_rec, tree_build, h_build))
        del tree, keys
    return rows


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------
def fmt(m: dict | None) -> str:
    if m is None:
        return "-"
    if m["p50"] != m["p50"]:  # inside-the-public-call timing: CPU only
        return f"({m['cpu']:.1f})"
    return f"{m['p20']:.1f} / {m['p50']:.1f} / {m['p80']:.1f} ({m['cpu']:.1f})"


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N up to 10^5 for top-k, 10^4 for the tree")
    parser.add_argument("--out", help="write the markdown here too")
    parser.add_argument("--hnsw-max", type=int, default=100_000)
    parser.add_argument("--tables", default="overhead,others,topk,tree", help="comma-separated subset to run")
    parser.add_argument("--tree-sizes", help="comma-separated leaf counts for the tree table (default: 10^3 .. 10^6, "
                        "--quick: 10^3, 10^4)")
    args = parser.parse_args(argv)
    import faiss

    faiss.omp_set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load0 = os.getloadavg()
    lines = [f"Date {started}; machine {platform.node()} ({os.cpu_count()} cores), OMP_NUM_THREADS="
             f"{os.environ.get('OMP_NUM_THREADS', 'unset')}; load average at start {load0[0]:.2f} {load0[1]:.2f} "
             f"{load0[2]:.2f}.  Cells: wall p20 / p50 / p80 in us (CPU us per call in parentheses).", ""]
    tables = set(args.tables.split(","))
    t0, load_text = time.time(), f"{load0[0]:.1f} / {load0[1]:.1f} / {load0[2]:.1f}"
    overhead, topk = [], []
    lines += ["| case | public function | native kernel | overhead (CPU us) | kernel share |", "|---|---|---|---|---|"]
    for label, pub, nat in (overhead_rows(faiss) + [motion_gate_row()] if "overhead" in tables else []) + (
            inner_native_rows() if "others" in tables else []):
        cells = [label, fmt(pub), fmt(nat), f"{pub['cpu'] - nat['cpu']:.1f}", f"{100 * nat['cpu'] / pub['cpu']:.0f}%"]
        overhead.append(dict(zip(("case", "public", "native", "overhead", "share"), cells)))
        lines.append("| " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    sizes = (100, 1000, 10_000, 100_000) if args.quick else (100, 1000, 10_000, 100_000, 1_000_000)
    lines += ["", "| cosine_topk Q=1, N | cosine_topk | faiss IndexFlatIP | same ids |", "|---|---|---|---|"]
    for n, ours, theirs, same in (topk_vs_faiss(faiss, sizes) if "topk" in tables else []):
        topk.append({"n": f"{n:,}", "ours": fmt(ours), "faiss": fmt(theirs), "same": str(same)})
        lines.append(f"| {n:,} | {fmt(ours)} | {fmt(theirs)} | {same} |")
        print(lines[-1], flush=True)
    tree_sizes = (1000, 10_000) if args.quick else (1000, 10_000, 100_000, 1_000_000)
    if args.tree_sizes:
        tree_sizes = tuple(int(x) for x in args.tree_sizes.split(","))
    lines += ["", "| tree Q=1, N | greedy | recall@1 | beam (5,10) | recall@10 | beam (5,10) half_scan | "
              "same ids and scores | tree MB (plain / half_scan) | faiss HNSW | HNSW recall@10 | "
              "build s (tree / HNSW) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    rows = tree_vs_hnsw(faiss, tree_sizes, args.hnsw_max) if "tree" in tables else []
    for n, greedy, g_rec, beam, b_rec, b_half, same, (mb, mb_half), h, h_rec, tb, hb in rows:
        lines.append(f"| {n:,} | {fmt(greedy)} | {g_rec:.3f} | {fmt(beam)} | {b_rec:.3f} | {fmt(b_half)} | {same} | "
                     f"{mb:,.0f} / {mb_half:,.0f} | {fmt(h)} | {'-' if h_rec is None else f'{h_rec:.3f}'} | "
                     f"{tb:.1f} / {'-' if hb is None else f'{hb:.1f}'} |")
        print(lines[-1], flush=True)
    load1 = os.getloadavg()
    lines += ["", f"Load average at end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}."]
    text = "\n".join(lines) + "\n"
    if quality.saving():  # python -m bench.quality run latency: the overhead and top-k tables for the record
        col = quality.column
        quality.save("latency", [
            {"title": "Per-call overhead over the native kernel (wall p20 / p50 / p80 us, CPU us in parentheses)",
             "columns": [col("case", "case"), col("public", "public function"), col("native", "native kernel"),
                         col("overhead", "overhead (CPU us)"), col("share", "kernel share")], "rows": overhead},
            {"title": "cosine_topk Q=1 beside faiss IndexFlatIP (wall p20 / p50 / p80 us, CPU us in parentheses)",
             "columns": [col("n", "N"), col("ours", "cosine_topk"), col("faiss", "faiss IndexFlatIP"),
                         col("same", "same ids")], "rows": topk}],
            about="Every overhead case times the public function and, on the same input, the native call it ends "
                  "in (views and outputs made once where the entry allows; 'others': the native time read inside "
                  "the public call by wrapping the C++ module's functions); overhead = the difference of the CPU "
                  "times (least thread CPU time per call over alternating batches, which a busy machine does not "
                  "inflate). One thread (OMP_NUM_THREADS, default 1). See bench/bench_latency.py's docstring.",
            started=t0, load_before=load_text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)
    return text


# pytest-benchmark form (``make bench`` discovers it): each single-item call, public and native.
CASE_NAMES = ("cosine_topk Q=1 N=1000", "cosine_topk Q=1 N=1000 native", "faiss IndexFlatIP Q=1 N=1000",
              "tree_search greedy Q=1 N=10^4", "tree_search greedy Q=1 N=10^4 native",
              "tree_search beam (5,10) Q=1 N=10^4", "StreamingSegmenter.push D=768", "StreamingSegmenter.push D=768 native")


def _single_item_cases() -> dict:
    import faiss

    tree_mod, _ = load_native("cpu", "tree")
    keys, queries = hierarchy(10_000, seed=1)
    q, k1000 = queries[:1].contiguous(), keys[:1000].contiguous()
    flat = faiss.IndexFlatIP(DIM)
    flat.add(k1000.numpy())
    tree = build_tree(keys)
    topk_args = _native_topk_args(q, k1000)
    greedy_args, _ = _native_search_args(tree, q)
    seg = sk.StreamingSegmenter()
    frame = torch.randn(768, generator=torch.Generator().manual_seed(0))
    seg.push(frame)
    seg.push(frame)
    frame_view = view(frame)
    return {
        CASE_NAMES[0]: lambda: sk.cosine_topk(q, k1000, TOPK),
        CASE_NAMES[1]: lambda: tree_mod.cosine_topk(*topk_args),
        CASE_NAMES[2]: lambda: flat.search(q.numpy(), TOPK),
        CASE_NAMES[3]: lambda: sk.tree_search(tree, q),
        CASE_NAMES[4]: lambda: tree_mod.greedy(*greedy_args),
        CASE_NAMES[5]: lambda: sk.tree_search(tree, q, beam=(5, 10), k=TOPK),
        CASE_NAMES[6]: lambda: seg.push(frame),
        CASE_NAMES[7]: lambda: seg._fast_step(frame_view, seg.frames_seen),
    }


try:
    import pytest

    @pytest.fixture(scope="module")
    def single_item_cases():
        pytest.importorskip("faiss")
        if load_native("cpu", "tree")[0] is None:
            pytest.skip("the C++ backend is not built")
        return _single_item_cases()

    @pytest.mark.parametrize("name", CASE_NAMES)
    def test_single_item(benchmark, single_item_cases, name):
        benchmark.group = "latency-single-item"
        benchmark.extra_info["case"] = name
        benchmark(single_item_cases[name])
except ImportError:  # the script form needs no pytest
    pass


if __name__ == "__main__":
    print(main())
