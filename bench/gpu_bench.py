"""GPU roofline benchmark: every op's GPU backends against GPU peers, with the bytes and FLOPs of each case.

    python bench/gpu_bench.py peaks --out peaks.json          # copy bandwidth and matmul rates of this GPU
    python bench/gpu_bench.py run tree --out rows.jsonl       # one suite; a JSON line per case as it ends
    python bench/gpu_bench.py run tree --device cpu --small   # the same code on CPU at toy sizes (a dry run)

``bench/gpu.sh`` (the one-shot GPU run, ``bench/gpu_oneshot.py``) runs each suite in
its own process under a time cap; the rows a suite wrote before it was stopped are
kept.  Within a suite our backends come first, then the eager peers, then the
``torch.compile`` peers (whose first call compiles), so a cap costs the slowest rows.

Each case records the bytes it must move and the FLOPs it must do: the compulsory
traffic (inputs read once, outputs written once) and the arithmetic of the
algorithm, counted by the formula next to the case, identical for every provider
of one group.  Divided by the median time they give the achieved rates, which
the report puts next to the measured peaks (``peaks``: device-to-device copy,
matmul in float32, TF32 and bfloat16).  Timings are CUDA events around each call
after one warm-up call (that call's time, compile included, is ``warmup_s``):
the median and p20/p80 of at least 5 calls, at most 0.3 s or 200 calls.

A peer that is not installed (fast-pytorch-kmeans) gives a ``skipped`` row with
the reason; a case that raises gives an ``error`` row and the suite goes on.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

SUITES = ("motion", "kmeans", "tree", "graph", "boundaries", "logprobs")


@dataclass
class Case:
    """One timed call: ``fn()`` on ``device`` with its compulsory ``bytes`` and ``flops``."""

    group: str
    provider: str
    fn: Callable[[], object]
    bytes: float
    flops: float
    dtype: str = "float32"
    kind: str = "ours"  # "ours" or "peer"
    info: dict = field(default_factory=dict)


@dataclass
class Skip:
    group: str
    provider: str
    reason: str
    kind: str = "peer"


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn, device: torch.device, budget_s: float = 0.3, min_calls: int = 5, max_calls: int = 200) -> dict:
    t0 = time.perf_counter()
    fn()
    sync(device)
    warmup_s = time.perf_counter() - t0
    times: list[float] = []
    stop = time.perf_counter() + budget_s
    while len(times) < max_calls and (len(times) < min_calls or time.perf_counter() < stop):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    times.sort()

    def pct(p):
        return times[min(len(times) - 1, int(round(p / 100 * (len(times) - 1))))]

    return {"median_s": pct(50), "p20_s": pct(20), "p80_s": pct(80), "calls": len(times), "warmup_s": warmup_s}


def compiled(fn):
    """``torch.compile`` of a peer (static shapes: each case compiles once)."""
    return torch.compile(fn, dynamic=False)


def unavailable(op, backend: str, device: torch.device) -> str | None:
    """Why ``backend`` of ``op`` (an ``Op`` of streammem_kernels) cannot run on ``device`` (None: it can)."""
    if backend == "auto":
        return None if op.available(device) else f"no backend of {op.name} runs on {device.type}"
    if backend not in op.impls:
        return f"{op.name} has no {backend} backend"
    reasons = op.reasons(backend, device)
    return "; ".join(reasons) if reasons else None


def ours(op, backends, device: torch.device, group: str, make, nbytes: float, flops: float,
         dtype: str = "float32", **info) -> Iterator[Case | Skip]:
    """One case per backend of ``op`` that exists: ``make(backend)`` returns the call."""
    for backend in backends:
        if backend != "auto" and backend not in op.impls:
            continue
        why = unavailable(op, backend, device)
        if why:
            yield Skip(group, f"ours-{backend}", why, kind="ours")
        else:
            yield Case(group, f"ours-{backend}", make(backend), nbytes, flops, dtype, "ours", dict(info))


GPU_BACKENDS = ("auto", "triton", "cuda", "torch")


def randn(*shape, seed: int, device: torch.device) -> torch.Tensor:
    """Gaussian data made on ``device`` itself (gigabytes made on the host would cost seconds)."""
    return torch.randn(*shape, generator=torch.Generator(device=device).manual_seed(seed), device=device)


# --------------------------------------------------------------------------
# Suites: each yields its cases in the order they run
# --------------------------------------------------------------------------
def suite_tree(device: torch.device, small: bool) -> Iterator[Case | Skip]:
    """cosine_topk and the tree searches against torch.topk(q @ k.T), eager and compiled."""
    from streammem_kernels import CosineTree, cosine_topk, tree_search
    from streammem_kernels.tree.search import TREE_SEARCH
    from streammem_kernels.tree.topk import COSINE_TOPK

    dim, k, group_size = 384, 10, 10
    sizes = [(2_000, 8)] if small else [(1_000_000, 1), (1_000_000, 64), (100_000, 1024)]
    peers_compiled, key_sets = [], {}
    for n, q in sizes:
        if n not in key_sets:  # the query counts of one N share its keys
            key_sets[n] = F.normalize(randn(n, dim, seed=n, device=device), dim=1)
        keys = key_sets[n]
        queries = F.normalize(randn(q, dim, seed=q, device=device), dim=1)
        group = f"topk-N{n}-Q{q}"
        # Compulsory: the keys and queries read once, k (id, score) pairs written per query.
        nbytes, flops = 4 * (n + q) * dim + 12 * q * k, 2 * q * n * dim
        yield from ours(COSINE_TOPK, GPU_BACKENDS, device, group,
                        lambda b: (lambda: cosine_topk(queries, keys, k, backend=b)), nbytes, flops, N=n, Q=q)

        def topk_matmul(qq, kk):
            return torch.topk(qq @ kk.T, k, dim=1)

        yield Case(group, "torch.topk(q @ k.T)", lambda: topk_matmul(queries, keys), nbytes, flops, kind="peer")
        peers_compiled.append((group, queries, keys, nbytes, flops, topk_matmul))
    for group, queries, keys, nbytes, flops, fn in peers_compiled:
        peer = compiled(fn)
        yield Case(group, "torch.compile(topk(q @ k.T))", lambda p=peer, a=queries, b=keys: p(a, b), nbytes, flops,
                   kind="peer")
    # Tree searches over a tree grown on the GPU (g = 10): greedy reads about group_size
    # children per level, the beam (5, 10) about 5 x group_size (a model, not a count).
    n, q = (2_000, 8) if small else (1_000_000, 64)
    del key_sets, peers_compiled
    keys = F.normalize(randn(n, dim, seed=1, device=device), dim=1)
    queries = F.normalize(keys[:q] + 0.05 * randn(q, dim, seed=2, device=device), dim=1)
    tree = CosineTree(dim, capacity=n + n // (group_size - 1) + 16, device=device)
    tree.add_leaves(keys)
    tree.grow(group_size)
    levels = max(1, math.ceil(math.log(n, group_size)))
    for name, beam, width in (("greedy", None, 1), ("beam-5-10", (5, 10), 5)):
        visited = q * width * group_size * levels
        group = f"tree-{name}-N{n}-Q{q}"
        call = (lambda b: (lambda: tree_search(tree, queries, backend=b))) if beam is None else \
            (lambda b, beam=beam: (lambda: tree_search(tree, queries, beam=beam, k=k, backend=b)))
        backends = [b for b in GPU_BACKENDS if not (beam and b == "cuda")]  # the CUDA kernel is greedy only
        yield from ours(TREE_SEARCH, backends, device, group, call,
                        4 * visited * dim, 2 * visited * dim, N=n, Q=q)


def suite_kmeans(device: torch.device, small: bool) -> Iterator[Case | Skip]:
    """batched_kmeans against a batched torch Lloyd loop (eager, compiled) and fast-pytorch-kmeans."""
    from streammem_kernels import batched_kmeans, kmeans

    iters = 10
    regimes = {"frames": dict(B=2, N=16, D=256, k=3), "tokens": dict(B=2, N=128, D=32, k=8)} if small else {
        "frames": dict(B=64, N=40, D=65536, k=5),      # StreamChat-style: clips of frame features
        "tokens": dict(B=8, N=16384, D=128, k=256),    # token merging
        "tiny": dict(B=4096, N=64, D=64, k=8),         # many small problems
    }
    later = []
    for name, p in regimes.items():
        B, N, D, k = p["B"], p["N"], p["D"], p["k"]
        x = randn(B, N, D, seed=0, device=device)
        init = x[:, :k].clone()
        group = f"kmeans-{name}-B{B}-N{N}-D{D}-k{k}"
        # Per iteration: the points read for the assignment and again for the update, the
        # distance dot products (2BNkD) and the centre sums (BND).
        nbytes, flops = iters * 2 * 4 * B * N * D, iters * (2 * B * N * k * D + B * N * D)
        yield from ours(kmeans.LLOYD, GPU_BACKENDS, device, group,
                        lambda b: (lambda: batched_kmeans(x, k, init=init, iters=iters, tol=0.0, backend=b)),
                        nbytes, flops, B=B, N=N, D=D, k=k, iters=iters)
        yield Case(group, "torch Lloyd loop", lambda: torch_lloyd(x, init, iters), nbytes, flops, kind="peer")
        try:
            import fast_pytorch_kmeans as fpk
        except ImportError:
            yield Skip(group, "fast-pytorch-kmeans", "fast_pytorch_kmeans is not installed (make gpu-carry brings it)")
        else:
            def fpk_call():
                km = fpk.MultiKMeans(k, max_iter=iters, tol=0.0, verbose=0)
                return km.fit_predict(x, centroids=init.clone())

            yield Case(group, "fast-pytorch-kmeans MultiKMeans", fpk_call, nbytes, flops, kind="peer")
        later.append((group, x, init, nbytes, flops))
    step = compiled(lloyd_step)
    for group, x, init, nbytes, flops in later:
        yield Case(group, "torch.compile(Lloyd step) loop", lambda x=x, init=init: torch_lloyd(x, init, iters, step),
                   nbytes, flops, kind="peer")


def lloyd_step(x: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """One batched Lloyd iteration in plain torch: nearest centre, then the means (empty clusters keep theirs)."""
    dist = (centres * centres).sum(-1)[:, None, :] - 2 * torch.bmm(x, centres.transpose(1, 2))
    labels = dist.argmin(-1)
    sums = torch.zeros_like(centres).scatter_add_(1, labels[..., None].expand_as(x), x)
    counts = torch.zeros(centres.shape[:2], device=x.device, dtype=x.dtype).scatter_add_(
        1, labels, torch.ones_like(labels, dtype=x.dtype))
    return torch.where(counts[..., None] > 0, sums / counts.clamp_min(1)[..., None], centres)


def torch_lloyd(x, init, iters, step=lloyd_step):
    centres = init
    for _ in range(iters):
        centres = step(x, centres)
    return centres


def suite_graph(device: torch.device, small: bool) -> Iterator[Case | Skip]:
    """k-hop neighbourhoods: ours (Triton, one launch for every hop) against the torch reference loop."""
    from streammem_kernels import CSRGraph, graph as graph_op, khop_neighbourhood

    n, q, seeds_per_q, hops, capacity = (2_000, 8, 4, 2, 256) if small else (1_000_000, 64, 10, 2, 2048)
    g = torch.Generator(device="cpu").manual_seed(0)
    m = 4 * n
    src = torch.randint(0, n, (m,), generator=g)
    dst = (src + torch.randint(1, 33, (m,), generator=g)) % n
    graph = CSRGraph.from_edges(src, dst, n, symmetric=True).to(device)
    seeds = torch.randint(0, n, (q, seeds_per_q), generator=g).to(device)
    graph.max_degree  # read once, outside the timings (the reference pads to it)
    avg_degree = 2 * m / n
    # Compulsory, as a model: each reached node's row pointers and its edge list, read once.
    nbytes = q * capacity * (16 + 8 * avg_degree)
    group = f"khop-N{n}-Q{q}-hops{hops}"
    yield from ours(graph_op.GRAPH, GPU_BACKENDS, device, group,
                    lambda b: (lambda: khop_neighbourhood(graph, seeds, hops, capacity=capacity, backend=b)),
                    nbytes, 0.0, dtype="int64", N=n, Q=q, capacity=capacity)


def suite_boundaries(device: torch.device, small: bool) -> Iterator[Case | Skip]:
    """Adjacent cosines and whole event detection against torch's cosine_similarity, eager and compiled."""
    from streammem_kernels import StreamingSegmenter, adjacent_cosine, boundaries, detect_boundaries
    from streammem_kernels.boundaries.streaming import STREAM_STEP

    B, T, D = (2, 64, 32) if small else (64, 4096, 768)
    x = randn(B, T, D, seed=0, device=device)
    # Each feature read once, one cosine written per adjacent pair; a dot product and a
    # squared norm per element (2 + 2 FLOPs).
    nbytes, flops = 4 * B * T * D + 4 * B * (T - 1), 4 * B * T * D
    group = f"adjacent-cosine-B{B}-T{T}-D{D}"
    yield from ours(boundaries.ADJACENT_COSINE, GPU_BACKENDS, device, group,
                    lambda b: (lambda: adjacent_cosine(x, backend=b)), nbytes, flops, B=B, T=T, D=D)

    def cosine_peer(v):
        return F.cosine_similarity(v[:, :-1], v[:, 1:], dim=-1)

    yield Case(group, "F.cosine_similarity", lambda: cosine_peer(x), nbytes, flops, kind="peer")
    detect_group = f"detect-boundaries-B{B}-T{T}-D{D}"
    yield from ours(boundaries.ADJACENT_COSINE, GPU_BACKENDS, device, detect_group,
                    lambda b: (lambda: detect_boundaries(x, backend=b)), nbytes, flops, B=B, T=T, D=D)
    # The streaming push: one frame of every stream per call (the fused CUDA push is one launch).
    streams, frames = (4, 16) if small else (1000, 64)
    pushes = randn(frames, streams, 384, seed=1, device=device)
    push_group = f"streaming-push-B{streams}-D384"

    def pusher(backend):
        seg = StreamingSegmenter(backend=backend)
        state = {"t": 0}

        def push():
            seg.push_tensors(pushes[state["t"] % frames])
            state["t"] += 1

        return push

    yield from ours(STREAM_STEP, GPU_BACKENDS, device, push_group, pusher,
                    4 * streams * 384, 4 * streams * 384, streams=streams, D=384)
    peer = compiled(cosine_peer)
    yield Case(group, "torch.compile(cosine_similarity)", lambda: peer(x), nbytes, flops, kind="peer")


