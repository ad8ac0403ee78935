"""Cosine memory tree: CosineTree growth, tree_search (greedy / beam), cosine_topk.

Every backend is compared with the torch reference; the reference itself is
checked against a plain-Python rendering of StreamChat's Algorithm 1 and
against brute-force sorts.
"""
import math
import random

import numpy as np
import pytest
import torch

from tests.support.device_checks import cpu_backends
from tests.support.device_checks import DEVICES, HAS_CUDA, capture_in_cuda_graph, device_backends, guard_backend
from streammem_kernels import CosineTree, cosine_topk, tree_search
from streammem_kernels.runtime.launch import recording_gpu_launches
from streammem_kernels.runtime.native import view
from streammem_kernels.tree.reference import cosine_topk_reference
from streammem_kernels.tree.reference import unit_rows as _unit_rows
from streammem_kernels.tree.topk import COSINE_TOPK, _cosine_topk_cpp_blas, _cosine_topk_cpp_fused, cosine_topk_uses_blas
from streammem_kernels.tree.search import TREE_SEARCH

TREE_BACKENDS = cpu_backends(TREE_SEARCH)
TOPK_BACKENDS = cpu_backends(COSINE_TOPK)


def runs_beam_search(backend, device) -> bool:
    """tree_search has one Op; its CUDA backend declares that beam search is not its job."""
    return not TREE_SEARCH.reasons(backend, torch.device(device), greedy=False)
SCORE_ATOL = 2e-5  # float32 dot products of unit vectors, summed in different orders


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------
def build_tree(n_leaves, group, dim, *, seed=0, leftover=0, grow_every=None):
    """Leaves around chronological event centres, grown with `group`; then
    `leftover` leaves appended without growing (an unbalanced forest)."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(max(1, n_leaves // 7 + 1), dim, generator=g)
    emb = centres.repeat_interleave(7, 0)[:n_leaves] + 0.7 * torch.randn(n_leaves, dim, generator=g)
    tree = CosineTree(dim, capacity=3)
    if grow_every:
        for lo in range(0, n_leaves, grow_every):
            tree.add_leaves(emb[lo : lo + grow_every])
            tree.grow(group)
    else:
        tree.add_leaves(emb)
        tree.grow(group)
    if leftover:
        tree.add_leaves(torch.randn(leftover, dim, generator=g))
    return tree


def check_invariants(tree: CosineTree):
    n = tree.num_nodes
    parent, level = tree.parent.tolist(), tree.level.tolist()
    ptr, kids = tree.child_ptr.tolist(), tree.child_idx.tolist()
    assert len(ptr) == n + 1 and ptr[0] == 0 and ptr[-1] == len(kids)
    seen_as_child = [0] * n
    for p in range(n):
        assert ptr[p] <= ptr[p + 1]
        children = kids[ptr[p] : ptr[p + 1]]
        assert children == sorted(children) and len(set(children)) == len(children), "children chronological"
        if children:
            assert level[p] == 1 + max(level[c] for c in children)
            assert all(c < p for c in children), "a parent is appended after its children"
        else:
            assert level[p] == 0
        for c in children:
            assert parent[c] == p
            seen_as_child[c] += 1
    for node in range(n):
        # every non-root has exactly one parent; roots have none
        assert seen_as_child[node] == (0 if parent[node] == -1 else 1)
    assert tree.roots.tolist() == [i for i in range(n) if parent[i] == -1]
    assert tree.max_fanout == max((ptr[p + 1] - ptr[p] for p in range(n)), default=0)
    emb_norm = torch.linalg.vector_norm(tree.embeddings, dim=1)
    assert bool(((emb_norm - 1).abs() < 1e-5).logical_or(emb_norm == 0).all())


def on_device(tree: CosineTree, device: str) -> CosineTree:
    """The same tree (ids, tombstones, utility) with its tensors on ``device``."""
    if device == "cpu":
        return tree
    return CosineTree.from_state_dict(tree.state_dict(), device=device)


def fast_backends(op, device):
    """Backends compared with the reference on ``device`` (the reference itself excluded)."""
    return [b for b in device_backends(op, device) if b != "torch"]


def algorithm1(tree: CosineTree, query) -> tuple[list[int], list[float], int, float]:
    """StreamChat Algorithm 1 written plainly: score roots, walk to the best child."""
    emb = tree.embeddings.double().tolist()
    q = [float(x) for x in query]
    norm = math.sqrt(sum(x * x for x in q))
    q = [x / norm for x in q] if norm > 0 else q

    def sim(node):
        return sum(a * b for a, b in zip(q, emb[node]))

    best_node, best_score = None, -math.inf
    path, scores = [], []
    candidates = tree.roots.tolist()
    while candidates:
        chosen, chosen_score = None, -math.inf
        for node in candidates:
            s = sim(node)
            if chosen is None or s > chosen_score:
                chosen, chosen_score = node, s
        path.append(chosen)
        scores.append(chosen_score)
        if chosen_score > best_score:
            best_node, best_score = chosen, chosen_score
        candidates = tree.children(chosen).tolist()
    return path, scores, best_node, best_score


def brute_topk(queries, keys, k, ranges=None, allowed=None, weight=None, min_score=None):
    """float64 brute force: sort by (score desc, index asc)."""
    qn = _unit_rows(torch.as_tensor(queries)).double().numpy()
    kn = _unit_rows(torch.as_tensor(keys)).double().numpy()
    sims = qn @ kn.T
    ids = np.full((len(qn), k), -1)
    scores = np.full((len(qn), k), -np.inf)
    for q in range(len(qn)):
        lo, hi = (0, len(kn)) if ranges is None else ranges[q]
        cand = [i for i in range(lo, hi) if allowed is None or i in allowed]
        if min_score is not None:
            cand = [i for i in cand if sims[q, i] >= min_score]
        rank = {i: sims[q, i] * (1.0 if weight is None else weight[i]) for i in cand}
        order = sorted(cand, key=lambda i: (-rank[i], i))[:k]
        ids[q, : len(order)] = order
        scores[q, : len(order)] = [rank[i] for i in order]
    return ids, scores


def assert_topk_equal(res, ids, scores, atol=SCORE_ATOL):
    assert res.ids.dtype == torch.int64 and res.scores.dtype == torch.float32
    np.testing.assert_array_equal(res.ids.numpy(), ids)
    np.testing.assert_allclose(res.scores.numpy(), scores, atol=atol, rtol=0)


def assert_same_path(a, b):
    for x, y in zip(a, b):
        if x.dtype == torch.int64:
            assert torch.equal(x, y)
        else:
            torch.testing.assert_close(x, y, atol=SCORE_ATOL, rtol=0)


# --------------------------------------------------------------------------
# Backends agree with the reference
# --------------------------------------------------------------------------
# (leaves, group, D, Q, leftover leaves): depths 0..6, g 2..16, unbalanced forests.
TREE_CASES = [
    (1, 2, 1, 1, 0),
    (5, 2, 3, 7, 0),
    (64, 2, 16, 1, 0),  # depth 6
    (70, 2, 1, 9, 3),  # D = 1: every cosine is +-1 or 0 -> ties broken by id
    (300, 16, 1024, 3, 5),
    (200, 3, 5, 1000, 2),
    (400, 10, 384, 5, 0),
    (1000, 10, 48, 1000, 0),
]


def assert_matches_reference(got, ref, backend, what):
    """Ids exactly; scores within the backend's declared tolerance (queries are float32 here)."""
    atol, rtol = TREE_SEARCH.tolerance(backend, torch.float32)
    for x, y, field in zip(got, ref, ref._fields):
        if y.dtype == torch.int64:
            assert torch.equal(x.cpu(), y.cpu()), f"{backend} {what}: {field} differs"
        else:
            torch.testing.assert_close(x.cpu(), y.cpu(), atol=atol, rtol=rtol, msg=f"{backend} {what}: {field}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n_leaves,group,dim,num_q,leftover", TREE_CASES)
