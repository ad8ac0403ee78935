"""Property-based suite (Hypothesis) for the cosine top-k and the tree search.

Generated shapes (size 1 and odd sizes), dtypes, layouts (contiguous, transposed, sliced), magnitudes
(ordinary, tiny and huge: squares that underflow or overflow float32), NaN/Inf, ranges, duplicate keys,
trees of every shape ``grow`` makes, greedy and beam searches.  The properties: every backend returns the
reference's answer (ids exactly, scores within the op's declared tolerance; for the top-k, ids may differ
only between keys whose reference scores tie within that tolerance) or raises the ValueError the reference
raises; the answer does not depend on the magnitude of the inputs (power-of-two rescaling is exact).

Examples are derandomised (the same cases on every run) and few: Triton runs through the interpreter here.
"""
import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.support.device_checks import cpu_backends  # noqa: E402
from streammem_kernels import CosineTree, cosine_topk, tree_search
from streammem_kernels.tree.search import TREE_SEARCH
from streammem_kernels.tree.topk import COSINE_TOPK  # noqa: E402

PROPERTY = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TOPK_BACKENDS = cpu_backends(COSINE_TOPK)
TREE_BACKENDS = cpu_backends(TREE_SEARCH)
FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
# Ordinary, squares underflowing, squares overflowing float32, near float32's maximum / 64.
SCALES = st.sampled_from([1.0, 2.0 ** -100, 1e20, 2.0 ** 120])


