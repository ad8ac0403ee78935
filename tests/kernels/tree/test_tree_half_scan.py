"""CosineTree(half_scan=True): the float16 scan copy the C++ beam search scores first.

The contract is identity: with the copy, every beam search returns the same ids and the same
float32 scores (bit for bit, tie order included) as the tree without it.  The copy is checked
against an independent conversion (numpy's float16 with the store's flush rule) after every
writer, and one test corrupts it to show that the searches really read it.
"""
import copy

import numpy as np
import pytest
import torch

import streammem_kernels.runtime.dispatch as dispatch
from streammem_kernels import CosineTree, tree_search
from streammem_kernels.runtime.native import view

_tree_module = dispatch.load_native("cpu", "tree")[0]
pytestmark = pytest.mark.skipif(_tree_module is None,
                                reason="the scan copy serves the C++ beam search")
# Without F16C/AVX2/FMA the copy is kept but not read (the identity tests still hold there).
reads_copy = pytest.mark.skipif(_tree_module is None or not _tree_module.half_scan_kernel(),
                                reason="this CPU has no F16C/AVX2/FMA: the beam search does not read the copy")

HALF_TINY = 2.0**-14  # float16's smallest normal: the copy stores anything smaller as 0


def reference_copy(emb: torch.Tensor) -> np.ndarray:
    """The copy as numpy's float16 conversion (round to nearest even) writes it, tiny entries 0."""
    x = emb.numpy()
    with np.errstate(over="ignore"):  # beyond 65504: inf, as the copy stores it
        out = x.astype(np.float16).astype(np.float32)
    out[np.abs(x) < HALF_TINY] = 0.0
    return out


def check_copy(tree: CosineTree) -> None:
    snap = tree.search_arrays()
    emb = snap.tensors[0]
    scan = snap.scan_tensor
    assert scan is not None and scan.dtype == torch.float16 and scan.shape == emb.shape
    np.testing.assert_array_equal(scan.float().numpy(), reference_copy(emb))
    e64 = emb.double()
    assert snap.scan_norm >= float(e64.norm(dim=1).max())
    assert snap.scan_err >= float((e64 - scan.double()).norm(dim=1).max())


def twin_trees(emb: torch.Tensor, group: int, **kwargs):
    """The same tree without and with the copy."""
    out = []
    for half in (False, True):
        tree = CosineTree(emb.shape[1], capacity=3, half_scan=half)
        tree.add_leaves(emb)
        tree.grow(group, **kwargs)
        out.append(tree)
    return out


def same_search(plain: CosineTree, half: CosineTree, queries: torch.Tensor, **kwargs) -> None:
    for i in range(queries.shape[0]):
        q = queries[i : i + 1].contiguous()
        a, b = tree_search(plain, q, **kwargs), tree_search(half, q, **kwargs)
        assert torch.equal(a.ids, b.ids), (i, kwargs, a.ids, b.ids)
        assert torch.equal(a.scores.view(torch.int32), b.scores.view(torch.int32)), (i, kwargs, a.scores, b.scores)