def test_backends_match_reference(device, n_leaves, group, dim, num_q, leftover):
    tree = on_device(build_tree(n_leaves, group, dim, seed=n_leaves, leftover=leftover), device)
    gen = torch.Generator().manual_seed(1)
    queries = torch.randn(num_q + 2, dim, generator=gen)[1 : num_q + 1].to(device)  # sliced
    utility = torch.rand(tree.num_nodes, generator=gen)
    for backend in fast_backends(TREE_SEARCH, device):
        q = queries
        if backend == "triton" and device == "cpu":
            q = queries[:24]  # interpreted Triton costs ~ms per operation: same kernels, fewer query blocks
        tree.set_utility(torch.arange(tree.num_nodes), 1.0)
        for from_every_root in (False, True):
            kw = dict(from_every_root=from_every_root)
            assert_matches_reference(tree_search(tree, q, backend=backend, **kw),
                                     tree_search(tree, q, backend="torch", **kw), backend, kw)
        for beam, k, use_utility, min_score in (((5, 10), 3, False, None), (2, 7, True, 0.1), ((1,), 1, False, None)):
            if use_utility:
                tree.set_utility(torch.arange(tree.num_nodes), utility)
            kw = dict(beam=beam, k=k, use_utility=use_utility, min_score=min_score)
            if TREE_SEARCH.reasons(backend, q.device, greedy=False):  # the CUDA backend is greedy only
                with pytest.raises(RuntimeError, match="greedy search .* only"):
                    tree_search(tree, q, backend=backend, **kw)
                continue
            assert_matches_reference(tree_search(tree, q, backend=backend, **kw),
                                     tree_search(tree, q, backend="torch", **kw), backend, kw)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_query_dtypes_are_converted_to_float32(dtype):
    tree = build_tree(50, 4, 12, seed=3)
    queries = torch.randn(6, 12).to(dtype)
    for backend in TREE_BACKENDS:
        got = tree_search(tree, queries, beam=3, k=4, backend=backend)
        ref = tree_search(tree, queries.float(), beam=3, k=4, backend="torch")
        assert torch.equal(got.ids, ref.ids)


# --------------------------------------------------------------------------
# Greedy search is Algorithm 1
# --------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(4))
def test_greedy_equals_python_algorithm1(seed):
    rng = random.Random(seed)
    tree = build_tree(rng.randint(1, 120), rng.randint(2, 6), 16, seed=seed, leftover=rng.randint(0, 4))
    queries = torch.randn(20, 16, generator=torch.Generator().manual_seed(seed))
    for backend in TREE_BACKENDS:
        res = tree_search(tree, queries, backend=backend)
        for q in range(len(queries)):
            path, scores, best_node, best_score = algorithm1(tree, queries[q].tolist())
            width = tree.height + 1
            assert res.path[q].tolist() == path + [-1] * (width - len(path))
            np.testing.assert_allclose(res.path_scores[q, : len(path)].numpy(), scores, atol=SCORE_ATOL)
            assert bool(torch.isneginf(res.path_scores[q, len(path) :]).all())
            assert int(res.best_node[q]) == best_node
            assert abs(float(res.best_score[q]) - best_score) < SCORE_ATOL


def test_greedy_with_all_similarities_negative_still_returns_the_best_node():
    tree = CosineTree(4)
    tree.add_leaves(torch.rand(30, 4) + 0.1)  # all entries positive
    tree.grow(3)
    query = -torch.ones(1, 4)  # every cosine < 0
    for backend in TREE_BACKENDS:
        res = tree_search(tree, query, backend=backend)
        assert int(res.best_node[0]) >= 0 and float(res.best_score[0]) < 0
        on_path = res.path_scores[0][res.path[0] >= 0]
        assert float(res.best_score[0]) == float(on_path.max())
        path, _, best_node, _ = algorithm1(tree, query[0].tolist())
        assert int(res.best_node[0]) == best_node and res.path[0][: len(path)].tolist() == path


def test_from_every_root_descends_from_each_root():
    tree = build_tree(40, 4, 8, seed=5, leftover=3)
    queries = torch.randn(3, 8)
    roots = tree.roots.tolist()
    for backend in TREE_BACKENDS:
        res = tree_search(tree, queries, from_every_root=True, backend=backend)
        assert res.path.shape == (3, len(roots), tree.height + 1)
        assert res.path[:, :, 0].tolist() == [roots] * 3
        for r, root in enumerate(roots):
            depth = int(tree.level[root]) + 1  # greedy walks one node per level down to a leaf
            assert bool((res.path[:, r, :depth] >= 0).all()) and bool((res.path[:, r, depth:] == -1).all())


# --------------------------------------------------------------------------
# Beam search
# --------------------------------------------------------------------------
@pytest.mark.parametrize("backend", TREE_BACKENDS)
@pytest.mark.parametrize("use_utility,min_score", [(False, None), (True, None), (False, 0.2), (True, -0.1)])
def test_wide_beam_equals_exhaustive_search(backend, use_utility, min_score):
    tree = build_tree(150, 5, 24, seed=7, leftover=4)
    utility = torch.rand(tree.num_nodes, generator=torch.Generator().manual_seed(2)) + 0.1
    tree.set_utility(torch.arange(tree.num_nodes), utility)
    queries = torch.randn(9, 24, generator=torch.Generator().manual_seed(3))
    widest = int(torch.bincount(tree.level).max())
    leaves = set(torch.nonzero(tree.level == 0)[:, 0].tolist())
    res = tree_search(tree, queries, beam=widest, k=12, use_utility=use_utility, min_score=min_score, backend=backend)
    ids, scores = brute_topk(queries, tree.embeddings, 12, allowed=leaves,
                             weight=utility.double().numpy() if use_utility else None, min_score=min_score)
    assert_topk_equal(res, ids, scores)


@pytest.mark.parametrize("backend", TREE_BACKENDS)
@pytest.mark.parametrize("width,k", [(31, 32), (32, 33), (33, 40), (40, 31), (3, 64)])
def test_beam_selection_on_both_sides_of_the_small_select(backend, width, k):
    """Level widths and k on both sides of 32 (the C++ beam keeps up to 32 best in a sorted array,
    more with partial_sort): the torch reference's ids and scores, exact ties (duplicate leaves,
    the lower id first) included."""
    g = torch.Generator().manual_seed(21)
    emb = torch.randn(600, 16, generator=g)
    emb[300:340] = emb[0:40]  # duplicates: equal scores, ranked by id
    tree = CosineTree(16, capacity=8)
    tree.add_leaves(emb)
    tree.grow(12)
    assert int(torch.bincount(tree.level)[1]) > width  # the level below the top is scored, not kept whole
    queries = torch.cat([emb[[0, 5, 310]], torch.randn(5, 16, generator=g)])
    got = tree_search(tree, queries, beam=(2, width), k=k, backend=backend)
    want = tree_search(tree, queries, beam=(2, width), k=k, backend="torch")
    assert torch.equal(got.ids, want.ids)
    torch.testing.assert_close(got.scores, want.scores, atol=SCORE_ATOL, rtol=0)
    tied = (got.scores[:, :-1] == got.scores[:, 1:]) & (got.ids[:, 1:] >= 0)  # not the -1 / -inf padding
    assert bool((got.ids[:, :-1][tied] < got.ids[:, 1:][tied]).all())  # equal scores: the lower id first
    if width > 3:  # wide enough to reach both copies of some queried leaf: exact ties were ranked
        assert bool(tied.any())


