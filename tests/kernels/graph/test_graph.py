"""Memory graph: CSRGraph, khop_neighbourhood, neighbourhood_chunks, graph_retrieve.

Ground truth is a plain-Python breadth-first search written from the module
docstring (lists, sets, one node at a time) and, for the uncapped expansion,
networkx's shortest-path lengths; every backend must return the same integers.
Graphs are random with odd sizes, isolated nodes, self-loops and repeated
edges; cases cover hops 0/1/3, caps that bind and caps that do not, and B = 1.
"""
import random

import networkx as nx
import numpy as np
import pytest
import torch

import streammem_kernels as sk
from tests.support.device_checks import cpu_backends
from tests.support.device_checks import DEVICES, HostSync, capture_in_cuda_graph, device_backends, guard_backend, no_host_sync
from streammem_kernels import CSRGraph, cosine_topk, graph_retrieve, khop_neighbourhood, neighbourhood_chunks
from streammem_kernels.graph import GRAPH, GRAPH_RETRIEVE, NO_CAP

BACKENDS = cpu_backends(GRAPH)
CUDA = DEVICES[1].marks[0]  # skipped without a GPU


# --------------------------------------------------------------------------
# The spec, written plainly
# --------------------------------------------------------------------------
def python_khop(row_ptr, col_idx, seeds, hops, capacity, max_fanout=None, max_frontier=None):
    """One query: list of (node, hop, seed, parent, edge) and the truncated flag."""
    fanout = max_fanout or float("inf")
    cap = max_frontier or float("inf")
    out, listed, truncated = [], set(), False
    for s in seeds:
        if s < 0 or s in listed:
            continue
        if len(out) == capacity:
            truncated = True
            break
        out.append((s, 0, s, -1, -1))
        listed.add(s)
    frontier = [(node, seed) for node, _, seed, _, _ in out]
    for hop in range(1, hops + 1):
        if truncated or not frontier:
            break
        found, hop_full = [], False
        for u, seed in frontier:
            if hop_full or truncated:
                break
            for e in range(row_ptr[u], row_ptr[u + 1]):
                if e - row_ptr[u] >= fanout:
                    break
                v = col_idx[e]
                if v in listed:
                    continue
                if len(found) == cap:
                    hop_full = True
                    break
                if len(out) == capacity:
                    truncated = True
                    break
                out.append((v, hop, seed, u, e))
                listed.add(v)
                found.append((v, seed))
        frontier = found
    return out, truncated


def python_chunks(row_ptr, col_idx, nodes, capacity, max_per_node=None):
    per_node = max_per_node or float("inf")
    out, listed = [], set()
    for u in nodes:
        if u < 0:
            continue
        for e in range(row_ptr[u], row_ptr[u + 1]):
            if e - row_ptr[u] >= per_node:
                break
            c = col_idx[e]
            if c in listed:
                continue
            if len(out) == capacity:
                return out, True
            out.append((c, u))
            listed.add(c)
    return out, False


def rows_of(result, b):
    """Entries of query b as tuples, after checking the -1 padding."""
    count = int(result.count[b])
    for field in result[:-2]:
        assert (field[b, count:] == -1).all(), "padding after count must be -1"
    return list(zip(*(field[b, :count].tolist() for field in result[:-2])))


def random_graph(n, m, *, seed, weighted, symmetric, isolated=0):
    """n nodes (the last `isolated` without edges), m edges with self-loops and repeats."""
    g = torch.Generator().manual_seed(seed)
    reach = max(n - isolated, 1)
    src = torch.randint(0, reach, (m,), generator=g)
    dst = torch.randint(0, reach, (m,), generator=g)
    if m >= 4:
        dst[:2] = src[:2]  # self-loops
        src[2], dst[2] = src[3], dst[3]  # a repeated edge
    weight = torch.rand(m, generator=g) if weighted else None
    return CSRGraph.from_edges(src, dst, n, weight=weight, symmetric=symmetric)


def check_against_python(graph, seeds, hops, capacity, fanout, frontier, backend, device="cpu"):
    result = khop_neighbourhood(graph.to(device), seeds.to(device), hops, capacity=capacity, max_fanout=fanout,
                                max_frontier=frontier, backend=backend)
    result = type(result)(*(t.cpu() for t in result))
    row_ptr, col_idx = graph.row_ptr.tolist(), graph.col_idx.tolist()
    for b in range(seeds.shape[0]):
        want, truncated = python_khop(row_ptr, col_idx, seeds[b].tolist(), hops, capacity, fanout, frontier)
        assert rows_of(result, b) == want, (b, backend)
        assert bool(result.truncated[b]) == truncated
    return result