def suite_logprobs(device: torch.device, small: bool) -> Iterator[Case | Skip]:
    """Gathered log-probabilities against log_softmax + gather (eager, compiled), from logits and fused."""
    from streammem_kernels import linear_token_logprobs, logprobs, token_logprobs

    vocab, width = (512, 64) if small else (49_152, 576)  # SmolLM2-135M
    rows_list = (16,) if small else (1024, 8192)
    later = []

    def gather_peer(logits, targets):
        return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[:, None])[:, 0]

    def linear_peer(hidden, weight, targets):
        return gather_peer(hidden @ weight.T, targets)

    for rows in rows_list:
        for dtype in (torch.float32, torch.bfloat16):
            dname = str(dtype).replace("torch.", "")
            targets = torch.randint(0, vocab, (rows,), device=device,
                                    generator=torch.Generator(device=device).manual_seed(rows))
            logits = (3 * randn(rows, vocab, seed=rows, device=device)).to(dtype)
            size = logits.element_size()
            # The logits read once; max, subtract, exp and add per logit.
            nbytes, flops = size * rows * vocab + 12 * rows, 4 * rows * vocab
            group = f"token-logprobs-T{rows}-V{vocab}-{dname}"
            yield from ours(logprobs.TOKEN_LOGPROBS, GPU_BACKENDS, device, group,
                            lambda b, lg=logits, t=targets: (lambda: token_logprobs(lg, t, backend=b)),
                            nbytes, flops, dname, T=rows, V=vocab)
            yield Case(group, "log_softmax+gather", lambda lg=logits, t=targets: gather_peer(lg, t), nbytes, flops,
                       dname, "peer")
            if rows == rows_list[0]:  # compiled peers at one size: each shape compiles anew
                later.append((group, gather_peer, (logits, targets), nbytes, flops, dname))

            hidden = randn(rows, width, seed=rows + 1, device=device).to(dtype)
            weight = (randn(vocab, width, seed=vocab, device=device) * (3 / width ** 0.5)).to(dtype)
            # The weight and the hidden states read once; the logits' matmul and their log-softmax.
            nbytes = size * (vocab * width + rows * width) + 12 * rows
            flops = 2 * rows * width * vocab + 4 * rows * vocab
            group = f"linear-logprobs-T{rows}-V{vocab}-H{width}-{dname}"
            yield from ours(logprobs.LINEAR_TOKEN_LOGPROBS, GPU_BACKENDS, device, group,
                            lambda b, h=hidden, w=weight, t=targets: (
                                lambda: linear_token_logprobs(h, w, t, backend=b)),
                            nbytes, flops, dname, T=rows, V=vocab, H=width)
            yield Case(group, "matmul+log_softmax+gather", lambda h=hidden, w=weight, t=targets: linear_peer(h, w, t),
                       nbytes, flops, dname, "peer")
            if rows == rows_list[0]:
                later.append((group, linear_peer, (hidden, weight, targets), nbytes, flops, dname))
    for group, fn, args, nbytes, flops, dname in later:
        peer = compiled(fn)
        name = "torch.compile(log_softmax+gather)" if fn is gather_peer else "torch.compile(matmul+log_softmax+gather)"
        yield Case(group, name, lambda p=peer, a=args: p(*a), nbytes, flops, dname, "peer")