def test_beam_prostream_hierarchy_recall():
    """Scenes -> events -> units with (5, 10): the true best unit is found."""
    g = torch.Generator().manual_seed(11)
    dim, scenes, events, units = 32, 12, 6, 8
    tree = CosineTree(dim)
    scene_c = torch.randn(scenes, dim, generator=g) * 3
    event_c = scene_c.repeat_interleave(events, 0) + torch.randn(scenes * events, dim, generator=g)
    unit_emb = event_c.repeat_interleave(units, 0) + 0.3 * torch.randn(scenes * events * units, dim, generator=g)
    tree.add_leaves(unit_emb)
    for e in range(scenes * events):
        tree.add_parent(list(range(e * units, (e + 1) * units)), event_c[e])
    level1 = tree.roots_at(1)
    for s in range(scenes):
        tree.add_parent(level1[s * events : (s + 1) * events], scene_c[s])
    assert tree.height == 2 and len(tree.roots) == scenes
    queries = unit_emb[torch.randint(0, len(unit_emb), (40,), generator=g)] + 0.1 * torch.randn(40, dim, generator=g)
    exact, _ = brute_topk(queries, unit_emb, 1)
    for backend in TREE_BACKENDS:
        res = tree_search(tree, queries, beam=(5, 10), k=3, backend=backend)
        recall = float((res.ids[:, 0].numpy() == exact[:, 0]).mean())
        assert recall >= 0.95


def test_beam_pads_when_fewer_leaves_qualify():
    tree = build_tree(6, 3, 5, seed=1)
    queries = torch.randn(2, 5)
    for backend in TREE_BACKENDS:
        res = tree_search(tree, queries, beam=4, k=10, backend=backend)
        assert bool((res.ids[:, 6:] == -1).all()) and bool(torch.isneginf(res.scores[:, 6:]).all())
        res = tree_search(tree, queries, beam=4, k=3, min_score=1.5, backend=backend)  # nothing qualifies
        assert bool((res.ids == -1).all())


def test_beam_keeps_narrow_levels_unscored_and_breaks_ties_by_id():
    """A level with no more nodes than its width is kept whole (the C++ search skips scoring it), a
    wider one keeps its best by (score, lower id): on a tree of duplicated rows (exact ties at
    every level), each single-query fast-path search equals the reference."""
    g = torch.Generator().manual_seed(13)
    base = torch.randn(9, 16, generator=g)
    tree = CosineTree(16)
    rows = torch.cat([base.repeat(3, 1), 0.5 * base.repeat(3, 1) + torch.randn(27, 16, generator=g)])
    tree.add_leaves(rows[torch.randperm(54, generator=g)])  # 27 leaves are 9 rows 3 times each
    tree.grow(3)
    tree.add_leaves(base[:2])  # leaf roots beside the grown part
    queries = torch.cat([torch.randn(5, 16, generator=g), base[:3], torch.zeros(1, 16)])
    levels = torch.bincount(tree.level).tolist()
    for beam in ((1,), (2, 3), (levels[-1], 4), (100,)):
        ref = tree_search(tree, queries, beam=beam, k=7, backend="torch")
        for i in range(queries.shape[0]):
            got = tree_search(tree, queries[i : i + 1].contiguous(), beam=beam, k=7)
            assert torch.equal(got.ids[0], ref.ids[i]), (beam, i)
            torch.testing.assert_close(got.scores[0], ref.scores[i], atol=SCORE_ATOL, rtol=0)


def test_large_tables_search_like_small_ones():
    """Tables from 4 MB up are allocated for huge pages (cosine_tree._storage): the same
    contents (zero-filled past the used prefix) and the same search results as a small tree."""
    g = torch.Generator().manual_seed(5)
    emb = torch.randn(600, 384, generator=g)
    small, large = CosineTree(384, capacity=4), CosineTree(384, capacity=4000)  # 6 MB of embeddings
    for t in (small, large):
        t.add_leaves(emb)
        t.grow(6)
    assert bool((large._emb[large.num_nodes :] == 0).all()) and bool((large._child_ptr[large.num_nodes + 1 :] == 0).all())
    for name in ("embeddings", "level", "parent", "child_ptr", "child_idx", "roots"):
        assert torch.equal(getattr(small, name), getattr(large, name)), name
    queries = torch.randn(3, 384, generator=g)
    for kwargs in (dict(), dict(beam=(2, 3), k=5)):
        for a, b in zip(tree_search(small, queries, **kwargs), tree_search(large, queries, **kwargs)):
            assert torch.equal(a, b)


# --------------------------------------------------------------------------
# cosine_topk
# --------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_q,num_k,dim,k", [(1, 1, 1, 1), (5, 7, 3, 9), (20, 300, 384, 5), (17, 300, 1, 4),
                                               (3, 300, 64, 12), (1, 700, 97, 9)])
@pytest.mark.parametrize("with_ranges", [False, True])
def test_cosine_topk_equals_brute_force_sort(device, num_q, num_k, dim, k, with_ranges):
    g = torch.Generator().manual_seed(num_q * num_k + dim)
    keys = torch.randn(num_k + 1, dim, generator=g)[1:]  # sliced rows
    keys[::11] *= 0  # zero keys score 0
    queries = torch.randn(num_q, dim, generator=g)
    ranges = None
    if with_ranges:
        start = torch.randint(0, num_k + 1, (num_q,), generator=g)
        end = start + torch.randint(0, num_k + 1, (num_q,), generator=g)
        ranges = torch.stack([start, end.clamp_max(num_k)], 1)
    ids, scores = brute_topk(queries, keys, k, ranges=None if ranges is None else ranges.tolist())
    for backend in device_backends(COSINE_TOPK, device):
        res = cosine_topk(queries.to(device), keys.to(device), k,
                          ranges=None if ranges is None else ranges.to(device), backend=backend)
        res = type(res)(*(t.cpu() for t in res))
        # Every score is exactly +-1 or 0 at D = 1: many ties, broken toward the lower index.
        atol = 0 if dim == 1 else max(SCORE_ATOL, COSINE_TOPK.tolerance(backend, torch.float32)[0])
        assert_topk_equal(res, ids, scores, atol=atol)
        if ranges is not None:
            inside = (res.ids >= ranges[:, :1]) & (res.ids < ranges[:, 1:])
            assert bool((inside | (res.ids == -1)).all())


@pytest.mark.parametrize("path", [_cosine_topk_cpp_fused, _cosine_topk_cpp_blas])
def test_both_cpp_paths_match_brute_force(path):
    if "cpp" not in TOPK_BACKENDS:
        pytest.skip("C++ backend not built")
    g = torch.Generator().manual_seed(4)
    keys = torch.randn(2500, 48, generator=g)
    keys[100] = keys[7]  # exact duplicate: the tie goes to index 7
    queries = torch.cat([keys[7:8] * 2, torch.randn(40, 48, generator=g)])
    ranges = torch.tensor([[0, 2500]] * 41)
    ranges[5:10] = torch.tensor([300, 310])
    ids, scores = path(_unit_rows(queries), keys, 6, ranges)
    want_ids, want_scores = brute_topk(queries, keys, 6, ranges=ranges.tolist())
    assert ids[0, :2].tolist() == [7, 100]
    np.testing.assert_array_equal(ids.numpy(), want_ids)
    np.testing.assert_allclose(scores.numpy(), want_scores, atol=SCORE_ATOL)


