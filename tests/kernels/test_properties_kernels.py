"""Property-based suite (Hypothesis) for the boundaries, k-means, log-probs and graph ops.

Generated shapes (size 1 and odd sizes), dtypes, layouts (contiguous, transposed, sliced, stride 0) and
extreme values (huge, tiny, NaN/Inf).  The property: every backend returns the reference's answer (decisions
exactly, values within the op's declared tolerance) or raises the same clear error class (ValueError) the
reference raises.  Inputs that could hang or kill the process are in tests/kernels/test_hostile_inputs_kernels.py,
in a subprocess with a timeout.

Examples are derandomised (the same cases on every run, so CI is deterministic) and few: the Triton
backend runs through the interpreter here.
"""
import numpy as np
import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import streammem_kernels as sk  # noqa: E402
from tests.support.device_checks import cpu_backends  # noqa: E402
from streammem_kernels import boundaries, graph, kmeans, logprobs  # noqa: E402

PROPERTY = settings(max_examples=15, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Magnitudes of generated values: ordinary, tiny (squares underflow float32), huge (squares overflow float32).
SCALES = st.sampled_from([1.0, 2.0 ** -100, 1e20, 2.0 ** 120])


def _outcome(call):
    """(kind, value): ("ok", result) or ("error", exception class)."""
    try:
        return "ok", call()
    except ValueError as exc:
        return "error", type(exc)
    except Exception as exc:  # noqa: BLE001 -- any other class is a failure of the property
        return "error", type(exc)


def _assert_same_outcome(ref, got, backend, compare):
    assert ref[0] == got[0], f"{backend}: reference {ref}, backend {got}"
    if ref[0] == "error":
        assert ref[1] is ValueError and got[1] is ValueError, f"{backend}: {ref[1]} vs {got[1]}"
    else:
        compare(ref[1], got[1])


@st.composite
def float_tensors(draw, shape, dtypes=(torch.float32, torch.float16, torch.bfloat16, torch.float64),
                  poison=True):
    """A tensor of ``shape`` in a drawn dtype, scale and layout; sometimes with a NaN or Inf."""
    dtype = draw(st.sampled_from(dtypes))
    seed = draw(st.integers(0, 2**16))
    scale = draw(SCALES) if dtype in (torch.float32, torch.float64) else 1.0
    g = torch.Generator().manual_seed(seed)
    layout = draw(st.sampled_from(["contiguous", "transposed", "sliced"]))
    base_shape = list(shape)
    if layout == "sliced":
        base_shape[-1] *= 2
    x = torch.randn(base_shape, generator=g) * scale
    if layout == "sliced":
        x = x[..., ::2]
    elif layout == "transposed" and len(shape) >= 2:
        x = x.transpose(-1, -2).contiguous().transpose(-1, -2)
    x = x.to(dtype)
    if poison and draw(st.integers(0, 5)) == 0:
        flat = x.reshape(-1).clone()
        flat[draw(st.integers(0, flat.numel() - 1))] = draw(st.sampled_from([float("nan"), float("inf")]))
        x = flat.reshape(x.shape)
    return x


# ---------------------------------------------------------------------------------------------------------
# Boundaries
# ---------------------------------------------------------------------------------------------------------
SEG_BACKENDS = cpu_backends(boundaries.ADJACENT_COSINE)


@PROPERTY
@given(data=st.data(), B=st.integers(1, 2), T=st.integers(1, 13), D=st.integers(1, 5))
def test_adjacent_cosine_backends_equal_the_reference(data, B, T, D):
    x = data.draw(float_tensors((B, T, D)))
    ref = _outcome(lambda: sk.adjacent_cosine(x, backend="torch"))
    for backend in SEG_BACKENDS[1:]:
        def compare(a, b, backend=backend):
            atol, rtol = boundaries.ADJACENT_COSINE.tolerance(backend, x.dtype)
            torch.testing.assert_close(b, a, atol=atol, rtol=rtol)
            assert b.abs().max() <= 1.0 if b.numel() else True
        _assert_same_outcome(ref, _outcome(lambda: sk.adjacent_cosine(x, backend=backend)), backend, compare)


@PROPERTY
@given(data=st.data(), B=st.integers(1, 2), T=st.integers(1, 14), D=st.integers(1, 4),
       window=st.integers(2, 5), tau=st.sampled_from([0.0, 0.7, 1e300]), min_depth=st.sampled_from([0.0, 0.2]),
       peak=st.sampled_from(["climb", "max"]), max_event=st.sampled_from([None, 1, 3, 2**70]),
       drift=st.sampled_from([None, None, -1.0, 0.3, 1.0]))
def test_event_segmentation_backends_make_the_reference_decisions(data, B, T, D, window, tau, min_depth, peak,
                                                                  max_event, drift):
    x = data.draw(float_tensors((B, T, D)))
    kwargs = dict(window=window, tau=tau, min_depth=min_depth, peak=peak, max_event=max_event, drift=drift)
    ref = _outcome(lambda: sk.event_ends(x, **kwargs, backend="torch"))
    if ref[0] == "ok":  # per stream the events cover every frame once, the last one closes
        assert ref[1][:, -1].all()
    for backend in SEG_BACKENDS[1:]:
        got = _outcome(lambda: sk.event_ends(x, **kwargs, backend=backend))
        _assert_same_outcome(ref, got, backend, lambda a, b: torch.testing.assert_close(b, a, atol=0, rtol=0))
    if ref[0] == "ok" and "cpp" in SEG_BACKENDS:  # the fused streaming step: the offline events, push by push
        seg = sk.StreamingSegmenter(**kwargs, backend="cpp")
        events = [e for t in range(T) for e in seg.push(x[:, t])] + seg.flush()
        assert sorted(events) == sk.detect_boundaries(x, **kwargs, backend="torch")


@PROPERTY
@given(data=st.data(), M=st.integers(1, 9), peak=st.sampled_from(["climb", "max"]))
def test_depth_scores_backends_equal_the_reference(data, M, peak):
    sim = data.draw(float_tensors((2, M), dtypes=(torch.float32, torch.float64))).clamp(-1, 1)
    ref = _outcome(lambda: sk.depth_scores(sim, peak=peak, backend="torch"))
    for backend in SEG_BACKENDS[1:]:
        got = _outcome(lambda: sk.depth_scores(sim, peak=peak, backend=backend))
        _assert_same_outcome(ref, got, backend, lambda a, b: torch.testing.assert_close(b, a, atol=0, rtol=0))


# ---------------------------------------------------------------------------------------------------------
# k-means
# ---------------------------------------------------------------------------------------------------------
KM_BACKENDS = cpu_backends(kmeans.LLOYD)


@PROPERTY
@given(data=st.data(), B=st.integers(1, 2), N=st.integers(1, 9), D=st.integers(1, 3), k=st.integers(1, 4),
       metric=st.sampled_from(["l2", "cosine"]), init=st.sampled_from(["first", "k-means++", "random"]),
       weighted=st.booleans(), scale_exponent=st.sampled_from([0, -100, 66, 120]))
def test_kmeans_backends_equal_the_reference_on_exact_grids(data, B, N, D, k, metric, init, weighted,
                                                            scale_exponent):
    """Points on an integer grid times a power of two (any magnitude, float32 near max included): distances are
    exact, so labels must match exactly and everything must be finite."""
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    x = torch.randint(-3, 4, (B, N, D), generator=g).float() * 2.0 ** scale_exponent
    if data.draw(st.booleans()):
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    weights = torch.randint(1, 4, (B, N), generator=g).float() if weighted else None
    call = lambda backend: sk.batched_kmeans(x, k, init=init, metric=metric, weights=weights, iters=3,  # noqa: E731
                                             backend=backend)
    ref = _outcome(lambda: call("torch"))
    if k > N:
        assert ref[0] == "error"
    if ref[0] == "ok":
        assert torch.isfinite(ref[1].centroids).all() and torch.isfinite(ref[1].inertia).all()
    for backend in KM_BACKENDS[1:]:
        def compare(a, b, backend=backend):
            atol, rtol = kmeans.LLOYD.tolerance(backend, torch.float32)
            assert torch.isfinite(b.centroids).all() and torch.isfinite(b.inertia).all()
            assert torch.equal(b.labels, a.labels) and torch.equal(b.n_iter, a.n_iter)
            scale = 2.0 ** scale_exponent if metric == "l2" else 1.0
            torch.testing.assert_close(b.centroids / scale, a.centroids / scale, atol=atol, rtol=rtol)
            torch.testing.assert_close(b.inertia / scale**2, a.inertia / scale**2, atol=1e-5, rtol=rtol)
        _assert_same_outcome(ref, _outcome(lambda: call(backend)), backend, compare)


@PROPERTY
@given(data=st.data())
def test_kmeans_rejects_non_finite_points_and_weights_on_every_backend(data):
    x = data.draw(float_tensors((2, 6, 3), dtypes=(torch.float32,), poison=False)).clone()
    which = data.draw(st.sampled_from(["x", "weights"]))
    bad = data.draw(st.sampled_from([float("nan"), float("inf"), -float("inf")]))
    weights = torch.ones(2, 6)
    (x if which == "x" else weights)[1, data.draw(st.integers(0, 5)), ...] = bad
    for backend in KM_BACKENDS:
        with pytest.raises(ValueError, match=f"{which} must be finite"):
            sk.batched_kmeans(x, 2, weights=weights, backend=backend)


# ---------------------------------------------------------------------------------------------------------
# Log-probs
# ---------------------------------------------------------------------------------------------------------
LP_BACKENDS = cpu_backends(logprobs.TOKEN_LOGPROBS)


@PROPERTY
@given(data=st.data(), B=st.integers(1, 2), T=st.integers(1, 5), V=st.integers(1, 40),
       target_dtype=st.sampled_from([torch.int64, torch.int32, torch.int16, torch.uint8, torch.bool,
                                     torch.float32]),
       out_of_range=st.booleans())
def test_token_logprobs_backends_equal_the_reference(data, B, T, V, target_dtype, out_of_range):
    logits = data.draw(float_tensors((B, T, V), dtypes=(torch.float32, torch.float16, torch.bfloat16)))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    targets = torch.randint(0, V, (B, T), generator=g)
    if out_of_range:
        targets[0, 0] = data.draw(st.sampled_from([-1, V, 2**31, 2**40]))
    targets = targets.to(target_dtype)
    ref = _outcome(lambda: sk.token_logprobs(logits, targets, backend="torch"))
    if target_dtype in (torch.bool, torch.float32):
        assert ref[0] == "error"
    for backend in LP_BACKENDS[1:]:
        def compare(a, b, backend=backend):
            atol, rtol = logprobs.TOKEN_LOGPROBS.tolerance(backend, logits.dtype)
            # Logits of magnitude s: log-probs of magnitude ~s, so the tolerance scales with them.
            torch.testing.assert_close(b, a, atol=atol * max(1.0, float(a.abs().max())), rtol=rtol)
        _assert_same_outcome(ref, _outcome(lambda: sk.token_logprobs(logits, targets, backend=backend)), backend,
                             compare)


@PROPERTY
@given(data=st.data(), B=st.integers(1, 3), L=st.integers(0, 30), delta=st.sampled_from([1, 3, 20, 2**40]),
       alpha=st.sampled_from([0.5, 0.85, 0.999]), beta=st.sampled_from([1e-6, 1.0, 50.0]), ragged=st.booleans())
def test_divergence_point_backends_equal_the_reference(data, B, L, delta, alpha, beta, ragged):
    lp = -data.draw(float_tensors((B, L), dtypes=(torch.float32, torch.float64))).abs() if L else torch.zeros(B, 0)
    lengths = None
    if ragged:
        g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
        lengths = torch.randint(0, L + 1, (B,), generator=g)
    call = lambda backend: sk.divergence_point(lp, delta=delta, alpha=alpha, beta=beta, lengths=lengths,  # noqa
                                               backend=backend)
    ref = _outcome(lambda: call("torch"))
    for backend in cpu_backends(logprobs.DIVERGENCE_POINT)[1:]:
        _assert_same_outcome(ref, _outcome(lambda: call(backend)), backend,
                             lambda a, b: torch.testing.assert_close(b, a, atol=0, rtol=0))


# ---------------------------------------------------------------------------------------------------------
# Graph
# ---------------------------------------------------------------------------------------------------------
GRAPH_BACKENDS = cpu_backends(graph.GRAPH)


@PROPERTY
@given(data=st.data(), N=st.integers(1, 10), E=st.integers(0, 25), B=st.integers(1, 3), S=st.integers(0, 3),
       hops=st.sampled_from([0, 1, 2, 5, 2**40]), capacity=st.integers(1, 12),
       max_fanout=st.sampled_from([None, 1, 2]), max_frontier=st.sampled_from([None, 1, 3]),
       id_dtype=st.sampled_from([torch.int64, torch.int32, torch.uint8]))
def test_khop_neighbourhood_backends_equal_the_reference(data, N, E, B, S, hops, capacity, max_fanout,
                                                         max_frontier, id_dtype):
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    src, dst = torch.randint(0, N, (E,), generator=g), torch.randint(0, N, (E,), generator=g)
    g_ = sk.CSRGraph.from_edges(src.to(id_dtype), dst.to(id_dtype), N)
    seeds = torch.randint(-1, N + (1 if data.draw(st.integers(0, 4)) == 0 else 0), (B, S), generator=g)
    call = lambda backend: sk.khop_neighbourhood(g_, seeds, hops=hops, capacity=capacity,  # noqa: E731
                                                 max_fanout=max_fanout, max_frontier=max_frontier, backend=backend)
    ref = _outcome(lambda: call("torch"))
    if ref[0] == "ok":  # listed nodes are distinct and in range
        for row, count in zip(ref[1].nodes, ref[1].count):
            listed = row[:int(count)]
            assert listed.unique().numel() == listed.numel() and bool(((listed >= 0) & (listed < N)).all())
    for backend in GRAPH_BACKENDS[1:]:
        def compare(a, b):
            for name, x, y in zip(a._fields, a, b):
                assert torch.equal(x, y), name
        _assert_same_outcome(ref, _outcome(lambda: call(backend)), backend, compare)


@PROPERTY
@given(row_ptr=st.lists(st.integers(-3, 2**40), min_size=0, max_size=6),
       col_idx=st.lists(st.integers(-3, 8), min_size=0, max_size=6),
       dtype=st.sampled_from([np.int64, np.int32, np.float32, np.bool_]))
def test_csr_graph_accepts_exactly_the_valid_arrays(row_ptr, col_idx, dtype):
    valid = (dtype in (np.int64, np.int32) and len(row_ptr) >= 1 and row_ptr[0] == 0 and row_ptr[-1] == len(col_idx)
             and all(a <= b for a, b in zip(row_ptr, row_ptr[1:])) and all(0 <= c < len(row_ptr) - 1 for c in col_idx)
             and max(row_ptr) < 2**31)
    try:
        rp, ci = np.array(row_ptr, dtype=np.int64).astype(dtype), np.array(col_idx, dtype=np.int64).astype(dtype)
    except OverflowError:
        return
    if dtype == np.int32 and (not np.array_equal(rp.astype(np.int64), row_ptr) or
                              not np.array_equal(ci.astype(np.int64), col_idx)):
        return  # the generated value does not fit the dtype: not the case under test
    outcome = _outcome(lambda: sk.CSRGraph(rp, ci))
    assert (outcome[0] == "ok") == valid, (row_ptr, col_idx, dtype, outcome)
    if outcome[0] == "error":
        assert outcome[1] is ValueError