def suite_motion(device: torch.device, small: bool) -> Iterator[Case | Skip]:
    """Pyramidal Lucas-Kanade on gray frames: ours against the torch reference, eager and compiled."""
    from streammem_kernels import motion, motion_magnitude

    T, levels, window = (4, 2, 5) if small else (64, 3, 5)
    sizes = (48,) if small else (224, 448)
    later = []
    for size in sizes:
        # A smooth random texture drifting by a pixel a frame: textured everywhere, like video.
        g = torch.Generator(device="cpu").manual_seed(size)
        base = F.avg_pool2d(torch.rand(1, 1, size + T + 8, size + T + 8, generator=g), 5, 1, 2)[0, 0]
        frames = torch.stack([base[t:t + size, t:t + size] for t in range(T)])
        frames = (255 * (frames - frames.min()) / (frames.max() - frames.min())).to(torch.uint8).to(device)
        pixels = (T - 1) * size * size
        # The frames read once, three numbers per pair written; per pixel and level the
        # gradients, five products, their window sums and the 2x2 solve (~30 + 5 w^2 FLOPs),
        # the pyramid adding a third.
        nbytes = T * size * size + 12 * (T - 1)
        flops = pixels * (30 + 5 * window * window) * 4 / 3
        group = f"motion-T{T}-{size}px-levels{levels}"
        yield from ours(motion.LK_FLOW, GPU_BACKENDS, device, group,
                        lambda b, f=frames: (lambda: motion_magnitude(f, levels=levels, window=window, backend=b)),
                        nbytes, flops, "uint8", T=T, size=size, levels=levels)
        later.append((group, frames, nbytes, flops))
    reference = motion.LK_FLOW.impls["torch"]  # the reference's own torch code, for torch.compile

    def reference_flow(gray):
        return reference(gray, window, 1e-5, levels, "moving")

    peer = compiled(reference_flow)
    for group, frames, nbytes, flops in later:
        gray = frames.float() / 255.0
        yield Case(group, "torch.compile(reference)", lambda p=peer, gr=gray: p(gr), nbytes, flops, "uint8", "peer")