def test_blas_rule():
    assert not cosine_topk_uses_blas(1, 10**6)
    assert cosine_topk_uses_blas(64, 10**6)
    narrow = torch.tensor([[0, 10]] * 64)
    assert not cosine_topk_uses_blas(64, 10**6, narrow)


def test_zero_vectors_score_zero_never_nan():
    keys = torch.zeros(4, 6)
    keys[2, 0] = 1.0
    for backend in TOPK_BACKENDS:
        res = cosine_topk(torch.zeros(2, 6), keys, 4, backend=backend)  # zero queries: all ties at 0
        assert res.ids.tolist() == [[0, 1, 2, 3]] * 2 and bool((res.scores == 0).all())
    tree = CosineTree(6)
    tree.add_leaves(keys)
    tree.grow(2)
    for backend in TREE_BACKENDS:
        res = tree_search(tree, torch.zeros(1, 6), backend=backend)
        assert not bool(torch.isnan(res.path_scores).any()) and float(res.best_score[0]) == 0.0


# --------------------------------------------------------------------------
# Growth, invariants, persistence
# --------------------------------------------------------------------------
def test_invariants_after_10000_random_appends():
    rng = random.Random(0)
    dim = 6
    tree = CosineTree(dim, capacity=1)
    appended = 0
    while appended < 10_000:
        roll = rng.random()
        levels = [lvl for lvl in range(tree.height + 1) if tree.roots_at(lvl)]
        roots = tree.roots_at(rng.choice(levels)) if levels else []
        if roll < 0.6 or len(roots) < 2:
            n = rng.randint(1, 4)
            tree.add_leaves(torch.randn(n, dim), payload=torch.arange(appended, appended + n))
            appended += n
        elif roll < 0.85:
            children = rng.sample(roots, rng.randint(1, min(6, len(roots))))
            tree.add_parent(children, torch.randn(dim), payload=appended)
            appended += 1
        else:
            appended += len(tree.grow(rng.randint(2, 16)))
        if rng.random() < 0.002:
            check_invariants(tree)
    check_invariants(tree)
    assert tree.num_nodes == appended


def test_grow_after_every_leaf_equals_grow_once():
    streamed = build_tree(503, 10, 8, seed=2, grow_every=1)
    batched = build_tree(503, 10, 8, seed=2)

    def leaf_spans(tree):
        """Each node as (level, its leaves in arrival order) -> embedding."""
        leaf_rank = {int(n): r for r, n in enumerate(torch.nonzero(tree.level == 0)[:, 0])}
        spans = {}
        for node in range(tree.num_nodes):
            stack, leaves = [node], []
            while stack:
                cur = stack.pop()
                kids = tree.children(cur).tolist()
                if not kids:
                    leaves.append(leaf_rank[cur])
                stack.extend(reversed(kids))
            spans[(int(tree.level[node]), tuple(leaves))] = tree.embeddings[node]
        return spans

    a, b = leaf_spans(streamed), leaf_spans(batched)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key])
    # chronological grouping: leaves 0..9 share the first parent, 10..19 the second, ...
    assert (1, tuple(range(10))) in a and (2, tuple(range(100))) in a and (2, tuple(range(400, 500))) in a
    assert batched.parent[:20].tolist() == [503] * 10 + [504] * 10
    assert batched.roots_at(0) == [500, 501, 502] and len(batched.roots_at(2)) == 5


def test_grow_with_custom_parent_embedding():
    tree = CosineTree(3)
    tree.add_leaves(torch.eye(3).repeat(2, 1))
    seen = []

    def first_child(child_ids):
        seen.append(child_ids.tolist())
        return tree.embeddings[child_ids[0]] * 5

    tree.grow(2, parent_embed=first_child)
    assert seen[:3] == [[0, 1], [2, 3], [4, 5]]
    torch.testing.assert_close(tree.embeddings[6], torch.tensor([1.0, 0.0, 0.0]))


def test_save_load_round_trip(tmp_path):
    tree = build_tree(120, 4, 10, seed=9, leftover=3)
    tree.set_utility(torch.tensor([1, 5]), torch.tensor([0.5, 2.0]))
    path = tmp_path / "tree.pt"
    tree.save(path)
    back = CosineTree.load(path)
    for name in ("embeddings", "level", "parent", "child_ptr", "child_idx", "utility", "payload", "roots"):
        assert torch.equal(getattr(back, name), getattr(tree, name)), name
    queries = torch.randn(5, 10)
    assert_same_path(tree_search(back, queries), tree_search(tree, queries))
    # growth continues identically after a reload
    extra = torch.randn(9, 10)
    for t in (tree, back):
        t.add_leaves(extra)
        t.grow(4)
    assert torch.equal(back.parent, tree.parent) and torch.equal(back.child_idx, tree.child_idx)
    # a corrupted file is rejected instead of reaching the kernels
    state = tree.state_dict()
    state["child_idx"][0] = tree.num_nodes + 5
    with pytest.raises(ValueError, match="inconsistent"):
        CosineTree.from_state_dict(state)


# --------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------
def test_bad_input_raises_value_error_naming_the_argument():
    tree = build_tree(20, 4, 5)
    q = torch.randn(2, 5)
    with pytest.raises(ValueError, match="queries"):
        tree_search(tree, torch.randn(2, 4))
    with pytest.raises(ValueError, match="tree"):
        tree_search(CosineTree(5), q)
    with pytest.raises(ValueError, match="queries"):
        tree_search(tree, torch.tensor([[float("nan")] * 5]))
    with pytest.raises(ValueError, match="k"):
        tree_search(tree, q, beam=3, k=0)
    with pytest.raises(ValueError, match=r"beam\[1\]"):
        tree_search(tree, q, beam=(3, 0))
    with pytest.raises(ValueError, match="beam"):
        tree_search(tree, q, beam=0)
    with pytest.raises(ValueError, match="k, min_score"):
        tree_search(tree, q, k=3)
    with pytest.raises(ValueError, match="from_every_root"):
        tree_search(tree, q, beam=2, from_every_root=True)
    keys = torch.randn(10, 5)
    with pytest.raises(ValueError, match="k"):
        cosine_topk(q, keys, 0)
    with pytest.raises(ValueError, match="ranges"):
        cosine_topk(q, keys, 1, ranges=torch.tensor([[0, 11], [0, 1]]))
    with pytest.raises(ValueError, match="ranges"):
        cosine_topk(q, keys, 1, ranges=torch.tensor([[3, 2], [0, 1]]))
    with pytest.raises(ValueError, match="keys"):
        cosine_topk(q, torch.tensor([[float("inf")] * 5]), 1)
    with pytest.raises(ValueError, match="queries"):
        cosine_topk(q, torch.randn(10, 4), 1)
    with pytest.raises(ValueError, match="child_ids"):
        tree.add_parent([0], torch.randn(5))  # node 0 already has a parent
    with pytest.raises(ValueError, match="emb"):
        tree.add_leaves(torch.randn(3, 4))


def test_inputs_are_not_modified():
    keys = torch.randn(30, 4) * 3
    queries = torch.randn(3, 4) * 2
    keys0, queries0 = keys.clone(), queries.clone()
    for backend in TOPK_BACKENDS:
        cosine_topk(queries, keys, 3, backend=backend)
    assert torch.equal(keys, keys0) and torch.equal(queries, queries0)
    emb = torch.randn(5, 4) * 7
    emb0 = emb.clone()
    CosineTree(4).add_leaves(emb)
    assert torch.equal(emb, emb0)


