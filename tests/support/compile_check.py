"""Compile every public function of streammem_kernels with ``torch.compile(fullgraph=True)`` in this
process and compare each with its eager call.

Run by ``tests/kernels/test_compile.py`` in a fresh interpreter, so that nothing of the package was
imported, loaded or warmed before the first trace; from the repository root:

    python -m tests.support.compile_check --device cpu [--backend inductor] [--only NAME ...] [--again [NAME ...]]

Prints one JSON object per line, per case: ``name``, ``graphs`` (graphs compiled for the first call),
``graphs_again`` (for the call on larger inputs, ``--again``), ``breaks`` (graph breaks Dynamo
counted), ``error`` (None, or what compiling or running raised), ``mismatch`` (None, or how the
compiled result differs from the eager one) and ``seconds``.  Every case runs with ``fullgraph=True``,
so a graph break is an error, not a second graph.

Three further kinds of line: ``refusal`` cases, the public functions that return Python objects read
from the tensors (``select_frames``, ``detect_boundaries``, ``backend_report``): ``refused`` (whether
``fullgraph=True`` raised naming what to use instead) and ``mismatch`` of the call compiled without
``fullgraph`` (it breaks the graph and runs eagerly); and ``mutated`` cases: a compiled search of a
``CosineTree`` called again after the tree changed, against an eager search of the changed tree; and
``bad values``: a compiled call whose value check (an assertion in the graph) must still refuse.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

# The tolerance of a compiled result against the eager one: the graph runs the same backend through
# its registered custom op, so ids, labels and decisions must match exactly; floating results may
# differ by the rounding of the torch ops the compiler fuses around the op (gray resizing, scaling).
ATOL, RTOL = 1e-5, 1e-5


def _tree(device):
    from streammem_kernels import CosineTree

    g = torch.Generator().manual_seed(3)
    tree = CosineTree(8, device=device)
    tree.add_leaves(torch.randn(24, 8, generator=g).to(device))
    tree.grow(4)
    return tree


def _graph(device):
    from streammem_kernels import CSRGraph

    src = torch.tensor([0, 0, 1, 2, 3, 4, 5, 6, 7, 8])
    dst = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 9, 0])
    return CSRGraph.from_edges(src.to(device), dst.to(device), 10, symmetric=True)


def _chunk_map(device):
    from streammem_kernels import CSRGraph

    nodes = torch.arange(10)
    return CSRGraph.from_edges(nodes.to(device), (nodes // 3).to(device), 10, num_cols=4)


def cases(device: torch.device, grow: int = 0) -> dict:
    """name -> (function, positional arguments): one call of each public function (``grow`` > 0: the
    same calls on larger inputs).  Functions that return Python objects built from host values
    (``select_frames``, ``detect_boundaries``) are absent: their device-resident forms
    (``select_frames_mask``, ``event_ends``) are here."""
    import streammem_kernels as sk

    g = torch.Generator().manual_seed(grow)

    def rand(*shape, dtype=torch.float32):
        return torch.rand(*shape, generator=g).to(device=device, dtype=dtype)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device)

    n = grow
    frames_u8 = (rand(5 + n, 36 + n, 44 + 2 * n, 3) * 255).to(torch.uint8)
    frames_f32 = rand(4 + n, 30 + n, 30 + 2 * n)
    tree, graph, chunk_map = _tree(device), _graph(device), _chunk_map(device)
    seeds = torch.tensor([[0, 5], [3, -1], [9, 9]][:2 + min(n, 1)], device=device)
    logits = randn(2, 5 + n, 33 + n)
    targets = torch.randint(0, 33, (2, 5 + n), generator=g).to(device)
    ranges = torch.tensor([[0, 40], [5, 20]] * 4 + [[0, 1]] * (1 + n), device=device)
    return {
        "motion_magnitude": (lambda f: sk.motion_magnitude(f, size=32), (frames_u8,)),
        "motion_magnitude[float]": (lambda f: sk.motion_magnitude(f, window=None), (frames_f32,)),
        "select_frames_mask": (lambda f: sk.select_frames_mask(f, 0.2), (frames_u8,)),
        "select_frames_mask[last_kept]": (lambda f: sk.select_frames_mask(f, 0.2, reference="last_kept"),
                                          (frames_f32,)),
        "batched_kmeans": (lambda x: sk.batched_kmeans(x, 3, iters=6), (randn(2 + n, 40 + n, 5),)),
        "batched_kmeans[weights,lengths,random]": (
            lambda x, w, lengths: sk.batched_kmeans(x, 3, init="random", weights=w, lengths=lengths,
                                                    metric="cosine", random_state=7),
            (randn(2, 30 + n, 4), rand(2, 30 + n) + 0.1, torch.tensor([30 + n, 9], device=device))),
        "kmeans_frames": (lambda f: sk.kmeans_frames(f, 2, iters=4), (randn(2, 6 + n, 3, 4),)),
        "cosine_topk": (lambda q, k: sk.cosine_topk(q, k, 4), (randn(3 + n, 16), randn(50 + n, 16))),
        "cosine_topk[ranges,torch]": (lambda q, k, r: sk.cosine_topk(q, k, 3, ranges=r, backend="torch"),
                                      (randn(9 + n, 16), randn(40 + n, 16), ranges)),
        "tree_search": (lambda q: sk.tree_search(tree, q), (randn(3 + n, 8),)),
        "tree_search[beam]": (lambda q: sk.tree_search(tree, q, beam=2, k=3), (randn(3 + n, 8),)),
        "khop_neighbourhood": (lambda s: sk.khop_neighbourhood(graph, s, 2, capacity=8), (seeds,)),
        "khop_neighbourhood[torch]": (lambda s: sk.khop_neighbourhood(graph, s, 1, capacity=8, backend="torch"),
                                      (seeds,)),
        "neighbourhood_chunks": (lambda s: sk.neighbourhood_chunks(s, chunk_map, capacity=4), (seeds,)),
        "graph_retrieve": (lambda q, e: sk.graph_retrieve(q, e, graph, k=2, hops=1, capacity=6, chunk_map=chunk_map,
                                                          min_score=-0.5), (randn(2 + n, 6), randn(10, 6))),
        "token_logprobs": (sk.token_logprobs, (logits, targets)),
        "linear_token_logprobs": (sk.linear_token_logprobs, (randn(7 + n, 12), randn(33, 12),
                                                            targets.reshape(-1)[:7 + n], randn(33))),
        "divergence_point": (lambda lp, lengths: sk.divergence_point(lp, delta=4, lengths=lengths),
                             (-rand(3, 30 + n) * 3, torch.tensor([30, 12, 0], device=device))),
        "adjacent_cosine": (sk.adjacent_cosine, (randn(2, 9 + n, 6),)),
        "depth_scores": (sk.depth_scores, (rand(11 + n),)),
        "event_ends": (lambda f: sk.event_ends(f, window=4), (randn(20 + n, 6),)),
        "event_ends[drift]": (lambda f: sk.event_ends(f, drift=0.1, max_event=5), (randn(2, 12 + n, 6),)),
    }


def refusals(device: torch.device) -> dict:
    """name -> (function, positional arguments, the text the refusal must carry)."""
    import streammem_kernels as sk

    g = torch.Generator().manual_seed(5)
    frames = (torch.rand(5, 36, 44, 3, generator=g) * 255).to(device=device, dtype=torch.uint8)
    features = torch.randn(24, 6, generator=g).to(device)
    return {
        "select_frames": (lambda f: sk.select_frames(f, 0.2), (frames,), "use select_frames_mask"),
        "detect_boundaries": (lambda f: sk.detect_boundaries(f, window=4), (features,), "use event_ends"),
        "backend_report": (lambda: sk.backend_report().to_dict(), (), "outside torch.compile"),
    }


def _run_refusal(name, fn, args, words, compiler) -> dict:
    refused = False
    error = mismatch = None
    try:
        torch.compile(fn, backend=compiler, fullgraph=True)(*args)
        error = "fullgraph=True did not raise"
    except Exception as exc:
        refused = words in str(exc) and name in str(exc)
        if not refused:
            error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:400]}"
    try:
        mismatch = _mismatch(fn(*args), torch.compile(fn, backend=compiler)(*args))
    except Exception as exc:
        error = f"without fullgraph: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:400]}"
    return {"refused": refused, "error": error, "mismatch": mismatch}


def _run_mutated(device, compiler) -> dict:
    """Compiled tree searches see the tree's later additions (the snapshot guards the graph)."""
    import streammem_kernels as sk

    g = torch.Generator().manual_seed(11)
    tree = _tree(device)
    queries = torch.randn(4, 8, generator=g).to(device)
    greedy = torch.compile(lambda q: sk.tree_search(tree, q), backend=compiler, fullgraph=True)
    beam = torch.compile(lambda q: sk.tree_search(tree, q, beam=2, k=3), backend=compiler, fullgraph=True)
    mismatch = _mismatch(sk.tree_search(tree, queries), greedy(queries))
    before = sk.tree_search(tree, queries, beam=2, k=3)
    mismatch = mismatch or _mismatch(before, beam(queries))
    tree.add_leaves(queries * 3.0)  # the queries' own directions: the searches must now find them
    tree.grow(4)
    after = sk.tree_search(tree, queries, beam=2, k=3)
    mismatch = mismatch or _mismatch(sk.tree_search(tree, queries), greedy(queries))
    mismatch = mismatch or _mismatch(after, beam(queries))
    if _mismatch(before, after) is None:
        return {"error": "adding leaves did not change the search (the case checks nothing)", "mismatch": None}
    return {"error": None, "mismatch": mismatch}