def leaf_embeddings(n: int, dim: int, seed: int) -> torch.Tensor:
    """Clustered rows with exact duplicates (ties), zero rows and entries in float16's subnormal range."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(max(1, n // 9 + 1), dim, generator=g)
    emb = centres.repeat_interleave(9, 0)[:n] + 0.4 * torch.randn(n, dim, generator=g)
    if n >= 8:
        emb[n // 2 : n // 2 + 3] = emb[1]  # identical leaves: exact ties, broken by id
        emb[n // 3] = 0.0  # a zero row scores 0
        emb[n // 4, : max(1, dim // 2)] *= 1e-7  # tiny entries, flushed to 0 in the copy
    return emb


def queries_for(emb: torch.Tensor, count: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    pick = torch.randint(0, emb.shape[0], (count,), generator=g)
    q = emb[pick] + 0.2 * torch.randn(count, emb.shape[1], generator=g)
    q[0] = emb[min(1, emb.shape[0] - 1)]  # parallel to the duplicated leaves
    q[1] = 0.0  # a zero query scores 0 everywhere
    return q


SEARCHES = [
    dict(beam=(1,), k=1),
    dict(beam=(5, 10), k=10),
    dict(beam=3, k=7),
    dict(beam=(2, 1, 40), k=1000),  # k larger than the leaves reached
    dict(beam=(5, 10), k=10, min_score=0.2),
    dict(beam=(4, 8), k=5, use_utility=True),
    dict(beam=(4, 8), k=50, min_score=-0.1, use_utility=True),
]


@pytest.mark.parametrize("n, group, dim", [(1, 2, 1), (37, 3, 1), (300, 4, 7), (1200, 10, 33), (700, 6, 384)])
def test_identical_to_float32_beam(n, group, dim):
    emb = leaf_embeddings(n, dim, seed=n + dim)
    plain, half = twin_trees(emb, group)
    # Utilities of every sign, zero included (the key is cos x utility).
    g = torch.Generator().manual_seed(dim)
    util = torch.randn(plain.num_nodes, generator=g) * 3
    util[::5] = 0.0
    util[1::7] = -util[1::7].abs()
    for tree in (plain, half):
        tree.set_utility(torch.arange(tree.num_nodes), util)
    check_copy(half)
    queries = queries_for(emb, 12, seed=n)
    for kwargs in SEARCHES:
        same_search(plain, half, queries, **kwargs)
        # A batch (12 >= 8 queries: the OpenMP path, one query per thread at a time).
        a, b = tree_search(plain, queries, **kwargs), tree_search(half, queries, **kwargs)
        assert torch.equal(a.ids, b.ids) and torch.equal(a.scores.view(torch.int32), b.scores.view(torch.int32))


def test_min_score_exactly_at_scores():
    emb = leaf_embeddings(900, 48, seed=3)
    plain, half = twin_trees(emb, 5)
    queries = queries_for(emb, 10, seed=4)
    for i in range(queries.shape[0]):
        q = queries[i : i + 1]
        scores = tree_search(plain, q, beam=(3, 6), k=20).scores[0]
        for at in scores[torch.isfinite(scores)][::4].tolist():  # each is a leaf's cosine, exactly
            same_search(plain, half, q, beam=(3, 6), k=20, min_score=at)
            kept = tree_search(half, q, beam=(3, 6), k=20, min_score=at).scores[0]
            assert (kept == at).any()  # the leaf exactly at the threshold passes


def test_ties_of_identical_leaves_keep_the_lower_ids():
    g = torch.Generator().manual_seed(5)
    base = torch.randn(40, 16, generator=g)
    emb = torch.cat([base, base, base])  # every leaf three times
    plain, half = twin_trees(emb, 4)
    queries = base[:6] + 0.05 * torch.randn(6, 16, generator=g)
    same_search(plain, half, queries, beam=(2, 5), k=9)
    ids = tree_search(half, queries[:1], beam=(40,), k=120).ids[0]
    scores = tree_search(half, queries[:1], beam=(40,), k=120).scores[0]
    for s in scores.unique():
        tied = ids[scores == s]
        assert torch.equal(tied, tied.sort().values)


def test_writers_maintain_the_copy():
    g = torch.Generator().manual_seed(6)
    dim = 24
    plain, half = CosineTree(dim, capacity=2), CosineTree(dim, capacity=2, half_scan=True)
    batches = [torch.randn(n, dim, generator=g) for n in (1, 5, 40, 200)]  # capacity doubles several times
    for rows in batches:
        for tree in (plain, half):
            tree.add_leaves(rows)
            tree.grow(3)
        check_copy(half)
    mean = lambda ids: torch.ones(dim)  # noqa: E731 - parent_embed that ignores the children
    for tree in (plain, half):
        tree.add_leaves(torch.randn(3, dim, generator=torch.Generator().manual_seed(1)))
        tree.grow(3, parent_embed=mean)
    check_copy(half)
    queries = torch.randn(8, dim, generator=g)
    same_search(plain, half, queries, beam=(3, 6), k=10)
    # In-place update: rows far from the old ones, one with a huge entry ratio.
    new = torch.randn(5, dim, generator=g)
    new[0] = 0.0
    new[1, 0] = 1e6
    for tree in (plain, half):
        tree.set_embeddings([0, 7, 30, 31, 100], new)
    check_copy(half)
    same_search(plain, half, queries, beam=(3, 6), k=10)
    # Removal, then compact (rows move).
    for tree in (plain, half):
        tree.remove([2, 3, 50, 51, 52], cascade=True)
    same_search(plain, half, queries, beam=(3, 6), k=10)
    for tree in (plain, half):
        tree.compact()
    check_copy(half)
    same_search(plain, half, queries, beam=(3, 6), k=10, use_utility=True)
    # Copies and pickles keep the copy.
    twin = copy.deepcopy(half)
    assert twin.half_scan
    check_copy(twin)
    same_search(plain, twin, queries, beam=(2,), k=4)


def test_set_embeddings_refreshes_the_bounds():
    """One-hot rows convert exactly (error bound 0); a row written later with a rounding error must
    reach the bound that searches use, even through a snapshot cached before the write."""
    dim = 12
    rows = torch.eye(dim).repeat(4, 1)
    plain, half = twin_trees(rows, 3, parent_embed=lambda ids: torch.eye(dim)[int(ids[0]) % dim])
    assert half.search_arrays().scan_err == 0.0
    new = torch.full((2, dim), 1.0)
    new[:, 0] = 1 / 3
    for tree in (plain, half):
        tree.set_embeddings([5, 17], new)
    check_copy(half)
    assert half.search_arrays().scan_err > 0.0
    queries = torch.cat([new + 0.01, torch.eye(dim)[:3]])
    same_search(plain, half, queries, beam=(1,), k=3)
    same_search(plain, half, queries, beam=(2, 2), k=5)


def test_save_load(tmp_path):
    emb = leaf_embeddings(500, 20, seed=7)
    plain, half = twin_trees(emb, 5)
    plain.remove([3, 4], cascade=True)
    half.remove([3, 4], cascade=True)
    path = tmp_path / "tree.pt"
    half.save(path)
    loaded = CosineTree.load(path, half_scan=True)
    assert loaded.half_scan and not CosineTree.load(path).half_scan
    check_copy(loaded)
    queries = queries_for(emb, 8, seed=8)
    same_search(plain, loaded, queries, beam=(3, 7), k=12)
    with pytest.raises(ValueError, match="half_scan"):
        CosineTree.load(path, half_scan=1)


def test_flush_denormal_mode_keeps_results():
    """The copy holds no float16 subnormals, so a flush-to-zero mode changes nothing."""
    emb = leaf_embeddings(400, 40, seed=9)
    emb[::3, ::2] *= 1e-6  # many entries in float16's subnormal range
    plain, half = twin_trees(emb, 4)
    queries = queries_for(emb, 8, seed=10)
    before = [tree_search(half, queries[i : i + 1], beam=(3, 6), k=10) for i in range(8)]
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        same_search(plain, half, queries, beam=(3, 6), k=10)
        for i, b in enumerate(before):
            assert torch.equal(tree_search(half, queries[i : i + 1], beam=(3, 6), k=10).ids, b.ids)
    finally:
        torch.set_flush_denormal(False)


@reads_copy
def test_searches_read_the_copy():
    """Negating the copy behind the tree's back changes the beam's choices: the copy is read (so
    the identity tests above compare two different paths), and restoring it restores them."""
    emb = leaf_embeddings(2000, 32, seed=11)
    plain, half = twin_trees(emb, 10)
    queries = queries_for(emb, 6, seed=12)
    scan = half.search_arrays().scan_tensor
    scan.neg_()
    try:
        changed = sum(not torch.equal(tree_search(plain, queries[i : i + 1], beam=(2, 3), k=5).ids,
                                      tree_search(half, queries[i : i + 1], beam=(2, 3), k=5).ids) for i in range(6))
    finally:
        scan.neg_()
    assert changed > 0
    same_search(plain, half, queries, beam=(2, 3), k=5)


def test_half_copy_conversion():
    """half_copy against numpy's float16 on magnitudes across float16's range, ties to even included."""
    mod = dispatch.load_native("cpu", "tree")[0]
    g = torch.Generator().manual_seed(13)
    x = (torch.randn(64, 101, generator=g) * torch.exp2(torch.randint(-30, 16, (64, 101), generator=g).float()))
    x[0, :8] = torch.tensor([HALF_TINY, -HALF_TINY, HALF_TINY * 0.999, 65504.0, 65519.0, 1 + 2**-11, 1 + 3 * 2**-11,
                             2.0**-24])
    dst = torch.empty(x.shape, dtype=torch.float16)
    bounds = torch.empty(2, dtype=torch.float64)
    assert mod.half_copy(view(x), view(dst), view(bounds)) == 0
    norm, err = bounds.tolist()
    np.testing.assert_array_equal(dst.float().numpy(), reference_copy(x))
    assert dst[0, 5].item() == 1.0 and dst[0, 6].item() == 1 + 4 * 2**-11  # ties to even
    x64 = x.double()
    assert norm >= float(x64.norm(dim=1).max()) and err >= float((x64 - dst.double()).norm(dim=1).max())
    assert norm <= float(x64.norm(dim=1).max()) * (1 + 1e-8)


def test_memory_and_flags():
    plain, half = CosineTree(10, capacity=100), CosineTree(10, capacity=100, half_scan=True)
    assert not plain.half_scan and half.half_scan
    assert half.nbytes - plain.nbytes == 100 * 10 * 2  # the float16 copy of the whole capacity
    assert plain.search_arrays().scan_tensor is None and plain.search_arrays().scan == 0
    for bad in (1, "yes", None, np.bool_(True)):
        with pytest.raises(ValueError, match="half_scan must be a bool"):
            CosineTree(10, half_scan=bad)
    with pytest.raises(ValueError, match="half_scan=True needs a CPU tree"):
        CosineTree(10, device="meta", half_scan=True)


def test_missing_cpp_module_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(dispatch, "load_native", lambda kind, op: (None, "not built (test)"))
    with pytest.raises(ValueError, match=r"half_scan=True needs the C\+\+ module streammem_kernels._cpu_tree"):
        CosineTree(4, half_scan=True)
    assert not CosineTree(4).half_scan  # the default needs no module


@reads_copy
@pytest.mark.parametrize("dim", [1, 31, 32, 97, 384])
def test_half_dot_kernel(dim):
    """The copy-scoring kernel stays within the float32 summation bound of the exact dot product
    (the bound scan_delta assumes), subnormal float16 inputs included."""
    mod = dispatch.load_native("cpu", "tree")[0]
    g = torch.Generator().manual_seed(dim)
    q = torch.randn(dim, generator=g)
    rows = torch.randn(50, dim, generator=g).half()
    rows[0] = 0.0
    rows[1, : (dim + 1) // 2] = 2.0**-20  # float16 subnormals convert exactly too
    got = torch.empty(rows.shape[0])
    assert mod.half_dots(view(q), view(rows), view(got)) == 0
    exact = rows.double() @ q.double()
    bound = dim * 2.0**-24 / (1 - dim * 2.0**-24) * (rows.double().abs() @ q.double().abs())
    assert bool(((got.double() - exact).abs() <= bound).all())
    assert got[0] == 0.0
