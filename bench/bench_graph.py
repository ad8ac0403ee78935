"""Memory-graph retrieval (top-k seeds + 2-hop expansion) vs scipy.sparse and networkx.

Run:  .venv/bin/python -m pytest bench/bench_graph.py -q -p no:cacheprovider --benchmark-json bench/results/graph.json
      (``STREAMMEM_BENCH_QUICK=1``: N in {10^3, 10^4} only)

Data, per graph size N (entities) in {10^3, 10^4, 10^5, 10^6}: a MemVerse-like
memory graph of average degree 8 -- 4N undirected edges, 90 % between entities
close in time (ids within 32 of each other: co-occurrence in nearby clips) and
10 % between uniformly random entities (facts recalled across sessions), with
random weights -- stored as :class:`CSRGraph` (``from_edges(symmetric=True)``);
D = 384 unit-norm float32 embeddings (MiniLM's width), queries = embeddings
of random entities plus noise.  Retrieval: top-10 seeds by cosine, then their
2-hop neighbourhood, uncapped (capacity 2048 per query, never reached here:
``extra_info`` records the largest count and the truncated queries), so every
method computes the same node sets; the bench checks that they do before
timing.

Methods, on the same inputs:

* ``ours graph_retrieve (auto)`` -- cosine_topk (C++) then khop_neighbourhood (C++);
* ``numpy top-k + scipy.sparse`` -- ``keys @ q`` (BLAS) with pre-normalised keys
  and ``argpartition``, then the seed indicator matrix X (N x Q) expanded as
  ``X + A X + A (A X)`` by sparse products (matrix-power frontier expansion);
  its answer is an unordered node set per query (no hop, seed, order or caps);
* ``numpy top-k + networkx`` -- the same top-k, then ``nx.bfs_layers`` per
  query (N <= 10^5: a networkx graph of 10^6 nodes and 8 * 10^6 adjacency
  entries takes several GB).

The ``graph-expand-*`` groups time the expansion alone from the same seeds
(ours: C++ and the torch reference; scipy; networkx).  Groups
``graph-retrieve-N<N>-Q<Q>`` / ``graph-expand-N<N>-Q<Q>`` form latency-vs-N
curves.  A summary with p20/p50/p80 per row is written to
``bench/results/graph_summary[_quick].md``.  In a GPU run
(``STREAMMEM_BENCH_DEVICE=cuda``) ``test_gpu`` adds, in the same groups, the
retrieval and the expansion on CUDA tensors (Triton backend).
"""
import itertools
import os
import sys
import time

import numpy as np
import pytest
import torch

from bench._device import gpu_params, require_gpu, synced  # noqa: E402
from streammem_kernels import CSRGraph, graph_retrieve, khop_neighbourhood  # noqa: E402

scipy_sparse = pytest.importorskip("scipy.sparse")
nx = pytest.importorskip("networkx")

QUICK = os.environ.get("STREAMMEM_BENCH_QUICK") == "1"
SIZES = (1_000, 10_000) if QUICK else (1_000, 10_000, 100_000, 1_000_000)
QUERY_COUNTS = (1, 64)
NETWORKX_MAX = 100_000
DIM, SEEDS, HOPS, CAPACITY, NUM_QUERIES = 384, 10, 2, 2048, 64
RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
SUMMARY = []


# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------
def memory_graph(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed + n)
    m = 4 * n
    src = torch.randint(0, n, (m,), generator=g)
    near_in_time = torch.rand(m, generator=g) < 0.9
    dst = torch.where(near_in_time, (src + torch.randint(1, 33, (m,), generator=g)) % n,
                      torch.randint(0, n, (m,), generator=g))
    graph = CSRGraph.from_edges(src, dst, n, weight=torch.rand(m, generator=g), symmetric=True)
    keys = torch.randn(n, DIM, generator=g)
    keys /= torch.linalg.vector_norm(keys, dim=1, keepdim=True)
    pick = torch.randint(0, n, (NUM_QUERIES,), generator=g)
    queries = keys[pick] + 0.5 * torch.randn(NUM_QUERIES, DIM, generator=g) / DIM**0.5
    queries /= torch.linalg.vector_norm(queries, dim=1, keepdim=True)
    return graph, keys.contiguous(), queries.contiguous()


@pytest.fixture(scope="module", params=SIZES, ids=lambda n: f"N{n}")
def data(request):
    n = request.param
    graph, keys, queries = memory_graph(n)
    row_ptr, col_idx = graph.row_ptr.numpy(), graph.col_idx.numpy()
    adjacency = scipy_sparse.csr_matrix((np.ones(col_idx.size, np.float32), col_idx, row_ptr), shape=(n, n))
    d = dict(n=n, graph=graph, keys=keys, queries=queries, adjacency=adjacency, nx=None)
    _check_methods_agree(d)
    yield d
    d.clear()