def _run_bad_values(device, compiler) -> dict:
    """A value check inside the graph (a device assertion) still refuses a bad value, with the eager message."""
    import streammem_kernels as sk

    g = torch.Generator().manual_seed(12)
    queries, keys = torch.randn(3, 8, generator=g).to(device), torch.randn(20, 8, generator=g).to(device)
    ranges = torch.tensor([[0, 5], [0, 30], [2, 4]], device=device)  # 30 > N
    compiled = torch.compile(lambda q, k, r: sk.cosine_topk(q, k, 2, ranges=r, backend="torch"), backend=compiler,
                             fullgraph=True)
    try:
        compiled(queries, keys, ranges)
        if queries.is_cuda:  # on CUDA the assertion fails asynchronously, as eagerly (and ends the context:
            torch.cuda.synchronize()  # this case runs last); its message goes to stderr from the device
    except RuntimeError as exc:
        if "ranges must satisfy" in str(exc) or (queries.is_cuda and "device-side assert" in str(exc)):
            return {"error": None, "mismatch": None}
        return {"error": f"RuntimeError without the eager message: {str(exc)[:300]}", "mismatch": None}
    return {"error": "out-of-range ranges were accepted", "mismatch": None}


def _flatten(result) -> list:
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (tuple, list)):
        return [t for item in result for t in _flatten(item)]
    return [result]