def test_opcheck():
    tree = build_tree(30, 3, 8, seed=4, leftover=2)
    q = _unit_rows(torch.randn(4, 8))
    arrays = (tree.embeddings, tree.child_ptr, tree.child_idx, tree.roots)
    # The fake (meta) kernels do not depend on the backend: check the one auto picks.
    for backend in [TREE_BACKENDS[min(1, len(TREE_BACKENDS) - 1)]]:
        fanout = tree.max_fanout
        torch.library.opcheck(torch.ops.streammem.tree_greedy.default,
                              (*arrays, q, tree.height, fanout, False, backend))
        torch.library.opcheck(torch.ops.streammem.tree_greedy.default,
                              (*arrays, q, tree.height, fanout, True, backend))
        torch.library.opcheck(
            torch.ops.streammem.tree_beam.default,
            (*arrays, tree.level, tree.utility, q, [2] * tree.height, fanout, 3, -1.0, True, backend),
        )
        ranges = torch.tensor([[0, 30], [2, 9], [0, 0], [5, 30]])
        torch.library.opcheck(torch.ops.streammem.cosine_topk.default, (q, torch.randn(30, 8), 4, ranges, backend))


# --------------------------------------------------------------------------
# Tie rule: identical rows score identically on every backend
# --------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_identical_keys_rank_lowest_index_first(device):
    """Regression: with 50 identical keys the torch reference returned [48, 49, 0, 1] and
    Triton [8, 9, 10, 11] (a GEMM sums each dot product in an order that depends on where
    the key falls in its tiles, so identical keys scored an ulp apart), although the
    contract breaks ties toward the lower index: [0, 1, 2, 3]."""
    gen = torch.Generator().manual_seed(5)
    cases = [(1, 50, 384), (3, 50, 97), (17, 300, 8), (16, 1000, 48), (64, 4099, 48)]
    for num_q, num_k, dim in cases:
        keys = torch.randn(dim, generator=gen).repeat(num_k, 1).to(device)
        queries = torch.randn(num_q, dim, generator=gen).to(device)
        lo = torch.arange(num_q) % max(1, num_k - 4)
        ranges = torch.stack([lo, torch.full_like(lo, num_k)], 1).to(device)
        for backend in device_backends(COSINE_TOPK, device):
            if backend == "triton" and device == "cpu" and num_k > 300:
                continue  # the interpreter: the same kernels as the smaller cases
            res = cosine_topk(queries, keys, 4, backend=backend)
            assert res.ids.tolist() == [[0, 1, 2, 3]] * num_q, (backend, num_q, num_k, dim)
            assert bool((res.scores == res.scores[:, :1]).all())
            res = cosine_topk(queries, keys, 4, ranges=ranges, backend=backend)
            want = (lo[:, None] + torch.arange(4)).tolist()
            assert res.ids.tolist() == want, (backend, num_q, num_k, dim, "ranges")


@pytest.mark.parametrize("device", DEVICES)
def test_identical_nodes_resolve_to_lowest_id(device):
    """Every node of the tree has the same embedding: greedy descends through the first
    root and first children, beam search returns the lowest leaf ids."""
    v = torch.randn(40, generator=torch.Generator().manual_seed(6))
    tree = CosineTree(40, device=device)
    tree.add_leaves(v.repeat(90, 1))
    tree.grow(4, parent_embed=lambda child_ids: v)  # 88 leaves under 22 parents ..., leaves 88, 89 stay roots
    tree.add_leaves(v.repeat(3, 1))
    assert bool((tree.embeddings == tree.embeddings[:1]).all())
    queries = torch.randn(17, 40, generator=torch.Generator().manual_seed(7)).to(device)
    path, node = [], int(tree.roots[0])
    while True:
        path.append(node)
        kids = tree.children(node)
        if kids.numel() == 0:
            break
        node = int(kids[0])
    widest = int(torch.bincount(tree.level).max())
    leaves = sorted(int(i) for i in torch.nonzero(tree.level == 0)[:, 0])
    for backend in device_backends(TREE_SEARCH, device):
        for q in (queries[:1], queries):
            res = tree_search(tree, q, backend=backend)
            assert res.path.tolist() == [path + [-1] * (tree.height + 1 - len(path))] * len(q), backend
            assert res.best_node.tolist() == [path[0]] * len(q), backend  # first maximum on the path
            if not runs_beam_search(backend, device):
                continue  # greedy-only backend (cuda)
            res = tree_search(tree, q, beam=widest, k=6, backend=backend)
            assert res.ids.tolist() == [leaves[:6]] * len(q), backend


# --------------------------------------------------------------------------
# GPU path: launch configuration, no host synchronisation, CUDA graphs
# --------------------------------------------------------------------------
def _gpu_path_calls(tree, keys, queries, device):
    """Every launch path of both public functions (one call each): (name, fn) pairs."""
    g = torch.Generator().manual_seed(9)
    n = keys.shape[0]
    start = torch.randint(0, n, (len(queries),), generator=g)
    ranges = torch.stack([start, (start + torch.randint(0, n, (len(queries),), generator=g)).clamp_max(n)], 1)
    ranges = ranges.to(device)
    calls = []
    for q in (queries[:1], queries):
        for backend in device_backends(TREE_SEARCH, device):
            calls += [
                (f"greedy Q={len(q)} {backend}", backend, lambda q=q, b=backend: tree_search(tree, q, backend=b)),
                (f"every root Q={len(q)} {backend}", backend,
                 lambda q=q, b=backend: tree_search(tree, q, from_every_root=True, backend=b)),
            ]
            if not runs_beam_search(backend, device):
                continue  # the CUDA kernel is greedy descent only
            calls += [
                (f"beam Q={len(q)} {backend}", backend,
                 lambda q=q, b=backend: tree_search(tree, q, beam=(2, 3), k=4, use_utility=True, min_score=-0.5,
                                                    backend=b)),
                (f"topk Q={len(q)} {backend}", backend, lambda q=q, b=backend: cosine_topk(q, keys, 5, backend=b)),
                (f"topk k=1 ranges Q={len(q)} {backend}", backend,
                 lambda q=q, b=backend: cosine_topk(q, keys, 1, ranges=ranges[: len(q)], backend=b)),
            ]
    return calls


def _gpu_path_inputs(device, dim=17):
    """Small enough for the interpreter, large enough for every launch path at GPU block sizes
    (one query and a block of 17, keys split into slices and merged)."""
    gen = torch.Generator().manual_seed(8)
    tree = build_tree(40, 4, dim, seed=8, leftover=3)
    tree.set_utility(torch.arange(tree.num_nodes), torch.rand(tree.num_nodes, generator=gen) + 0.5)
    keys = torch.randn(70, dim, generator=gen)
    queries = torch.randn(18, dim, generator=gen)[1:]  # 17 queries, sliced
    return on_device(tree, device), keys.to(device), queries.to(device)