def _networkx(d):
    if d["nx"] is None:
        if d["n"] > NETWORKX_MAX:
            pytest.skip(f"networkx graph skipped for N > {NETWORKX_MAX} (several GB at N = 10^6)")
        graph = nx.Graph()
        graph.add_nodes_from(range(d["n"]))
        row_ptr, col_idx = d["graph"].row_ptr.numpy(), d["graph"].col_idx.numpy()
        graph.add_edges_from(zip(np.repeat(np.arange(d["n"]), np.diff(row_ptr)).tolist(), col_idx.tolist()))
        d["nx"] = graph
    return d["nx"]


# --------------------------------------------------------------------------
# Peers
# --------------------------------------------------------------------------
def numpy_topk(keys: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """(Q, k) best keys by cosine (keys pre-normalised), best first."""
    scores = queries @ keys.T
    part = np.argpartition(-scores, SEEDS - 1, axis=1)[:, :SEEDS]
    order = np.argsort(-np.take_along_axis(scores, part, 1), axis=1, kind="stable")
    return np.take_along_axis(part, order, 1)


def scipy_expand(adjacency, seeds: np.ndarray):
    """Nodes within HOPS of each query's seeds: column j of X + A X + A (A X), as CSC (indptr, indices)."""
    n, num_q = adjacency.shape[0], seeds.shape[0]
    x = scipy_sparse.csr_matrix((np.ones(seeds.size, np.float32), (seeds.ravel(), np.repeat(np.arange(num_q),
                                                                                              seeds.shape[1]))),
                                shape=(n, num_q))
    reach, frontier = x, x
    for _ in range(HOPS):
        frontier = adjacency @ frontier
        reach = reach + frontier
    reach = reach.tocsc()
    return reach.indptr, reach.indices


def networkx_expand(graph, seeds: np.ndarray):
    return [[v for layer in itertools.islice(nx.bfs_layers(graph, list(dict.fromkeys(row.tolist()))), HOPS + 1)
             for v in layer] for row in seeds]


def ours_expand(graph, seeds, backend):
    return khop_neighbourhood(graph, seeds, HOPS, capacity=CAPACITY, backend=backend)


# Two keys whose float64 cosines to a query differ by less than this are a tie at float32
# precision: either order is a correct top-k (float32 dot products of 384 unit-norm terms
# round by ~1e-7; two random keys of 10^4 fall closer than that to some query).
NEAR_TIE = 1e-6


def assert_exact_top_k(ids: np.ndarray, keys: np.ndarray, queries: np.ndarray) -> None:
    """``ids`` is, row by row, the exact top-``SEEDS`` by cosine (float64), up to the order of near-ties."""
    keys64, queries64 = keys.astype(np.float64), queries.astype(np.float64)
    want = numpy_topk(keys64, queries64)
    for q in np.flatnonzero((ids != want).any(axis=1)):
        got_scores, want_scores = keys64[ids[q]] @ queries64[q], keys64[want[q]] @ queries64[q]
        assert len(set(ids[q].tolist())) == SEEDS and np.allclose(got_scores, want_scores, rtol=0, atol=NEAR_TIE), \
            f"query {q}: seeds {ids[q].tolist()} (float64 scores {got_scores}) are not the float64 top-{SEEDS} " \
            f"{want[q].tolist()} ({want_scores}) up to near-ties"


def _check_methods_agree(d):
    """Our seeds are the exact top-k (float64, near-ties in either order); from those seeds, same
    node sets from every method on all queries (and no query reached the capacity)."""
    ours = graph_retrieve(d["queries"], d["keys"], d["graph"], k=SEEDS, hops=HOPS, capacity=CAPACITY)
    seeds = ours.seeds.numpy()
    assert_exact_top_k(seeds, d["keys"].numpy(), d["queries"].numpy())
    d["seeds"] = seeds
    near = ours.neighbourhood
    d["max_count"], d["truncated"] = int(near.count.max()), int(near.truncated.sum())
    assert d["truncated"] == 0
    indptr, indices = scipy_expand(d["adjacency"], seeds)
    for q in range(seeds.shape[0]):
        got = set(near.nodes[q, : int(near.count[q])].tolist())
        assert got == set(indices[indptr[q]:indptr[q + 1]].tolist()), q
    if d["n"] <= 10_000:  # networkx agrees too (checked where building its graph is cheap)
        for q, nodes in enumerate(networkx_expand(_networkx(d), seeds)):
            assert set(nodes) == set(near.nodes[q, : int(near.count[q])].tolist())


# --------------------------------------------------------------------------
# Measurement
# --------------------------------------------------------------------------
def _measure(benchmark, d, num_q, kind, method, fn, *args):
    t0 = time.perf_counter()
    fn(*args)  # warm-up
    first = time.perf_counter() - t0
    rounds = int(min(30, max(5, 2.0 / max(first, 1e-6))))
    benchmark.group = f"graph-{kind}-N{d['n']}-Q{num_q}"  # before pedantic(): set afterwards it is lost
    benchmark.pedantic(fn, args=args, rounds=rounds, iterations=1)
    data = np.asarray(benchmark.stats.stats.data)
    p20, p50, p80 = (float(np.percentile(data, p)) for p in (20, 50, 80))
    info = dict(method=method, N=d["n"], Q=num_q, kind=kind, p20_s=p20, p50_s=p50, p80_s=p80,
                max_count=d["max_count"], truncated=d["truncated"])
    benchmark.extra_info.update(info)
    SUMMARY.append(info)


@pytest.mark.parametrize("num_q", QUERY_COUNTS)
def test_ours_retrieve(benchmark, data, num_q):
    q = data["queries"][:num_q].contiguous()
    _measure(benchmark, data, num_q, "retrieve", "ours graph_retrieve (auto)",
             lambda: graph_retrieve(q, data["keys"], data["graph"], k=SEEDS, hops=HOPS, capacity=CAPACITY))


@pytest.mark.parametrize("num_q", QUERY_COUNTS)
def test_scipy_retrieve(benchmark, data, num_q):
    keys, q = data["keys"].numpy(), data["queries"][:num_q].numpy()
    _measure(benchmark, data, num_q, "retrieve", "numpy top-k + scipy.sparse",
             lambda: scipy_expand(data["adjacency"], numpy_topk(keys, q)))


@pytest.mark.parametrize("num_q", QUERY_COUNTS)
def test_networkx_retrieve(benchmark, data, num_q):
    graph = _networkx(data)
    keys, q = data["keys"].numpy(), data["queries"][:num_q].numpy()
    _measure(benchmark, data, num_q, "retrieve", "numpy top-k + networkx",
             lambda: networkx_expand(graph, numpy_topk(keys, q)))


@pytest.mark.parametrize("backend", ["cpp", "torch"])
@pytest.mark.parametrize("num_q", QUERY_COUNTS)
def test_ours_expand(benchmark, data, num_q, backend):
    seeds = torch.from_numpy(data["seeds"][:num_q])
    name = "ours khop_neighbourhood (cpp)" if backend == "cpp" else "ours-torch-reference khop_neighbourhood"
    _measure(benchmark, data, num_q, "expand", name, ours_expand, data["graph"], seeds, backend)


@pytest.mark.parametrize("num_q", QUERY_COUNTS)
def test_scipy_expand(benchmark, data, num_q):
    _measure(benchmark, data, num_q, "expand", "scipy.sparse X + AX + A(AX)", scipy_expand, data["adjacency"],
             data["seeds"][:num_q])


@pytest.mark.parametrize("num_q", QUERY_COUNTS)
def test_networkx_expand(benchmark, data, num_q):
    _measure(benchmark, data, num_q, "expand", "networkx bfs_layers", networkx_expand, _networkx(data),
             data["seeds"][:num_q])


GPU_METHODS = ("graph_retrieve (auto)", "khop_neighbourhood (triton)")


@pytest.mark.parametrize("num_q", QUERY_COUNTS)
@pytest.mark.parametrize("method", gpu_params(*GPU_METHODS))
def test_gpu(benchmark, data, num_q, method):
    device = require_gpu()
    if "gpu" not in data:
        data["gpu"] = (data["graph"].to(device), data["keys"].to(device), data["queries"].to(device),
                       torch.from_numpy(data["seeds"]).to(device))
        data["gpu"][0].max_degree
    graph, keys, queries, seeds = data["gpu"]
    q, s = queries[:num_q].contiguous(), seeds[:num_q].contiguous()
    if method == "graph_retrieve (auto)":
        kind, fn = "retrieve", lambda: graph_retrieve(q, keys, graph, k=SEEDS, hops=HOPS, capacity=CAPACITY)
    else:
        kind, fn = "expand", lambda: ours_expand(graph, s, "triton")
    _measure(benchmark, data, num_q, kind, f"ours {method} [gpu]", synced(fn, device))


@pytest.fixture(scope="session", autouse=True)
def _write_summary():
    yield
    if not SUMMARY:
        return
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f"graph_summary{'_quick' if QUICK else ''}.md")
    lines = ["| task | N | Q | method | p20 | p50 | p80 | x ours (p50) |", "|---|---|---|---|---|---|---|---|"]
    ours = {(r["kind"], r["N"], r["Q"]): r["p50_s"] for r in SUMMARY
            if r["method"] in ("ours graph_retrieve (auto)", "ours khop_neighbourhood (cpp)")}
    for r in sorted(SUMMARY, key=lambda r: (r["kind"] != "retrieve", r["N"], r["Q"], not r["method"].startswith("ours"),
                                           r["method"])):
        base = ours.get((r["kind"], r["N"], r["Q"]))
        ratio = f"{r['p50_s'] / base:.2f}" if base else "-"
        lines.append(f"| {r['kind']} | {r['N']} | {r['Q']} | {r['method']} | {_ms(r['p20_s'])} | {_ms(r['p50_s'])} | "
                     f"{_ms(r['p80_s'])} | {ratio} |")
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print(f"\nwrote {path}", file=sys.stderr)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"
