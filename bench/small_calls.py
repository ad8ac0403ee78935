"""Small calls: each op at the sizes a seed system's loop calls it with, beside the plain code it replaces.

Run:  .venv/bin/python -m bench.small_calls [--threads 1,2] [--seconds 0.3] [--ops topk,depth] [--out FILE]
      python -m bench.quality run small_calls   # the same, saved for the record

A loop that calls us once per frame, segment or question pays our per-call cost every time; below some
size the plain numpy or Python code the loop would otherwise run is faster.  For each op this sweeps the
size upwards and, at each size and thread count (``torch.set_num_threads``, which the C++ kernels follow;
faiss, OpenCV and scikit-learn get the same count), alternates single calls of ours and of each plain
implementation for ``--seconds`` (at least 15 calls each), reporting wall p20 / p50 / p80 per call in
microseconds.  ``ours / plain`` is our best p50 over the fastest plain p50 (below 1: ours is faster);
"plain wins below" names the smallest size at which ours is at or below the plain code, when a smaller
one is not.  Each plain implementation computes what ours computes, and the script checks that it does
(same ids up to exact ties, same values within float32 rounding) before timing it.

Ops (D = 384 for retrieval, seeded random data):

* ``topk``: one query's top-10 by cosine over N keys: ours ``CosineIndex.search`` (keys prepared once,
  as faiss's and numpy's are) and the stateless ``cosine_topk``; plain: numpy over prepared unit keys
  (a matrix-vector product, ``argpartition``, ``argsort`` of the k) and faiss ``IndexFlatIP``.
* ``videoagent``: one VideoAgent round, the top-4 frames of each of 10 segments for its own query, over
  F frames: ours ``CosineIndex.search(ranges=...)`` and ``cosine_topk(ranges=...)``; plain: VideoAgent's
  numpy loop over its prepared unit frames (a product and a stable ``argsort`` per segment).
* ``depth``: ``depth_scores`` over M similarities (one segmenter window) vs the climb rule in pure Python.
* ``divergence``: ``divergence_point`` of one caption of L log-probs vs Eq. 9-10 in numpy.
* ``logprobs``: ``token_logprobs`` of T rows over a 32,000-token vocabulary vs torch's
  ``log_softmax(...).gather(...)``, the line it replaces.
* ``motion``: ``motion_magnitude`` of one RGB pair at S x 3S/4 (``size=S``) vs OpenCV DIS ULTRAFAST
  on the same pair, gray conversion included (a different algorithm: the peer users come from).
* ``kmeans``: ``batched_kmeans`` of N points in 64-d into 4 clusters (10 Lloyd iterations, one
  problem) vs scikit-learn ``KMeans(n_init=1, max_iter=10)`` (its own k-means++ and stopping rule: a
  peer, not the same computation, so no agreement check).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import streammem_kernels as sk  # before torch: the package's OpenMP wait policy applies  # isort: skip

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench import quality  # noqa: E402
from bench.bench_load import python_depths, unit  # noqa: E402
from bench.timing import alternate, fmt, optional, set_threads  # noqa: E402

DIM = 384


def _same_ids(ours: np.ndarray, theirs: np.ndarray, scores: np.ndarray) -> bool:
    """Equal ids, or ids that differ only among keys whose scores tie within float32 rounding."""
    if np.array_equal(ours, theirs):
        return True
    return bool(np.allclose(np.sort(scores[..., ours], axis=-1), np.sort(scores[..., theirs], axis=-1), atol=1e-6))


# --------------------------------------------------------------------------
# Ops: name -> (sizes, size label, make(size) -> (ours {name: fn}, plain {name: fn}))
# --------------------------------------------------------------------------
def topk_case(n: int, k: int = 10):
    g = np.random.default_rng(n)
    keys, q = g.standard_normal((n, DIM), dtype=np.float32), g.standard_normal((1, DIM), dtype=np.float32)
    keys_t, q_t = torch.from_numpy(keys), torch.from_numpy(q)
    index = sk.CosineIndex(DIM)
    index.add(keys_t)
    unit_keys, k_eff = unit(keys), min(k, n)

    def numpy_topk():
        sims = unit_keys @ unit(q[0])
        top = np.argpartition(-sims, k_eff - 1)[:k_eff] if k_eff < n else np.arange(n)
        return top[np.argsort(-sims[top], kind="stable")]

    ours = {"CosineIndex.search": lambda: index.search(q_t, k),
            "cosine_topk": lambda: sk.cosine_topk(q_t, keys_t, k)}
    plain = {"numpy": numpy_topk}
    faiss = optional("faiss")
    if faiss is not None:
        flat = faiss.IndexFlatIP(DIM)
        flat.add(unit_keys)
        plain["faiss IndexFlatIP"] = lambda: flat.search(unit(q), k)
    scores = unit_keys @ unit(q[0])
    got = index.search(q_t, k).ids[0, :k_eff].numpy()
    assert _same_ids(got, numpy_topk(), scores), "numpy top-k disagrees with CosineIndex"
    return ours, plain


def videoagent_case(frames: int, segments: int = 10, k: int = 4):
    g = np.random.default_rng(frames)
    feats, queries = (g.standard_normal((frames, DIM), dtype=np.float32),
                      g.standard_normal((segments, DIM), dtype=np.float32))
    edges = np.linspace(0, frames, segments + 1).astype(np.int64)
    bounds = np.stack([edges[:-1], edges[1:]], 1)
    feats_t, queries_t, ranges_t = torch.from_numpy(feats), torch.from_numpy(queries), torch.from_numpy(bounds)
    index = sk.CosineIndex(DIM)
    index.add(feats_t)  # ids = frame numbers, so an id range is a segment
    unit_frames = unit(feats)

    def numpy_round():
        out = []
        for q, (lo, hi) in zip(unit(queries), bounds):
            out.append(lo + np.argsort(-(unit_frames[lo:hi] @ q), kind="stable")[:k])
        return out

    got = index.search(queries_t, k, ranges=ranges_t).ids.numpy()
    for s, (want, (lo, hi)) in enumerate(zip(numpy_round(), bounds)):
        scores = unit_frames @ unit(queries[s])
        assert _same_ids(got[s, :len(want)], want, scores), "numpy round disagrees with CosineIndex"
    return ({"CosineIndex.search(ranges)": lambda: index.search(queries_t, k, ranges=ranges_t),
             "cosine_topk(ranges)": lambda: sk.cosine_topk(queries_t, feats_t, k, ranges=ranges_t)},
            {"numpy loop": numpy_round})


def depth_case(m: int):
    sims = np.random.default_rng(m).random(m).astype(np.float32)
    sims_t, sims_list = torch.from_numpy(sims), sims.tolist()
    np.testing.assert_allclose(sk.depth_scores(sims_t).numpy(), python_depths(sims_list), atol=1e-6)
    return {"depth_scores": lambda: sk.depth_scores(sims_t)}, {"pure Python": lambda: python_depths(sims_list)}


def numpy_divergence(lp: np.ndarray, delta: int = 20, alpha: float = 0.85, beta: float = 1.0) -> int:
    """Eq. 9-10 in numpy: the first j > delta whose drop below the mean of the delta values before it
    exceeds max(alpha |mean|, beta); L when none does."""
    n = lp.shape[0]
    if n <= delta + 1:
        return n
    csum = np.concatenate([[0.0], np.cumsum(lp)])
    j = np.arange(delta + 1, n)
    mu = (csum[j] - csum[j - delta]) / delta
    hit = np.flatnonzero(mu - lp[j] > np.maximum(alpha * np.abs(mu), beta))
    return int(j[hit[0]]) if hit.size else n


def divergence_case(length: int):
    g = np.random.default_rng(length)
    lp = -g.random(length) * 0.5
    lp[int(length * 0.8):] -= 3.0  # a drop near the end, as a caption that starts to hallucinate
    lp_t = torch.from_numpy(lp)
    assert int(sk.divergence_point(lp_t)) == numpy_divergence(lp), "numpy divergence point disagrees"
    return {"divergence_point": lambda: sk.divergence_point(lp_t)}, {"numpy": lambda: numpy_divergence(lp)}


def logprobs_case(rows: int, vocab: int = 32_000):
    g = torch.Generator().manual_seed(rows)
    logits, targets = torch.randn(rows, vocab, generator=g), torch.randint(0, vocab, (rows,), generator=g)

    def plain():
        return torch.log_softmax(logits, dim=-1).gather(1, targets[:, None])[:, 0]

    torch.testing.assert_close(sk.token_logprobs(logits, targets), plain(), atol=1e-4, rtol=1e-5)
    return {"token_logprobs": lambda: sk.token_logprobs(logits, targets)}, {"torch log_softmax + gather": plain}


def motion_case(side: int):
    g = np.random.default_rng(side)
    height = side * 3 // 4
    base = (g.random((height + 8, side + 8, 3)) * 255).astype(np.uint8)
    pair = np.stack([base[:height, :side], base[2:height + 2, 3:side + 3]])
    pair_t = torch.from_numpy(pair)
    ours = {"motion_magnitude": lambda: sk.motion_magnitude(pair_t, size=side)}
    cv2 = optional("cv2")
    if cv2 is None:
        return ours, {}
    dis = cv2.DISOpticalFlow_create(cv2.DISOPTICAL_FLOW_PRESET_ULTRAFAST)

    def opencv():
        a, b = (cv2.cvtColor(f, cv2.COLOR_RGB2GRAY) for f in pair)
        flow = dis.calc(a, b, None)
        return float(cv2.magnitude(flow[..., 0], flow[..., 1]).mean())

    return ours, {"OpenCV DIS ultrafast": opencv}


def kmeans_case(n: int, k: int = 4, dim: int = 64):
    g = np.random.default_rng(n)
    pts = g.standard_normal((n, dim), dtype=np.float32)
    pts_t = torch.from_numpy(pts)[None]
    ours = {"batched_kmeans": lambda: sk.batched_kmeans(pts_t, k, iters=10, random_state=0)}
    sklearn = optional("sklearn.cluster")
    if sklearn is None:
        return ours, {}
    from sklearn.cluster import KMeans

    return ours, {"scikit-learn KMeans": lambda: KMeans(k, n_init=1, max_iter=10, random_state=0).fit(pts)}


OPS = {
    "topk": ((10, 30, 100, 300, 1_000, 3_000, 10_000), "N keys", topk_case),
    "videoagent": ((60, 120, 250, 502, 1_000, 3_600, 10_800), "F frames", videoagent_case),
    "depth": ((4, 8, 16, 32, 64, 256, 1_024), "M values", depth_case),
    "divergence": ((16, 32, 64, 256, 1_024, 4_096), "L tokens", divergence_case),
    "logprobs": ((1, 2, 4, 16, 64), "T rows (V = 32,000)", logprobs_case),
    "motion": ((32, 64, 112, 160, 224), "S px wide", motion_case),
    "kmeans": ((16, 64, 256, 1_024, 4_096), "N points (D = 64, k = 4)", kmeans_case),
}


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------
def crossover(points: list[tuple[int, float]]) -> tuple[str, str]:
    """From (size, ours/plain) in increasing size: (the sizes where the plain code wins, the size from which
    ours is at or below it at every larger size)."""
    losing = [size for size, ratio in points if ratio > 1.0]
    if not losing:
        return "none", f"{points[0][0]:,} (every size)"
    above = [size for size, ratio in points if ratio <= 1.0 and size > max(losing)]
    return ", ".join(f"{s:,}" for s in losing), f"{above[0]:,}" if above else f"beyond {points[-1][0]:,}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--seconds", type=float, default=0.3, help="seconds of alternating calls per size")
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma-separated, of {', '.join(OPS)}")
    ap.add_argument("--out", help="also write the tables (markdown) here")
    args = ap.parse_args(argv)
    ops = args.ops.split(",")
    unknown = [op for op in ops if op not in OPS]
    if unknown:
        ap.error(f"--ops: unknown {unknown}; choose from {', '.join(OPS)}")
    threads_list = [int(t) for t in args.threads.split(",")]
    started, load_before = time.time(), quality.load_average()
    rows, summary, lines = [], [], []
    for op in ops:
        sizes, size_label, make = OPS[op]
        cases = {size: make(size) for size in sizes}
        for threads in threads_list:
            set_threads(threads)
            points = []
            for size, (ours, plain) in cases.items():
                load0 = os.getloadavg()[0]
                names = list(ours) + list(plain)
                times = dict(zip(names, alternate(list(ours.values()) + list(plain.values()), args.seconds, min_rounds=15)))
                best_ours = min(times[n][1] for n in ours)
                best_plain = min((times[n][1] for n in plain), default=None)
                ratio = best_ours / best_plain if best_plain else None
                if ratio is not None:
                    points.append((size, ratio))
                row = {"op": op, "threads": threads, "size": f"{size:,}",
                       "ours": "; ".join(f"{n}: {fmt(times[n])}" for n in ours),
                       "plain": "; ".join(f"{n}: {fmt(times[n])}" for n in plain) or "-",
                       "ratio": "-" if ratio is None else f"{ratio:.2f}",
                       "load": f"{load0:.1f}-{os.getloadavg()[0]:.1f}"}
                rows.append(row)
                line = " | ".join(str(v) for v in row.values())
                lines.append(line)
                print(line, flush=True)
            if points:
                wins, from_size = crossover(points)
                summary.append({"op": op, "size": size_label, "threads": threads, "plain_wins": wins,
                                "crossover": from_size, "largest": f"{points[-1][1]:.2f} at {points[-1][0]:,}"})
    for s in summary:
        print(f"{s['op']} ({s['size']}), {s['threads']} thread(s): plain code wins at {s['plain_wins']}; ours at or "
              f"below it from {s['crossover']}")
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    if quality.saving():
        quality.save("small_calls", [
            {"title": "Where the plain code stops winning", "columns": [
                quality.column("op", "op"), quality.column("size", "size"), quality.column("threads", "threads", "int"),
                quality.column("plain_wins", "the plain code wins at"),
                quality.column("crossover", "ours at or below it from"),
                quality.column("largest", "ours / plain at the largest size")], "rows": summary},
            {"title": "Per size: wall time per call, p20 / p50 / p80 (us)", "columns": [
                quality.column("op", "op"), quality.column("threads", "threads", "int"), quality.column("size", "size"),
                quality.column("ours", "ours"), quality.column("plain", "plain code"),
                quality.column("ratio", "ours / plain (best p50s)"), quality.column("load", "load average")],
             "rows": rows}],
            about="Each op swept upwards in size at 1 and 2 threads; at each size single calls of ours and of the "
                  "plain numpy / Python / torch code the loop would otherwise run alternate for --seconds; the "
                  "script checks that the plain code computes what ours does (kmeans excepted: scikit-learn is a "
                  "peer with its own initialisation). See bench/small_calls.py's docstring for each op's plain "
                  "code. Timings: only rows of one run compare.",
            started=started, load_before=load_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