def test_gpu_launch_configuration_matches_reference():
    """The Triton kernels with the block sizes a GPU launches (the rest of the suite runs the
    interpreter's wider tiles): one query and a block of 17, split keys and one slice."""
    if "triton" not in TREE_BACKENDS:
        pytest.skip("Triton is not available")
    tree, keys, queries = _gpu_path_inputs("cpu")
    calls = [c for c in _gpu_path_calls(tree, keys, queries, "cpu") if c[1] == "triton"]
    refs = [c for c in _gpu_path_calls(tree, keys, queries, "cpu") if c[1] == "torch"]
    for (name, _, fn), (_, _, ref) in zip(calls, refs):
        with recording_gpu_launches():
            got = fn()
        assert_matches_reference(got, ref(), "triton", name)


@pytest.mark.host_sync
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_gpu_code_paths_never_synchronise(monkeypatch, backend):
    """Each search runs its backend inside a mode that raises on any tensor -> host read
    (item, tolist, bool(tensor), nonzero, boolean masks...): the code a GPU runs has none."""
    if backend not in TREE_BACKENDS:
        pytest.skip(f"{backend} is not available")
    if backend == "torch":  # on a GPU the torch top-k is the reference as it is (narrowing to the ranges
        monkeypatch.setitem(COSINE_TOPK.impls, "torch", cosine_topk_reference)  # reads them: CPU tensors only)
    for op in (TREE_SEARCH, COSINE_TOPK):
        guard_backend(monkeypatch, op, backend)
    tree, keys, queries = _gpu_path_inputs("cpu")
    with recording_gpu_launches():  # the GPU's work split (several key slices) too
        for name, b, fn in _gpu_path_calls(tree, keys, queries, "cpu"):
            if b == backend:
                fn()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("backend", ["torch", "triton", "cuda"])
def test_searches_capture_in_cuda_graph(backend):
    if backend not in device_backends(TREE_SEARCH, "cuda"):
        pytest.skip(f"{backend} cannot run on this GPU")
    tree, keys, queries = _gpu_path_inputs("cuda")
    for name, b, fn in _gpu_path_calls(tree, keys, queries, "cuda"):
        if b != backend:
            continue
        eager, replayed = capture_in_cuda_graph(fn)
        for x, y in zip(eager, replayed):
            assert torch.equal(x, y), name


# --------------------------------------------------------------------------
# Single-item fast paths (float32 contiguous CPU inputs on the C++ backend: one native call
# that validates and normalises itself): same results and same errors as the general path
# --------------------------------------------------------------------------
def _require_fast_path(monkeypatch):
    """Make the general path of both public functions fail (it is the one that selects a backend), so
    a passing call proves that the latency path ran."""
    if "cpp" not in TREE_BACKENDS:
        pytest.skip("the C++ backend is not built")

    def general(*args, **kwargs):
        raise AssertionError("the general path ran")

    monkeypatch.setattr(TREE_SEARCH, "select", general)
    monkeypatch.setattr(COSINE_TOPK, "select", general)


def test_fast_paths_match_the_reference(monkeypatch):
    tree = build_tree(150, 4, 16, seed=3, leftover=5)
    g = torch.Generator().manual_seed(11)
    keys = torch.randn(97, 16, generator=g) * 4
    keys[5] = 0.0
    keys[40] = keys[7] * 4  # parallel keys (exactly: a power of two) tie: the lower index first
    queries = [torch.randn(1, 16, generator=g), torch.randn(7, 16, generator=g) * 1e3, torch.zeros(1, 16)]
    expect = []
    for q in queries:
        expect.append((tree_search(tree, q, backend="torch"),
                       tree_search(tree, q, from_every_root=True, backend="torch"),
                       tree_search(tree, q, beam=(3, 5), k=4, backend="torch"),
                       tree_search(tree, q, beam=2, k=3, use_utility=True, min_score=0.1, backend="torch"),
                       cosine_topk(q, keys, 5, backend="torch"), cosine_topk(q, keys, 200, backend="torch")))
    _require_fast_path(monkeypatch)
    for q, (greedy, every, beam, util, top, top_all) in zip(queries, expect):
        q0 = q.clone()
        assert_same_path(tree_search(tree, q), greedy)
        assert_same_path(tree_search(tree, q, from_every_root=True, backend="cpp"), every)
        for got, want in ((tree_search(tree, q, beam=(3, 5), k=4), beam),
                          (tree_search(tree, q, beam=2, k=3, use_utility=True, min_score=0.1), util),
                          (cosine_topk(q, keys, 5, backend="cpp"), top), (cosine_topk(q, keys, 200), top_all)):
            assert torch.equal(got.ids, want.ids)
            torch.testing.assert_close(got.scores, want.scores, atol=SCORE_ATOL, rtol=0)
        assert torch.equal(q, q0)


def test_fast_paths_raise_the_documented_errors(monkeypatch):
    tree = build_tree(40, 4, 6, seed=1)
    keys = torch.randn(20, 6)
    _require_fast_path(monkeypatch)
    for bad in (float("nan"), float("inf"), float("-inf")):
        q = torch.randn(1, 6)
        q[0, 2] = bad
        for call in (lambda: tree_search(tree, q), lambda: tree_search(tree, q, beam=3, k=2),
                     lambda: tree_search(tree, q, from_every_root=True), lambda: cosine_topk(q, keys, 3)):
            with pytest.raises(ValueError, match="queries must be finite"):
                call()
        k = keys.clone()
        k[13, 4] = bad
        with pytest.raises(ValueError, match="keys must be finite"):
            cosine_topk(torch.randn(2, 6), k, 3)
    # huge finite values overflow a squared norm without being NaN/Inf: accepted, scored like the reference
    big = torch.full((1, 6), 3e38)
    keys[3] = 3e38
    cosine_topk(big, keys, 3)
    tree_search(tree, big)


def test_topk_cpp_paths_validate_values_alike():
    """Fused scan (few queries, or narrow ranges) and BLAS path (Q >= 8) raise the same errors and
    never score a key that overflows as NaN."""
    if "cpp" not in TOPK_BACKENDS:
        pytest.skip("the C++ backend is not built")
    keys = torch.randn(50, 8)
    for num_q in (1, 3, 8, 12):
        q = torch.randn(num_q, 8)
        whole = torch.tensor([[0, 50]] * num_q)
        narrow = torch.tensor([[0, 2]] * num_q)
        for ranges in (None, whole, narrow):
            bad = keys.clone()
            bad[49, 0] = float("nan")  # outside the narrow ranges: still an error (the contract covers all keys)
            with pytest.raises(ValueError, match="keys must be finite"):
                cosine_topk(q, bad, 2, ranges=ranges, backend="cpp")
            bad_q = q.clone()
            bad_q[-1, -1] = float("inf")
            with pytest.raises(ValueError, match="queries must be finite"):
                cosine_topk(bad_q, keys, 2, ranges=ranges, backend="cpp")
        with pytest.raises(ValueError, match="ranges"):
            cosine_topk(q, keys, 2, ranges=torch.tensor([[0, 51]] * num_q), backend="cpp")
        with pytest.raises(ValueError, match="ranges"):
            cosine_topk(q, keys, 2, ranges=torch.tensor([[-1, 5]] * num_q), backend="cpp")
        huge = keys.clone()
        huge[4] = 3e38  # |key|^2 overflows: the reference scales it to the zero vector (score 0)
        got = cosine_topk(q, huge, 50, backend="cpp")
        want = cosine_topk(q, huge, 50, backend="torch")
        assert not bool(torch.isnan(got.scores).any())
        assert torch.equal(got.ids, want.ids)