# Cases: (n, m, B, S, hops, capacity, max_fanout, max_frontier, weighted, symmetric)
CASES = [
    (1, 0, 1, 1, 3, 4, None, None, False, False),            # one node, no edges
    (7, 12, 1, 2, 1, 50, None, None, True, False),            # B = 1, caps not hit
    (23, 60, 3, 4, 3, 200, None, None, False, True),          # odd sizes, undirected, caps not hit
    (23, 60, 3, 4, 3, 9, None, None, True, True),             # capacity binds
    (31, 90, 4, 5, 3, 300, 2, 4, True, True),                 # fan-out and frontier caps bind
    (31, 90, 2, 3, 0, 2, None, None, False, False),           # hops = 0, capacity binds on the seeds
    (45, 150, 5, 7, 2, 40, 3, None, False, True),
    (45, 150, 5, 7, 3, 33, None, 5, True, False),             # directed, frontier cap
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "n{}-m{}-B{}-S{}-k{}-C{}-f{}-F{}".format(*c[:8]))
def test_khop_matches_plain_bfs(backend, case):
    n, m, num_q, num_s, hops, capacity, fanout, frontier, weighted, symmetric = case
    graph = random_graph(n, m, seed=n + m, weighted=weighted, symmetric=symmetric, isolated=2 if n > 5 else 0)
    g = torch.Generator().manual_seed(m)
    seeds = torch.randint(-1, n, (num_q, num_s), generator=g)
    seeds[0, -1] = seeds[0, 0]  # a repeated seed
    check_against_python(graph, seeds, hops, capacity, fanout, frontier, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_sweep_every_backend_equals_the_plain_bfs(backend):
    rng = random.Random(7)
    trials = 12 if backend == "triton" else 60
    for trial in range(trials):
        n = rng.randint(1, 40)
        graph = random_graph(n, rng.randint(0, 120), seed=trial, weighted=rng.random() < 0.5,
                             symmetric=rng.random() < 0.5, isolated=rng.randint(0, 3) if n > 3 else 0)
        seeds = torch.randint(-1, n, (rng.randint(1, 4), rng.randint(0, 6)),
                              generator=torch.Generator().manual_seed(trial))
        check_against_python(graph, seeds, rng.choice([0, 1, 2, 3]), rng.choice([1, 3, 8, 50]),
                             rng.choice([None, 1, 2, 5]), rng.choice([None, 1, 3, 10]), backend)


@pytest.mark.skipif("cpp" not in BACKENDS, reason="the C++ backend is not built")
def test_cpu_fast_path_equals_the_general_path():
    # int64 C-contiguous seeds take one native call (GRAPH's latency path); int32 seeds the general path.
    mod = GRAPH.cpp_module("cpp")
    rng = random.Random(11)
    for trial in range(40):
        n = rng.randint(1, 40)
        graph = random_graph(n, rng.randint(0, 120), seed=trial, weighted=rng.random() < 0.5,
                             symmetric=rng.random() < 0.5, isolated=rng.randint(0, 3) if n > 3 else 0)
        seeds = torch.randint(-1, n, (rng.randint(1, 4), rng.randint(0, 6)),
                              generator=torch.Generator().manual_seed(trial))
        hops, capacity = rng.choice([0, 1, 3, 10**9]), rng.choice([1, 3, 8, 50])
        fanout, frontier = rng.choice([None, 1, 5, 2**40]), rng.choice([None, 1, 3])
        fast = GRAPH.fast(mod, graph, seeds, hops, capacity, fanout, frontier)
        assert fast is not None
        general = khop_neighbourhood(graph, seeds.to(torch.int32), hops, capacity=capacity, max_fanout=fanout,
                                     max_frontier=frontier, backend="cpp")
        for a, b in zip(fast, general):
            assert a.dtype == b.dtype and torch.equal(a, b)
    graph = random_graph(9, 20, seed=1, weighted=False, symmetric=True)
    for bad in (9, -2):
        with pytest.raises(ValueError, match=r"seeds must hold ids in \[0, 9\)"):
            khop_neighbourhood(graph, torch.tensor([[0, bad]]), 1, capacity=8)
    # graph_retrieve with k > N: the missing seeds are -1 and score -inf without min_score too.
    emb = torch.randn(9, 5, generator=torch.Generator().manual_seed(3))
    out = graph_retrieve(torch.randn(2, 5), emb, graph, k=12, hops=1, capacity=20)
    assert (out.seeds[:, 9:] == -1).all() and (out.seed_scores[:, 9:] == float("-inf")).all()
    assert torch.isfinite(out.seed_scores[:, :9]).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_uncapped_expansion_equals_networkx_distances(backend):
    """Nodes within `hops` of the seed set, at their networkx shortest-path distance, seeds credited correctly."""
    n, m, hops = 60, 110, 3
    graph = random_graph(n, m, seed=3, weighted=False, symmetric=False, isolated=4)
    g = torch.Generator().manual_seed(5)
    seeds = torch.randint(0, n, (3, 3), generator=g)
    result = khop_neighbourhood(graph, seeds, hops, capacity=n, backend=backend)
    digraph = nx.DiGraph()
    digraph.add_nodes_from(range(n))
    row_ptr = graph.row_ptr.tolist()
    digraph.add_edges_from((u, v) for u in range(n) for v in graph.col_idx[row_ptr[u]:row_ptr[u + 1]].tolist())
    for b in range(seeds.shape[0]):
        per_seed = {s: nx.single_source_shortest_path_length(digraph, s, cutoff=hops) for s in seeds[b].tolist()}
        want = {}
        for s in seeds[b].tolist():
            for v, d in per_seed[s].items():
                want[v] = min(want.get(v, hops + 1), d)
        got = rows_of(result, b)
        assert {v: h for v, h, *_ in got} == want
        assert not bool(result.truncated[b])
        for v, h, s, parent, edge in got:
            assert per_seed[s][v] == h  # the credited seed reaches it at that distance
            if h:
                assert graph.col_idx[edge] == v and row_ptr[parent] <= edge < row_ptr[parent + 1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_frontier_cap_defers_a_node_to_the_next_hop(backend):
    # 0 -> 1, 0 -> 2, 1 -> 2: with one node per hop, 2 is dropped at hop 1 and reached from 1 at hop 2.
    graph = CSRGraph(torch.tensor([0, 2, 3, 3]), torch.tensor([1, 2, 2]))
    result = khop_neighbourhood(graph, [[0]], 2, capacity=5, max_frontier=1, backend=backend)
    assert rows_of(result, 0) == [(0, 0, 0, -1, -1), (1, 1, 0, 0, 0), (2, 2, 0, 1, 2)]
    assert not bool(result.truncated[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_truncated_means_a_larger_capacity_would_list_more(backend):
    # A path 0 - 1 - 2 - 3 (undirected).
    path = CSRGraph.from_edges([0, 1, 2], [1, 2, 3], 4, symmetric=True)
    for capacity, hops, truncated in ((4, 3, False), (3, 3, True), (3, 2, False), (2, 2, True), (1, 0, False)):
        result = khop_neighbourhood(path, [[0]], hops, capacity=capacity, backend=backend)
        assert bool(result.truncated[0]) == truncated, (capacity, hops)
        assert result.nodes[0, : min(capacity, hops + 1)].tolist() == list(range(min(capacity, hops + 1)))
    # Both caps full at once: the frontier cap ends hop 1, and hop 2 finds node 3 with no room left.
    star = CSRGraph.from_edges([0, 0, 1], [1, 2, 3], 4)
    result = khop_neighbourhood(star, [[0]], 2, capacity=2, max_frontier=1, backend=backend)
    assert rows_of(result, 0) == [(0, 0, 0, -1, -1), (1, 1, 0, 0, 0)] and bool(result.truncated[0])
    result = khop_neighbourhood(star, [[0]], 1, capacity=2, max_frontier=1, backend=backend)
    assert not bool(result.truncated[0])
    # Seeds alone overflow the capacity.
    result = khop_neighbourhood(star, [[3, 2, 1]], 0, capacity=2, backend=backend)
    assert result.nodes[0].tolist() == [3, 2] and bool(result.truncated[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_fanout_follows_the_strongest_edges(backend):
    # Node 0's edges by weight: 0->3 (0.9), 0->1 (0.5), 0->2 (0.5), 0->4 (0.1): ties by lower id.
    graph = CSRGraph.from_edges([0, 0, 0, 0], [4, 2, 3, 1], 5, weight=[0.1, 0.5, 0.9, 0.5])
    assert graph.col_idx.tolist() == [3, 1, 2, 4] and graph.edge_ids.tolist() == [2, 3, 1, 0]
    result = khop_neighbourhood(graph, [[0]], 1, capacity=10, max_fanout=2, backend=backend)
    assert result.nodes[0, : int(result.count[0])].tolist() == [0, 3, 1]
    assert graph.edge_ids[result.edge[0, 1:3]].tolist() == [2, 3]  # back to the caller's edge list


@pytest.mark.skipif("cpp" not in BACKENDS, reason="the C++ backend is not built")
def test_cpp_reuses_its_visited_marks_correctly():
    """Many queries over one graph, twice, then a smaller graph: the C++ backend keeps one visited
    bitmap per thread across queries and calls, which must be clear at every start."""
    n = 3001
    graph = random_graph(n, 12000, seed=11, weighted=True, symmetric=True, isolated=100)
    seeds = torch.randint(-1, n, (33, 9), generator=torch.Generator().manual_seed(2))
    row_ptr, col_idx = graph.row_ptr.tolist(), graph.col_idx.tolist()
    for _ in range(2):
        got = khop_neighbourhood(graph, seeds, 2, capacity=257, max_fanout=6, backend="cpp")
        for b in range(seeds.shape[0]):
            want, truncated = python_khop(row_ptr, col_idx, seeds[b].tolist(), 2, 257, 6)
            assert rows_of(got, b) == want and bool(got.truncated[b]) == truncated
    small = random_graph(17, 40, seed=1, weighted=False, symmetric=True)
    check_against_python(small, torch.randint(0, 17, (5, 3), generator=torch.Generator().manual_seed(3)), 3, 17,
                         None, None, "cpp")


# --------------------------------------------------------------------------
# Chunks
# --------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("capacity,per_node", [(100, None), (5, None), (100, 1), (1, 2)])
def test_chunks_match_plain_python(backend, capacity, per_node):
    n, num_chunks = 29, 13
    g = torch.Generator().manual_seed(capacity)
    node_of = torch.randint(0, n - 3, (70,), generator=g)  # nodes n-3.. have no chunk
    chunk_map = CSRGraph.from_edges(node_of, torch.randint(0, num_chunks, (70,), generator=g), n,
                                    num_cols=num_chunks)
    nodes = torch.randint(-1, n, (4, 9), generator=g)
    result = neighbourhood_chunks(nodes, chunk_map, capacity=capacity, max_per_node=per_node, backend=backend)
    row_ptr, col_idx = chunk_map.row_ptr.tolist(), chunk_map.col_idx.tolist()
    for b in range(nodes.shape[0]):
        want, truncated = python_chunks(row_ptr, col_idx, nodes[b].tolist(), capacity, per_node)
        count = int(result.count[b])
        assert list(zip(result.chunks[b, :count].tolist(), result.node[b, :count].tolist())) == want
        assert (result.chunks[b, count:] == -1).all() and (result.node[b, count:] == -1).all()
        assert bool(result.truncated[b]) == truncated


# --------------------------------------------------------------------------
# CSR construction
# --------------------------------------------------------------------------
def test_from_edges_orders_rows_and_maps_edges():
    g = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, 9, (40,), generator=g), torch.randint(0, 9, (40,), generator=g)
    weight = torch.randint(0, 3, (40,), generator=g).double()  # many ties
    for symmetric in (False, True):
        graph = CSRGraph.from_edges(src, dst, 11, weight=weight, symmetric=symmetric)  # rows 9, 10 empty
        # (source, target, weight, input edge, position in the list the sort sees: reversed copies last)
        edges = [(int(s), int(d), float(w), i, i) for i, (s, d, w) in enumerate(zip(src, dst, weight))]
        if symmetric:
            reversed_copies = [(d, s, w, i) for s, d, w, i, _ in edges if s != d]
            edges += [(*e, len(src) + j) for j, e in enumerate(reversed_copies)]
        row_ptr = graph.row_ptr.tolist()
        assert row_ptr[0] == 0 and row_ptr[-1] == len(edges) == graph.num_edges and row_ptr[-3:] == [len(edges)] * 3
        for u in range(11):
            want = sorted((e for e in edges if e[0] == u), key=lambda e: (-e[2], e[1], e[4]))
            lo, hi = row_ptr[u], row_ptr[u + 1]
            assert graph.col_idx[lo:hi].tolist() == [e[1] for e in want]
            assert graph.edge_ids[lo:hi].tolist() == [e[3] for e in want]
    unweighted = CSRGraph.from_edges(src, dst, 9)
    for u in range(9):
        lo, hi = unweighted.row_ptr[u], unweighted.row_ptr[u + 1]
        assert unweighted.col_idx[lo:hi].tolist() == sorted(dst[src == u].tolist())
    assert unweighted.max_degree == int(torch.bincount(src).max())


def test_from_edges_matches_scipy_csr():
    scipy_sparse = pytest.importorskip("scipy.sparse")
    g = torch.Generator().manual_seed(1)
    src, dst = torch.randint(0, 50, (300,), generator=g), torch.randint(0, 37, (300,), generator=g)
    graph = CSRGraph.from_edges(src, dst, 50, num_cols=37)
    ref = scipy_sparse.csr_matrix((np.ones(300), (src.numpy(), dst.numpy())), shape=(50, 37))
    ref.sum_duplicates()
    ref.sort_indices()
    ours = scipy_sparse.csr_matrix((np.ones(300), graph.col_idx.numpy(), graph.row_ptr.numpy()), shape=(50, 37))
    ours.sum_duplicates()
    assert (ours != ref).nnz == 0


def test_graph_properties_and_int32_input():
    graph = CSRGraph(np.array([0, 2, 2, 3], dtype=np.int32), torch.tensor([1, 2, 0], dtype=torch.int32))
    assert graph.row_ptr.dtype == torch.int64 and graph.col_idx.dtype == torch.int64 and graph.edge_ids is None
    assert (graph.num_rows, graph.num_cols, graph.num_edges, graph.max_degree) == (3, 3, 3, 2)
    assert "num_edges=3" in repr(graph) and graph.to("cpu").col_idx.tolist() == [1, 2, 0]
    empty = CSRGraph([0], torch.zeros(0, dtype=torch.int64))
    assert empty.num_rows == 0 and empty.max_degree == 0
    for backend in BACKENDS:
        result = khop_neighbourhood(empty, torch.full((2, 3), -1), 2, capacity=3, backend=backend)
        assert result.count.tolist() == [0, 0] and (result.nodes == -1).all()


# --------------------------------------------------------------------------
# Retrieval
# --------------------------------------------------------------------------
def memory(n=41, dim=24, *, seed=0):
    g = torch.Generator().manual_seed(seed)
    graph = random_graph(n, 3 * n, seed=seed, weighted=True, symmetric=True, isolated=3)
    emb = torch.randn(n, dim, generator=g)
    chunk_map = CSRGraph.from_edges(torch.arange(n).repeat(2), torch.randint(0, 17, (2 * n,), generator=g), n,
                                    num_cols=17)
    queries = emb[[3, 20]] + 0.3 * torch.randn(2, dim, generator=g)
    return graph, emb, chunk_map, queries


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("backend", BACKENDS)
def test_graph_retrieve_is_topk_seeds_then_expansion(backend, dtype):
    graph, emb, chunk_map, queries = memory()
    emb, queries = emb.to(dtype), queries.to(dtype)
    got = graph_retrieve(queries, emb, graph, k=4, hops=2, capacity=30, max_fanout=3, chunk_map=chunk_map,
                         chunk_capacity=12, backend=backend)
    want = graph_retrieve(queries, emb, graph, k=4, hops=2, capacity=30, max_fanout=3, chunk_map=chunk_map,
                          chunk_capacity=12, backend="torch")
    top = cosine_topk(queries.float(), emb.float(), 4, backend="torch")
    assert torch.equal(want.seeds, top.ids)
    assert torch.equal(got.seeds, want.seeds)
    atol, rtol = GRAPH.tolerance(backend, dtype)
    torch.testing.assert_close(got.seed_scores, want.seed_scores, atol=atol, rtol=rtol)
    near = khop_neighbourhood(graph, top.ids, 2, capacity=30, max_fanout=3, backend="torch")
    for a, b in zip(got.neighbourhood, near):
        assert torch.equal(a, b)
    chunks = neighbourhood_chunks(near.nodes, chunk_map, capacity=12, backend="torch")
    for a, b in zip(got.chunks, chunks):
        assert torch.equal(a, b)


@pytest.mark.parametrize("backend", BACKENDS)
def test_graph_retrieve_min_score_drops_weak_seeds(backend):
    graph, emb, _, queries = memory(seed=2)
    top = cosine_topk(queries, emb, 5, backend="torch")
    threshold = float(top.scores[:, 2].max()) + 1e-4  # at most two seeds survive in each query
    got = graph_retrieve(queries, emb, graph, k=5, hops=1, capacity=40, min_score=threshold, backend=backend)
    keep = top.scores >= threshold
    assert torch.equal(got.seeds, torch.where(keep, top.ids, -1))
    assert torch.equal(torch.isinf(got.seed_scores), ~keep) and got.chunks is None
    expected = khop_neighbourhood(graph, torch.where(keep, top.ids, -1), 1, capacity=40, backend="torch")
    assert torch.equal(got.neighbourhood.nodes, expected.nodes)


def _general_retrieve(queries, emb, graph, **kwargs):
    """graph_retrieve through its general path (a float64 copy of the queries declines the fused call)."""
    return graph_retrieve(queries.double(), emb, graph, **kwargs)


@pytest.mark.parametrize("numpy_bool_capsule", [True, False])
def test_graph_retrieve_fused_call_equals_the_general_path(monkeypatch, numpy_bool_capsule):
    """The CPU fast path (one native call: the seed top-k, min_score and the expansion) returns what
    cosine_topk + the expansion return, and runs for the plain float32 call only; the truncated flags
    handed over by numpy's DLPack capsule or, with a numpy before 1.25, by torch's."""
    if "cpp" not in BACKENDS:
        pytest.skip("the C++ backend is not built")
    if numpy_bool_capsule and not sk.graph._NUMPY_BOOL_DLPACK:
        pytest.skip(f"numpy {np.__version__} exports no bool arrays by DLPack")
    monkeypatch.setattr(sk.graph, "_NUMPY_BOOL_DLPACK", numpy_bool_capsule)
    ran = []
    fused = GRAPH_RETRIEVE.fast
    monkeypatch.setattr(GRAPH_RETRIEVE, "fast", lambda *a: ran.append(1) or fused(*a))
    graph, emb, _, queries = memory(n=53, dim=20, seed=4)
    emb[7] = 0.0  # a zero node scores 0
    emb[30] = emb[11] * 8  # parallel rows tie: the lower id first
    top = cosine_topk(queries, emb, 6, backend="torch")
    cases = [dict(k=4, hops=2, capacity=30), dict(k=60, hops=1, capacity=80),  # k > N: -1 seeds
             dict(k=5, hops=3, capacity=9, max_fanout=2, max_frontier=3),  # caps bind, truncated
             dict(k=6, hops=10**9, capacity=53), dict(k=3, hops=0, capacity=2),
             dict(k=6, hops=1, capacity=40, min_score=float(top.scores[:, 2].max())),  # the float32 boundary
             dict(k=6, hops=1, capacity=40, min_score=float(top.scores[0, 3]) + 1e-12),  # rounds to that score
             dict(k=6, hops=1, capacity=40, min_score=1e300), dict(k=6, hops=1, capacity=40, min_score=-1e300)]
    for q in (queries, queries[:1], torch.zeros(1, 20), queries.repeat(3, 1)[:7]):
        for kwargs in cases:
            ran.clear()
            got = graph_retrieve(q, emb, graph, **kwargs)
            assert ran
            want = _general_retrieve(q, emb, graph, **kwargs)
            assert torch.equal(got.seeds, want.seeds), kwargs
            assert torch.equal(got.seed_scores, want.seed_scores), kwargs
            assert got.chunks is None and type(got.neighbourhood) is type(want.neighbourhood)
            for a, b in zip(got.neighbourhood, want.neighbourhood):
                assert a.dtype == b.dtype and torch.equal(a, b), kwargs
    # Q x N x D >= 2^16: the scan hands the GIL back while it runs (called from the graph module).
    big_graph, big_emb, _, big_q = memory(n=300, dim=256, seed=6)
    ran.clear()
    got = graph_retrieve(big_q, big_emb, big_graph, k=5, hops=2, capacity=40)
    want = _general_retrieve(big_q, big_emb, big_graph, k=5, hops=2, capacity=40)
    assert ran and torch.equal(got.seeds, want.seeds) and torch.equal(got.seed_scores, want.seed_scores)
    assert torch.equal(got.neighbourhood.nodes, want.neighbourhood.nodes)
    ref = graph_retrieve(queries, emb, graph, k=4, hops=2, capacity=30, backend="torch")
    got = graph_retrieve(queries, emb, graph, k=4, hops=2, capacity=30)
    assert torch.equal(got.seeds, ref.seeds) and torch.equal(got.neighbourhood.nodes, ref.neighbourhood.nodes)
    torch.testing.assert_close(got.seed_scores, ref.seed_scores, atol=2e-5, rtol=1e-5)
    # Declined, same answer: Q >= 8, non-contiguous embeddings, a chunk map, numpy input.
    mod = GRAPH.cpp_module("cpp")
    for q, e in ((queries.repeat(4, 1), emb), (queries, emb.T.contiguous().T), (queries.numpy(), emb)):
        assert fused(mod, q, e, graph, 4, 2, 30, None, None, None) is None
        got = graph_retrieve(q, e, graph, k=4, hops=2, capacity=30)
        want = graph_retrieve(torch.as_tensor(q).double(), e, graph, k=4, hops=2, capacity=30)
        assert torch.equal(got.seeds, want.seeds) and torch.equal(got.neighbourhood.nodes, want.neighbourhood.nodes)


def test_graph_keeps_its_native_views_out_of_copies():
    """A graph's latency path keeps the C++ views of its CSR on the graph, made once; copies and pickles
    leave them behind (capsules do not pickle) and make their own."""
    import copy
    import pickle

    graph, emb, _, queries = memory(n=30, dim=8, seed=9)
    seeds = torch.tensor([[0, 4, 7]])
    first = khop_neighbourhood(graph, seeds, 2, capacity=20)
    for clone in (copy.deepcopy(graph), pickle.loads(pickle.dumps(graph)), graph.to("cpu")):
        again = khop_neighbourhood(clone, seeds, 2, capacity=20)
        for a, b in zip(first, again):
            assert torch.equal(a, b)
        got = graph_retrieve(queries, emb, clone, k=3, hops=1, capacity=12)
        want = graph_retrieve(queries, emb, graph, k=3, hops=1, capacity=12)
        assert torch.equal(got.seeds, want.seeds) and torch.equal(got.neighbourhood.nodes, want.neighbourhood.nodes)


def test_graph_retrieve_fused_call_raises_the_general_errors():
    graph, emb, _, queries = memory()
    for bad in (float("nan"), float("inf")):
        q, e = queries.clone(), emb.clone()
        q[1, 3] = bad
        e[40, 0] = bad
        for args, match in (((q, emb), "queries must be finite"), ((queries, e), "node_embeddings must be finite")):
            with pytest.raises(ValueError, match=match):
                graph_retrieve(*args, graph, k=2, hops=1, capacity=8)
            with pytest.raises(ValueError, match=match):
                _general_retrieve(*args, graph, k=2, hops=1, capacity=8)
    for kwargs, match in ((dict(k=2, hops=-1, capacity=8), "hops must be >= 0"),
                          (dict(k=0, hops=1, capacity=8), "k must be >= 1"),
                          (dict(k=2, hops=1, capacity=0), "capacity must be >= 1"),
                          (dict(k=2, hops=1, capacity=8, max_fanout=0), "max_fanout must be >= 1"),
                          (dict(k=2, hops=1, capacity=8, min_score=float("inf")), "min_score must be finite")):
        with pytest.raises(ValueError, match=match):
            graph_retrieve(queries, emb, graph, **kwargs)
    with pytest.raises(ValueError, match="graph must be square"):
        graph_retrieve(queries, emb, CSRGraph.from_edges([0], [0], 41, num_cols=42), k=2, hops=1, capacity=8)
    before = (queries.clone(), emb.clone())
    graph_retrieve(queries, emb, graph, k=3, hops=2, capacity=8, min_score=0.0)
    assert torch.equal(queries, before[0]) and torch.equal(emb, before[1])


# --------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------
def test_bad_csr_names_the_argument():
    ok_ptr, ok_idx = torch.tensor([0, 1, 2]), torch.tensor([1, 0])
    cases = [
        (dict(row_ptr=torch.tensor([1, 1, 2]), col_idx=ok_idx), "row_ptr must start at 0"),
        (dict(row_ptr=torch.tensor([0, 1, 3]), col_idx=ok_idx), "row_ptr must start at 0 and end at len"),
        (dict(row_ptr=torch.tensor([0, 2, 1, 2]), col_idx=ok_idx), "row_ptr must be non-decreasing"),
        (dict(row_ptr=ok_ptr, col_idx=torch.tensor([1, 2])), r"col_idx must hold ids in \[0, num_cols=2\)"),
        (dict(row_ptr=ok_ptr, col_idx=torch.tensor([-1, 0])), "col_idx must hold ids"),
        (dict(row_ptr=ok_ptr.float(), col_idx=ok_idx), "row_ptr must have dtype"),
        (dict(row_ptr=ok_ptr[None], col_idx=ok_idx), "row_ptr must have shape"),
        (dict(row_ptr=torch.zeros(0, dtype=torch.int64), col_idx=ok_idx[:0]), "row_ptr must have shape"),
        (dict(row_ptr=ok_ptr, col_idx=ok_idx[None]), "col_idx must have shape"),
        (dict(row_ptr=ok_ptr, col_idx=ok_idx, num_cols=-1), "num_cols must be >= 0"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            CSRGraph(**kwargs)
    with pytest.raises(ValueError, match="src must hold ids"):
        CSRGraph.from_edges([0, 3], [1, 1], 3)
    with pytest.raises(ValueError, match="dst must hold ids"):
        CSRGraph.from_edges([0, 1], [1, -1], 3)
    with pytest.raises(ValueError, match="same length"):
        CSRGraph.from_edges([0, 1], [1], 3)
    with pytest.raises(ValueError, match="weight must be finite"):
        CSRGraph.from_edges([0, 1], [1, 0], 3, weight=[0.5, float("nan")])
    with pytest.raises(ValueError, match="weight must be an"):
        CSRGraph.from_edges([0, 1], [1, 0], 3, weight=[0.5])
    with pytest.raises(ValueError, match="num_cols == num_rows"):
        CSRGraph.from_edges([0, 1], [1, 0], 3, num_cols=4, symmetric=True)
    with pytest.raises(ValueError, match="num_rows must be >= 0"):
        CSRGraph.from_edges([0], [0], -2)


def test_bad_expansion_arguments_name_the_argument():
    graph = CSRGraph.from_edges([0, 1, 2], [1, 2, 0], 4)
    seeds = torch.tensor([[0, 1]])
    bad = [
        (dict(seeds=torch.tensor([[0, 4]])), r"seeds must hold ids in \[0, 4\) or -1"),
        (dict(seeds=torch.tensor([[-2, 1]])), "seeds must hold ids"),
        (dict(seeds=torch.tensor([0, 1])), r"seeds must have shape \(B, S\)"),
        (dict(seeds=torch.zeros(0, 2, dtype=torch.int64)), "seeds must hold at least one query row"),
        (dict(seeds=seeds.float()), "seeds must have dtype"),
        (dict(hops=-1), "hops must be >= 0"),
        (dict(hops=1.5), "hops must be an int"),
        (dict(capacity=0), "capacity must be >= 1"),
        (dict(capacity=2**31), "capacity must be < 2"),
        (dict(max_fanout=0), "max_fanout must be >= 1"),
        (dict(max_frontier=0), "max_frontier must be >= 1"),
        (dict(backend="cuda"), "no cuda backend"),
    ]
    for change, message in bad:
        kwargs = dict(seeds=seeds, hops=1, capacity=4, backend="torch")
        kwargs.update(change)
        error = RuntimeError if "backend" in change else ValueError
        with pytest.raises(error, match=message):
            khop_neighbourhood(graph, **kwargs)
    with pytest.raises(ValueError, match="graph must be a CSRGraph"):
        khop_neighbourhood((graph.row_ptr, graph.col_idx), seeds, 1, capacity=4)
    chunk_map = CSRGraph.from_edges([0, 1], [5, 6], 4, num_cols=7)
    with pytest.raises(ValueError, match="graph must be square"):
        khop_neighbourhood(chunk_map, seeds, 1, capacity=4)
    with pytest.raises(ValueError, match=r"nodes must hold ids in \[0, 4\)"):
        neighbourhood_chunks(torch.tensor([[4]]), chunk_map, capacity=2)
    with pytest.raises(ValueError, match="max_per_node must be >= 1"):
        neighbourhood_chunks(seeds, chunk_map, capacity=2, max_per_node=0)
    with pytest.raises(ValueError, match="chunk_map must be a CSRGraph"):
        neighbourhood_chunks(seeds, None, capacity=2)


def test_bad_retrieval_arguments_name_the_argument():
    graph, emb, chunk_map, queries = memory()
    with pytest.raises(ValueError, match=r"node_embeddings must have one row per graph node \(N=41\)"):
        graph_retrieve(queries, emb[:-1], graph, k=2, hops=1, capacity=8)
    with pytest.raises(ValueError, match="node_embeddings must have shape"):
        graph_retrieve(queries, emb[0], graph, k=2, hops=1, capacity=8)
    with pytest.raises(ValueError, match="chunk_capacity needs a chunk_map"):
        graph_retrieve(queries, emb, graph, k=2, hops=1, capacity=8, chunk_capacity=3)
    with pytest.raises(ValueError, match="chunk_map must have one row per graph node"):
        graph_retrieve(queries, emb, graph, k=2, hops=1, capacity=8,
                       chunk_map=CSRGraph.from_edges([0], [0], 5))
    with pytest.raises(ValueError, match="min_score must be finite"):
        graph_retrieve(queries, emb, graph, k=2, hops=1, capacity=8, min_score=float("nan"))
    with pytest.raises(ValueError, match="hops must be >= 0"):
        graph_retrieve(queries, emb, graph, k=2, hops=-1, capacity=8)
    with pytest.raises(ValueError, match="k must be >= 1"):
        graph_retrieve(queries, emb, graph, k=0, hops=1, capacity=8)
    with pytest.raises(ValueError, match="queries and node_embeddings must have the same number of columns D"):
        graph_retrieve(queries[:, :5], emb, graph, k=2, hops=1, capacity=8)


@pytest.mark.parametrize("backend", BACKENDS)
def test_inputs_are_not_modified_and_sliced_seeds_work(backend):
    graph = random_graph(19, 50, seed=4, weighted=True, symmetric=True)
    before = (graph.row_ptr.clone(), graph.col_idx.clone())
    block = torch.randint(-1, 19, (5, 8), generator=torch.Generator().manual_seed(9)).to(torch.int32)
    sliced = block[1::2, ::3]  # non-contiguous int32
    copy = sliced.clone()
    result = khop_neighbourhood(graph, sliced, 2, capacity=19, backend=backend)
    want = khop_neighbourhood(graph, sliced.contiguous().long(), 2, capacity=19, backend="torch")
    for a, b in zip(result, want):
        assert torch.equal(a, b)
    assert torch.equal(sliced, copy)
    assert torch.equal(graph.row_ptr, before[0]) and torch.equal(graph.col_idx, before[1])
    numpy_result = khop_neighbourhood(graph, sliced.numpy(), 2, capacity=19, backend=backend)
    assert torch.equal(numpy_result.nodes, want.nodes)


@pytest.mark.parametrize("backend", BACKENDS)
def test_opcheck(backend):
    """Every backend: the torch and Triton ones return their five lists as views of one table, which
    an op's outputs may not be (torch.compile refused khop_neighbourhood on them)."""
    graph = random_graph(13, 30, seed=6, weighted=False, symmetric=True)
    seeds = torch.tensor([[0, 3, -1], [5, 5, 12]])
    args = (graph.row_ptr, graph.col_idx, seeds, 13, 2, 7, 3, NO_CAP, True, 3, backend)
    torch.library.opcheck(torch.ops.streammem.graph_expand.default, args)


# --------------------------------------------------------------------------
# GPU readiness: device parametrisation, no host synchronisation, CUDA graphs
# --------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_every_device_backend_equals_the_plain_bfs(device):
    graph = random_graph(37, 100, seed=8, weighted=True, symmetric=True, isolated=3)
    seeds = torch.randint(-1, 37, (3, 5), generator=torch.Generator().manual_seed(8))
    for backend in device_backends(GRAPH, device):
        check_against_python(graph, seeds, 3, 21, 3, 6, backend, device)
        check_against_python(graph, seeds[:1, :1], 1, 1, None, None, backend, device)
        atol, rtol = GRAPH.tolerance(backend, torch.int64)
        assert atol == rtol == 0.0  # integer outputs: identical


@pytest.mark.host_sync
@pytest.mark.parametrize("backend", [b for b in ("torch", "triton") if b in BACKENDS])
def test_gpu_paths_never_synchronise_with_the_host(monkeypatch, backend):
    """The code a CUDA tensor runs, here on CPU tensors inside a mode that raises on every
    tensor-to-host conversion; value checks behave as on CUDA (device-side assertions)."""
    from streammem_kernels import graph as graph_module

    guard_backend(monkeypatch, GRAPH, backend)
    monkeypatch.setattr(graph_module, "check_values", lambda ok, message: torch._assert_async(ok, message))
    graph = random_graph(29, 80, seed=9, weighted=True, symmetric=True)
    chunk_map = CSRGraph.from_edges(torch.arange(29), torch.arange(29) % 7, 29, num_cols=7)
    seeds = torch.tensor([[0, 5, -1, 5], [28, 1, 2, 3]])
    graph.max_degree  # the torch reference without max_fanout pads to it: read once, outside
    with no_host_sync():
        near = khop_neighbourhood(graph, seeds, 2, capacity=17, max_fanout=4, max_frontier=6, backend=backend)
        uncapped = khop_neighbourhood(graph, seeds, 3, capacity=29, backend=backend)
        chunks = neighbourhood_chunks(near.nodes, chunk_map, capacity=5, backend=backend)
    for got, kwargs in ((near, dict(hops=2, capacity=17, max_fanout=4, max_frontier=6)),
                        (uncapped, dict(hops=3, capacity=29))):
        want = khop_neighbourhood(graph, seeds, backend="cpp" if "cpp" in BACKENDS else "torch", **kwargs)
        for a, b in zip(got, want):
            assert torch.equal(a, b)
    assert torch.equal(chunks.chunks, neighbourhood_chunks(near.nodes, chunk_map, capacity=5,
                                                           backend="torch").chunks)


@pytest.mark.host_sync
def test_the_guard_catches_the_documented_sync():
    # The torch reference without max_fanout reads the graph's max degree once: that is a host sync.
    graph = CSRGraph.from_edges([0, 1], [1, 0], 2)
    graph._max_degree = None
    with no_host_sync(), pytest.raises(HostSync):
        khop_neighbourhood(graph, [[0]], 1, capacity=2, backend="torch")


@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_every_public_function_captures_in_a_cuda_graph(backend):
    if backend not in device_backends(GRAPH, "cuda"):
        pytest.skip(f"backend {backend} cannot run on this GPU")
    graph, emb, chunk_map, queries = memory(n=301, dim=32)
    graph, chunk_map, emb, queries = graph.to("cuda"), chunk_map.to("cuda"), emb.cuda(), queries.cuda()
    graph.max_degree, chunk_map.max_degree  # cached before the capture (the torch reference pads to it)
    seeds = torch.randint(-1, 301, (9, 5), generator=torch.Generator().manual_seed(1)).cuda()
    cases = [
        lambda: torch.stack(khop_neighbourhood(graph, seeds, 2, capacity=64, backend=backend)[:5]),
        lambda: torch.stack(khop_neighbourhood(graph, seeds, 3, capacity=33, max_fanout=3, max_frontier=9,
                                               backend=backend)[:5]),
        lambda: neighbourhood_chunks(seeds, chunk_map, capacity=16, backend=backend).chunks,
        lambda: graph_retrieve(queries, emb, graph, k=4, hops=2, capacity=40, chunk_map=chunk_map,
                               backend=backend).neighbourhood.nodes,
    ]
    for fn in cases:
        eager, replayed = capture_in_cuda_graph(fn)
        assert torch.equal(eager, replayed)
    check_against_python(graph.to("cpu"), seeds.cpu(), 3, 33, 3, 9, backend, "cuda")


def test_exported_from_the_package():
    for name in ("CSRGraph", "Neighbourhood", "SourceChunks", "GraphRetrieval", "khop_neighbourhood",
                 "neighbourhood_chunks", "graph_retrieve"):
        assert name in sk.__all__ and getattr(sk, name) is getattr(sk.graph, name)
    assert "graph" in sk.backend_report().functions