# --------------------------------------------------------------------------
# Peaks of this GPU
# --------------------------------------------------------------------------
def measure_peaks(device: torch.device, small: bool) -> dict:
    """Device-to-device copy bandwidth and matmul rates: the roofline's two ceilings."""
    nbytes = (1 << 20) if small else (1 << 30)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    copy = time_calls(lambda: dst.copy_(src), device, budget_s=0.5, min_calls=10)
    peaks = {"copy_bytes": 2 * nbytes, "copy_gbps": 2 * nbytes / copy["p20_s"] / 1e9}
    del src, dst
    n = 512 if small else 8192
    flops = 2 * n ** 3
    for name, dtype, tf32 in (("fp32", torch.float32, False), ("tf32", torch.float32, True),
                              ("bf16", torch.bfloat16, False)):
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        previous = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        try:
            t = time_calls(lambda: a @ b, device, budget_s=0.5)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous
        peaks[f"matmul_{name}_tflops"] = flops / t["p20_s"] / 1e12
    peaks["matmul_n"] = n
    return peaks


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------
def _device(name: str) -> torch.device:
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"no CUDA device: torch {torch.__version__} (CUDA {torch.version.cuda}) "
                         "sees none (torch.cuda.is_available() is False)")
    return device


def run_suite(name: str, device: torch.device, small: bool, out) -> int:
    """Run one suite, writing a JSON line per case as it ends; the number of cases that raised."""
    errors = 0
    cases = globals()[f"suite_{name}"](device, small)
    while True:
        try:
            case = next(cases)
        except StopIteration:
            break
        except Exception as exc:  # the suite's own set-up failed: nothing after it can run
            row = {"suite": name, "group": None, "provider": None, "status": f"error: {type(exc).__name__}: {exc}"}
            out.write(json.dumps(row) + "\n")
            out.flush()
            traceback.print_exc()
            return errors + 1
        row = {"suite": name, "group": case.group, "provider": case.provider, "kind": case.kind}
        if isinstance(case, Skip):
            row["status"] = f"skipped: {case.reason}"
        else:
            row.update(dtype=case.dtype, bytes=case.bytes, flops=case.flops, **case.info)
            try:
                row.update(time_calls(case.fn, device))
                row["status"] = "ok"
            except Exception as exc:
                errors += 1
                row["status"] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                traceback.print_exc()
        print(f"[gpu-bench] {name}: {row['group']} {row['provider']}: {row['status']}"
              + (f" {row['median_s'] * 1e3:.3f} ms" if "median_s" in row else ""), flush=True)
        out.write(json.dumps(row) + "\n")
        out.flush()
    return errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    peaks = sub.add_parser("peaks", help="copy bandwidth and matmul rates")
    run = sub.add_parser("run", help="one suite")
    run.add_argument("suite", choices=SUITES)
    for p in (peaks, run):
        p.add_argument("--out", required=True)
        p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
        p.add_argument("--small", action="store_true", help="toy sizes (a dry run of the code, not a measurement)")
    args = parser.parse_args(argv)
    device = _device(args.device)
    if args.command == "peaks":
        result = measure_peaks(device, args.small)
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=1)
        print("[gpu-bench] peaks: " + ", ".join(f"{k} {v:.4g}" for k, v in result.items()), flush=True)
        return 0
    with open(args.out, "a") as out:
        return 1 if run_suite(args.suite, device, args.small, out) else 0


if __name__ == "__main__":
    sys.exit(main())