def test_topk_fast_path_declines_what_it_does_not_read_in_place():
    """The latency path of cosine_topk (COSINE_TOPK.fast) takes only plain float32 contiguous CPU
    tensors, Q < 8, an int k and no ranges or int64 contiguous (Q, 2) CPU ranges: every other input goes
    through the general path, same answer."""
    if "cpp" not in TOPK_BACKENDS:
        pytest.skip("the C++ backend is not built")
    mod, fast = COSINE_TOPK.cpp_module("cpp"), COSINE_TOPK.fast
    g = torch.Generator().manual_seed(21)
    keys, q = torch.randn(33, 12, generator=g), torch.randn(2, 12, generator=g)
    assert fast(mod, q, keys, 4, None) is not None
    declined = {
        "float64": (q.double(), keys, 4), "non-contiguous keys": (q, keys.T.contiguous().T, 4),
        "Parameter": (q, torch.nn.Parameter(keys), 4), "requires_grad": (q.clone().requires_grad_(), keys, 4),
        "Q = 8": (q.repeat(4, 1), keys, 4), "bool k": (q, keys, True), "k = 0": (q, keys, 0),
        "k too large": (q, keys, 2**25 + 1), "k beyond int64": (q, keys, 2**64), "1-D queries": (q[0], keys, 4),
        "D mismatch": (q[:, :5], keys, 4), "numpy": (q.numpy(), keys, 4), "no keys": (q, keys[:0], 4),
    }
    for name, (qq, kk, k) in declined.items():
        assert fast(mod, qq, kk, k, None) is None, name
    assert fast(mod, q, keys, 4, torch.tensor([[0, 33], [0, 33]])) is not None, "int64 ranges"
    for name, ranges in (("int32 ranges", torch.tensor([[0, 33], [0, 33]], dtype=torch.int32)),
                         ("non-contiguous ranges", torch.tensor([[0, 0], [33, 33]]).T),
                         ("ranges of another Q", torch.tensor([[0, 33]])), ("list ranges", [[0, 33], [0, 33]])):
        assert fast(mod, q, keys, 4, ranges) is None, name
    for name in ("float64", "non-contiguous keys", "Parameter", "requires_grad", "Q = 8", "numpy"):
        qq, kk, k = declined[name]
        got = cosine_topk(qq, kk, k)
        want = cosine_topk(torch.as_tensor(qq).detach().float(), kk.detach().contiguous(), k, backend="torch")
        assert torch.equal(got.ids, want.ids), name
        torch.testing.assert_close(got.scores, want.scores, atol=SCORE_ATOL, rtol=0)
    for name, match in (("bool k", "k must be an int"), ("k = 0", "k must be >= 1"), ("D mismatch", "D=12"),
                        ("no keys", "at least one key")):
        qq, kk, k = declined[name]
        with pytest.raises(ValueError, match=match):
            cosine_topk(qq, kk, k)


def _tree_fast_path(tree):
    """The C++ module and tree_search's latency path on ``tree`` (``fast(queries, beam, k, min_score,
    use_utility, from_every_root)``), or skip."""
    if "cpp" not in TREE_BACKENDS:
        pytest.skip("the C++ backend is not built")
    mod = TREE_SEARCH.cpp_module("cpp")
    return mod, lambda queries, *args: TREE_SEARCH.fast(mod, tree, queries, *args)


def test_tree_fast_path_equals_the_general_path_bit_for_bit(monkeypatch):
    """tree_search's latency path takes every argument form the general path accepts unchanged and
    returns the general C++ path's tensors bit for bit, as fresh memory."""
    tree = build_tree(300, 5, 24, seed=7, leftover=4)
    tree.set_utility(torch.arange(0, tree.num_nodes, 3), torch.full((len(range(0, tree.num_nodes, 3)),), 0.5))
    mod, fast = _tree_fast_path(tree)
    g = torch.Generator().manual_seed(8)
    queries = torch.randn(5, 24, generator=g)
    queries[3] = 0.0
    cases = [dict(), dict(from_every_root=True), dict(beam=3, k=4), dict(beam=(2, 6), k=9), dict(beam=(1,), k=1),
             dict(beam=(4, 1, 7), k=3, min_score=0.05), dict(beam=5, k=2, min_score=0, use_utility=True),
             dict(beam=2, k=6, min_score=-1, use_utility=False, from_every_root=False), dict(beam=(300,), k=300)]
    for q in (queries[:1], queries[3:4], queries):
        for kw in cases:
            args = (kw.get("beam", 1), kw.get("k", 1), kw.get("min_score"), kw.get("use_utility", False),
                    kw.get("from_every_root", False))
            fast_out = fast(q, *args)
            assert fast_out is not None, kw
            public = tree_search(tree, q, **kw)
            with monkeypatch.context() as m:
                m.setattr(TREE_SEARCH, "fast", None)  # the general path, C++ backend
                general = tree_search(tree, q, **kw, backend="cpp")
            assert type(public) is type(general) is type(fast_out), kw
            for a, b, c in zip(fast_out, public, general):
                assert a.dtype == c.dtype and a.shape == c.shape and a.is_contiguous(), kw
                assert torch.equal(a, c) and torch.equal(b, c), kw
            assert fast_out[0].data_ptr() != public[0].data_ptr(), "each call returns new memory"
    want = tree_search(tree, queries, beam=(2, 6), k=9, backend="torch")
    got = tree_search(tree, queries, beam=(2, 6), k=9)
    assert torch.equal(got.ids, want.ids)
    torch.testing.assert_close(got.scores, want.scores, atol=SCORE_ATOL, rtol=0)