def _mismatch(expected, got) -> str | None:
    want, have = _flatten(expected), _flatten(got)
    if len(want) != len(have):
        return f"{len(have)} results, eager gave {len(want)}"
    for i, (a, b) in enumerate(zip(want, have)):
        if not isinstance(a, torch.Tensor):
            if a != b:
                return f"result {i}: {b!r}, eager gave {a!r}"
            continue
        if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
            return f"result {i}: {_describe(b)}, eager gave {_describe(a)}"
        if a.is_floating_point():
            if not torch.allclose(a, b, atol=ATOL, rtol=RTOL, equal_nan=True):
                return f"result {i}: differs by up to {(a - b).abs().nan_to_num().max().item():.3g}"
        elif not torch.equal(a, b):
            return f"result {i}: {b.tolist()}, eager gave {a.tolist()}"
    return None


def _describe(t) -> str:
    if isinstance(t, torch.Tensor):
        return f"{tuple(t.shape)} {t.dtype} {t.device}"
    return repr(t)


def run(device: torch.device, backend: str, only: list[str] | None, again: list[str] | None) -> None:
    import torch._dynamo
    from torch._dynamo.utils import counters

    compiler = torch._dynamo.lookup_backend(backend)
    table = cases(device)
    larger = cases(device, grow=3) if again is not None else {}
    for name, (fn, args) in table.items():
        if only and name not in only:
            continue
        graphs = []

        def counting(gm, example_inputs, _graphs=graphs):
            _graphs.append(gm)
            return compiler(gm, example_inputs)

        counters.clear()
        start = time.perf_counter()
        error = mismatch = first = None
        try:
            compiled = torch.compile(fn, backend=counting, fullgraph=True)
            mismatch = _mismatch(fn(*args), compiled(*args))
            first = len(graphs)
            if again is not None and (not again or name in again) and mismatch is None:
                mismatch = _mismatch(fn(*larger[name][1]), compiled(*larger[name][1]))
        except Exception as exc:  # reported, and the next case still runs
            error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:400]}"
            detail = str(exc).split("Developer debug context:")
            if len(detail) > 1:
                error += " |" + detail[1].splitlines()[0][:300]
        breaks = sum(counters["graph_break"].values())
        first = len(graphs) if first is None else first
        print(json.dumps({"name": name, "graphs": first, "graphs_again": len(graphs) - first, "breaks": breaks,
                          "error": error, "mismatch": mismatch, "seconds": round(time.perf_counter() - start, 2)}),
              flush=True)
    for name, (fn, args, words) in refusals(device).items():
        if only and name not in only:
            continue
        start = time.perf_counter()
        line = {"name": name, "kind": "refusal", **_run_refusal(name, fn, args, words, compiler)}
        print(json.dumps({**line, "seconds": round(time.perf_counter() - start, 2)}), flush=True)
    for name, kind, check in (("tree_search[mutated]", "mutated", _run_mutated),
                              ("cosine_topk[bad ranges]", "bad values", _run_bad_values)):
        if only and name not in only:
            continue
        start = time.perf_counter()
        line = {"name": name, "kind": kind}
        try:
            line.update(check(device, compiler))
        except Exception as exc:
            line.update(error=f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:400]}", mismatch=None)
        print(json.dumps({**line, "seconds": round(time.perf_counter() - start, 2)}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (inductor, aot_eager, eager)")
    parser.add_argument("--only", nargs="*", help="case names to run (default: every case)")
    parser.add_argument("--again", nargs="*", metavar="NAME",
                        help="call the compiled functions of these cases (no name: of every case) a second time "
                             "on larger inputs (a recompile, with dynamic shapes)")
    args = parser.parse_args()
    start = time.perf_counter()
    run(torch.device(args.device), args.backend, args.only, args.again)
    print(json.dumps({"total_seconds": round(time.perf_counter() - start, 2)}), flush=True)


if __name__ == "__main__":
    main()