@st.composite
def float_rows(draw, rows, dim, poison=True):
    """(rows, dim) in a drawn dtype, magnitude and layout; sometimes with a NaN or Inf."""
    dtype = draw(st.sampled_from(FLOATS))
    scale = draw(SCALES) if dtype in (torch.float32, torch.float64) else 1.0
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    layout = draw(st.sampled_from(["contiguous", "transposed", "sliced"]))
    x = torch.randn(rows, dim * (2 if layout == "sliced" else 1), generator=g) * scale
    if layout == "sliced":
        x = x[:, ::2]
    elif layout == "transposed":
        x = x.t().contiguous().t()
    if rows > 1 and draw(st.booleans()):  # duplicate rows: ties
        x = x.clone()
        x[rows // 2 :] = x[: rows - rows // 2].clone()
    x = x.to(dtype)
    if poison and draw(st.integers(0, 6)) == 0:
        x = x.clone()
        x[draw(st.integers(0, rows - 1)), draw(st.integers(0, dim - 1))] = draw(st.sampled_from([float("nan"),
                                                                                                 float("inf")]))
    return x


def _outcome(call):
    try:
        return "ok", call()
    except ValueError as exc:
        return "error", ValueError, str(exc)
    except Exception as exc:  # noqa: BLE001 -- any other class fails the property
        return "error", type(exc), str(exc)


def _same_outcome(ref, got, backend):
    assert ref[0] == got[0], f"{backend}: reference {ref[:2]}, backend {got[:2]}"
    if ref[0] == "error":
        assert ref[1] is ValueError and got[1] is ValueError, f"{backend}: {ref} vs {got}"
    return ref[0] == "ok"


# --------------------------------------------------------------------------
# cosine_topk
# --------------------------------------------------------------------------
@PROPERTY
@given(data=st.data(), Q=st.integers(1, 10), N=st.integers(1, 21), D=st.integers(1, 6), k=st.integers(1, 25),
       with_ranges=st.booleans())
def test_cosine_topk_backends_equal_the_reference(data, Q, N, D, k, with_ranges):
    queries = data.draw(float_rows(Q, D))
    keys = data.draw(float_rows(N, D))
    ranges = None
    if with_ranges:
        starts = data.draw(st.lists(st.integers(0, N), min_size=Q, max_size=Q))
        ranges = torch.tensor([[s, data.draw(st.integers(s, N))] for s in starts])
    ref = _outcome(lambda: cosine_topk(queries, keys, k, ranges=ranges, backend="torch"))
    full = None
    if ref[0] == "ok":
        full = cosine_topk(queries, keys, N, backend="torch")  # every key's reference score
        score_of = torch.full((Q, N), float("nan"))
        score_of.scatter_(1, full.ids, full.scores)
    for backend in TOPK_BACKENDS:
        got = _outcome(lambda: cosine_topk(queries, keys, k, ranges=ranges, backend=backend))
        if not _same_outcome(ref, got, backend):
            continue
        r, o = ref[1], got[1]
        atol, rtol = COSINE_TOPK.tolerance(backend, queries.dtype)
        assert torch.equal(o.ids == -1, r.ids == -1), backend
        torch.testing.assert_close(o.scores, r.scores, atol=atol, rtol=rtol)
        valid = o.ids >= 0
        for q in range(Q):
            ids = o.ids[q][valid[q]]
            assert ids.unique().numel() == ids.numel(), f"{backend}: repeated ids {o.ids[q]}"
            if ranges is not None:
                assert bool(((ids >= ranges[q, 0]) & (ids < ranges[q, 1])).all()), backend
        # Ids differ only where reference scores tie within the tolerance.
        diff = (o.ids != r.ids) & valid
        if bool(diff.any()):
            true = score_of.gather(1, o.ids.clamp_min(0))
            torch.testing.assert_close(true[diff], r.scores[diff], atol=2 * atol + 1e-7, rtol=0)


@PROPERTY
@given(data=st.data(), Q=st.integers(1, 9), N=st.integers(1, 15), D=st.integers(1, 5), k=st.integers(1, 6),
       q_exp=st.integers(-140, 120), k_exp=st.integers(-120, 100))
def test_cosine_topk_does_not_depend_on_the_magnitude_of_its_inputs(data, Q, N, D, k, q_exp, k_exp):
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    # Integer-valued rows: exact after any power-of-two rescaling, subnormal results included.
    queries = torch.randint(-4, 5, (Q, D), generator=g).float()
    keys = torch.randint(-4, 5, (N, D), generator=g).float()
    per_key = torch.tensor(data.draw(st.lists(st.integers(-20, 20), min_size=N, max_size=N)), dtype=torch.float32)
    scaled_keys = keys * 2.0 ** k_exp * (2.0 ** per_key)[:, None]
    ref = cosine_topk(queries, keys, k, backend="torch")
    for backend in TOPK_BACKENDS:
        out = cosine_topk(queries * 2.0 ** q_exp, scaled_keys, k, backend=backend)
        atol, _ = COSINE_TOPK.tolerance(backend, torch.float32)
        torch.testing.assert_close(out.scores, ref.scores, atol=atol, rtol=0)
        if backend == "torch":
            assert torch.equal(out.ids, ref.ids) and torch.equal(out.scores, ref.scores)


# --------------------------------------------------------------------------
# tree_search
# --------------------------------------------------------------------------
@st.composite
def trees(draw):
    dim = draw(st.integers(1, 5))
    leaves = draw(float_rows(draw(st.integers(1, 30)), dim, poison=False))
    tree = CosineTree(dim, capacity=draw(st.integers(1, 8)))
    tree.add_leaves(leaves)
    tree.grow(draw(st.integers(2, 4)))
    if draw(st.booleans()) and tree.num_nodes > 2:  # a removal (tombstones, pruned parents)
        victim = draw(st.integers(0, tree.num_nodes - 1))
        if tree.num_live > 1:
            tree.remove(victim, cascade=True)
        if tree.num_live == 0:
            tree.add_leaves(torch.ones(1, dim))
    if draw(st.booleans()):
        tree.set_utility(torch.arange(tree.num_nodes), torch.rand(tree.num_nodes) + 0.5)
    return tree


@PROPERTY
@given(data=st.data(), tree=trees(), Q=st.integers(1, 4),
       search=st.sampled_from([dict(), dict(from_every_root=True), dict(beam=2, k=3), dict(beam=(1,), k=1),
                               dict(beam=(2, 3), k=5, use_utility=True), dict(beam=3, k=2, min_score=0.1)]))
def test_tree_search_backends_equal_the_reference(data, tree, Q, search):
    queries = data.draw(float_rows(Q, tree.dim))
    ref = _outcome(lambda: tree_search(tree, queries, backend="torch", **search))
    for backend in TREE_BACKENDS:
        got = _outcome(lambda: tree_search(tree, queries, backend=backend, **search))
        if not _same_outcome(ref, got, backend):
            continue
        atol, rtol = TREE_SEARCH.tolerance(backend, queries.dtype)
        for r, o in zip(ref[1], got[1]):
            if r.dtype == torch.int64:
                assert torch.equal(r, o), f"{backend} {search}: {r} vs {o}"
            else:
                torch.testing.assert_close(o, r, atol=atol, rtol=rtol)