def test_tree_fast_path_declines_what_the_general_path_must_explain():
    """The latency path returns None for every input it does not take as is (the general path then
    converts it or raises the ValueError naming the argument); the public answer is unchanged."""
    tree = build_tree(60, 4, 12, seed=4)
    mod, fast = _tree_fast_path(tree)
    g = torch.Generator().manual_seed(9)
    q = torch.randn(2, 12, generator=g)
    base = dict(beam=3, k=2, min_score=None, use_utility=False, from_every_root=False)
    greedy = dict(base, beam=1, k=1)
    assert fast(q, *base.values()) is not None
    assert fast(q, *greedy.values()) is not None
    converted = {  # the general path takes these (converting them): same answer as the reference
        "float64": (q.double(), base),
        "non-contiguous": (q.T.contiguous().T, base),
        "Parameter": (torch.nn.Parameter(q), base),
        "requires_grad": (q.clone().requires_grad_(), base),
        "numpy": (q.numpy(), base),
        "numpy k": (q, dict(base, k=np.int64(2))),
        "list beam": (q, dict(base, beam=[3])),
        "numpy beam": (q, dict(base, beam=np.int64(3))),
        "numpy min_score": (q, dict(base, min_score=np.float32(0.1))),
        "numpy greedy beam": (q, dict(greedy, beam=np.int64(1))),
    }
    for name, (qq, kw) in converted.items():
        assert fast(qq, *kw.values()) is None, name
        got = tree_search(tree, qq, **kw)
        want = tree_search(tree, torch.as_tensor(qq).detach().float(), **dict(kw, backend="torch"))
        for a, b in zip(got, want):
            if a.dtype == torch.int64:
                assert torch.equal(a, b), name
            else:
                torch.testing.assert_close(a, b, atol=SCORE_ATOL, rtol=0)
    rejected = {  # the general path raises, naming the argument
        "1-D query": (q[0], base, "queries must have shape"),
        "D mismatch": (q[:, :5], base, "D=12|dim"),
        "no queries": (q[:0], base, "queries"),
        "bool k": (q, dict(base, k=True), "k must be an int"),
        "bool k greedy": (q, dict(greedy, k=True), "k must be an int"),
        "float k greedy": (q, dict(greedy, k=1.0), "k must be an int"),
        "k = 0": (q, dict(base, k=0), "k must be >= 1"),
        "k beyond int64": (q, dict(base, k=2**64), "k must keep"),
        "Q x k beyond int64": (q, dict(base, k=2**62 + 1), "k must keep"),
        "Q x k too large": (q, dict(base, k=2**27 + 1), "k must keep"),
        "bool beam": (q, dict(base, beam=True), "beam"),
        "beam 0": (q, dict(base, beam=0), "beam"),
        "empty beam": (q, dict(base, beam=()), "beam"),
        "beam[1] = 0": (q, dict(base, beam=(2, 0)), r"beam\[1\]"),
        "beam too wide": (q, dict(base, beam=2**31), "beam"),
        "float beam": (q, dict(base, beam=2.0), "beam"),
        "tensor beam": (q, dict(base, beam=torch.tensor([3, 4])), "beam"),
        "NaN min_score": (q, dict(base, min_score=float("nan")), "min_score"),
        "inf min_score": (q, dict(base, min_score=float("inf")), "min_score"),
        "huge int min_score": (q, dict(base, min_score=10**400), "min_score"),
        "bool min_score": (q, dict(base, min_score=True), "min_score"),
        "str min_score": (q, dict(base, min_score="0"), "min_score"),
        "int use_utility": (q, dict(base, use_utility=1), "use_utility"),
        "int from_every_root": (q, dict(greedy, from_every_root=0), "from_every_root"),
        "greedy k": (q, dict(greedy, k=2), "beam=1 is greedy"),
        "greedy min_score": (q, dict(greedy, min_score=0.0), "beam=1"),
        "greedy use_utility": (q, dict(greedy, use_utility=True), "beam=1"),
        "beam from_every_root": (q, dict(base, from_every_root=True), "from_every_root applies"),
    }
    for name, (qq, kw, match) in rejected.items():
        assert fast(qq, *kw.values()) is None, name
        with pytest.raises(ValueError, match=match):
            tree_search(tree, qq, **kw)
    assert tree.search_arrays().native
    with pytest.raises(ValueError, match="tree must not be empty"):
        t = CosineTree(12)
        t.add_leaves(q)
        t.remove(torch.tensor([0, 1]))
        tree_search(t, q)
    for backend in ("torch", "cpp"):  # an explicit backend or an override goes through select()
        assert_same_path(tree_search(tree, q, backend=backend), tree_search(tree, q, backend="torch"))


def test_tree_fast_path_keeps_its_snapshot():
    """The C++ views of a snapshot (made once, kept on it) keep its tensors alive: a search through
    them returns the tree as it was, whatever mutations (appends that reallocate, removal,
    compaction) came after; the next search sees the new tree through new views."""
    tree = build_tree(40, 4, 8, seed=5)
    mod, fast = _tree_fast_path(tree)
    q = torch.randn(3, 8, generator=torch.Generator().manual_seed(6))
    before = [t.clone() for t in fast(q, (2, 4), 5, None, False, False)]
    before_greedy = [t.clone() for t in fast(q, 1, 1, None, False, False)]
    snap = tree.search_arrays()
    views, height = snap.native, snap.height
    assert views and height >= 2
    widths = view(torch.tensor([2] + [4] * (height - 1)))
    del snap  # the views alone keep the snapshot's tensors alive
    tree.add_leaves(torch.randn(500, 8))  # reallocates every table
    tree.grow(4)
    tree.remove(tree.roots[:2], cascade=True)
    tree.compact()
    tree.set_utility(torch.arange(5), torch.zeros(5))  # a new snapshot's values only
    ids, scores = torch.empty((3, 5), dtype=torch.int64), torch.empty((3, 5))
    assert mod.beam(*views[1], view(q), widths, float("-inf"), False, view(ids), view(scores), None, 0.0, 0.0) == 0
    assert torch.equal(ids, before[0]) and torch.equal(scores, before[1])
    greedy = (torch.empty((3, height + 1), dtype=torch.int64), torch.empty((3, height + 1)),
              torch.empty(3, dtype=torch.int64), torch.empty(3))
    assert mod.greedy(*views[0], view(q), False, *map(view, greedy)) == 0
    for got, want in zip(greedy, before_greedy):
        assert torch.equal(got, want)
    got = tree_search(tree, q, beam=(2, 4), k=5)
    want = tree_search(tree, q, beam=(2, 4), k=5, backend="torch")
    assert tree.search_arrays().native not in (None, views)
    assert torch.equal(got.ids, want.ids)
    assert_same_path(tree_search(tree, q), tree_search(tree, q, backend="torch"))


def test_fast_path_beam_widths_follow_the_tree_height():
    """The latency path derives a beam's widths once per (beam, height): the same beam on a tree that
    grew a level, and beams that hash alike (5 and 5.0, True and 1), give the reference's answers."""
    tree = build_tree(60, 4, 10, seed=12)
    q = torch.randn(2, 10, generator=torch.Generator().manual_seed(13))
    for _ in range(2):
        for beam in ((2, 3), 3, (1, 4, 2)):
            got = tree_search(tree, q, beam=beam, k=4)
            want = tree_search(tree, q, beam=beam, k=4, backend="torch")
            assert torch.equal(got.ids, want.ids), (beam, tree.height)
        tree.add_leaves(torch.randn(200, 10, generator=torch.Generator().manual_seed(14)))
        tree.grow(4)  # one more level: the cached widths of the old height must not be reused
    with pytest.raises(ValueError, match="beam"):
        tree_search(tree, q, beam=(2, 3.0), k=4)
    with pytest.raises(ValueError, match="beam"):
        tree_search(tree, q, beam=(True, 3), k=4)


def test_greedy_k_must_be_the_int_one_on_every_path():
    """Regression: the Python fast path compared ``k != 1``, so ``k=True`` or ``k=1.0`` ran a greedy
    search that the general path (and every explicit backend) rejects."""
    tree = build_tree(30, 4, 6, seed=2)
    q = torch.randn(1, 6)
    for k in (True, 1.0, np.float64(1.0)):
        for backend in ("auto", "torch"):
            with pytest.raises(ValueError, match="k must be an int"):
                tree_search(tree, q, k=k, backend=backend)


def test_min_score_int_beyond_float_range_is_a_value_error():
    """Regression: ``min_score=10**400`` raised OverflowError from float() instead of the ValueError
    naming the argument."""
    tree = build_tree(30, 4, 6, seed=2)
    for backend in ("auto", "torch"):
        with pytest.raises(ValueError, match="min_score must be finite"):
            tree_search(tree, torch.randn(1, 6), beam=2, k=2, min_score=-(10**400), backend=backend)


def test_unavailable_backend_error_names_the_op_and_inputs():
    """An explicit backend that cannot run says which op, and the shapes/dtypes/devices it was given."""
    tree = build_tree(30, 4, 6, seed=2)
    keys = torch.randn(20, 6)
    with pytest.raises(RuntimeError, match=r"cosine_topk: backend='cuda' cannot run on this input "
                                           r"\(queries \(2, 6\) float32 cpu, keys \(20, 6\) float32 cpu"):
        cosine_topk(torch.randn(2, 6), keys, 3, backend="cuda")
    with pytest.raises(RuntimeError, match=r"tree_search: backend='cuda' cannot run on this input "
                                           r"\(queries \(1, 6\) float32 cpu, tree.embeddings \(\d+, 6\) float32 cpu"):
        tree_search(tree, torch.randn(1, 6), backend="cuda")
