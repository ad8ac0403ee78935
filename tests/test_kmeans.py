"""Batched k-means: backend parity with the torch reference, scikit-learn ground
truth, empty-cluster re-seeding, seeding, bad inputs, opcheck and torch.compile."""
import numpy as np
import pytest
import torch

from conftest import cpu_backends
from streammem_kernels import KMeansResult, batched_kmeans, kmeans_frames
from streammem_kernels.kmeans import LLOYD, initial_centres, mean_feature_variance

BACKENDS = cpu_backends(LLOYD)
FAST_BACKENDS = [b for b in BACKENDS if b != "triton"]  # Triton is interpreted on CPU: small cases only


def blobs(B, N, D, n_blobs, *, seed=0, spread=0.05, scale=4.0, dtype=torch.float32):
    """Well separated Gaussian blobs: no near-ties between centres, so labels are exact."""
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(B, n_blobs, D, generator=g) * scale
    which = torch.randint(0, n_blobs, (B, N), generator=g)
    x = torch.gather(means, 1, which[..., None].expand(B, N, D)) + spread * torch.randn(B, N, D, generator=g)
    return x.to(dtype)


def assert_same_result(got: KMeansResult, ref: KMeansResult, *, rtol=1e-5, centre_atol=1e-5):
    assert got.labels.dtype == torch.int64 and got.n_iter.dtype == torch.int64
    assert got.centroids.dtype == torch.float32 and got.inertia.dtype == torch.float32
    assert torch.equal(got.labels, ref.labels)
    assert torch.equal(got.n_iter, ref.n_iter)
    torch.testing.assert_close(got.inertia, ref.inertia, rtol=rtol, atol=1e-6)
    torch.testing.assert_close(got.centroids, ref.centroids, rtol=1e-5, atol=centre_atol)
    assert torch.isfinite(got.centroids).all()


# --------------------------------------------------------------------------
# Every backend equals the reference (same init)
# --------------------------------------------------------------------------
# (B, N, D, k, blobs, metric, dtype, weighted, ragged)
GRID = [
    (1, 50, 3, 4, 4, "l2", torch.float32, False, False),        # B = 1
    (3, 37, 5, 1, 2, "l2", torch.float32, False, False),        # k = 1
    (2, 9, 4, 9, 9, "l2", torch.float32, False, False),         # k = N
    (4, 101, 7, 5, 5, "l2", torch.float32, False, False),       # N not a multiple of any block
    (2, 40, 1, 3, 3, "l2", torch.float32, False, False),        # D = 1
    (2, 30, 3000, 4, 4, "l2", torch.float32, False, False),     # D = 3000
    (5, 33, 6, 3, 3, "l2", torch.float32, False, True),         # ragged lengths
    (3, 45, 8, 4, 4, "l2", torch.float32, True, False),         # weights
    (3, 45, 8, 4, 4, "cosine", torch.float32, False, False),    # spherical
    (4, 29, 17, 3, 3, "cosine", torch.float32, True, True),     # spherical, weights, ragged
    (2, 70, 24, 20, 20, "l2", torch.float32, False, False),     # k > 16: two centre vectors per tile
    (3, 40, 10, 4, 4, "l2", torch.float16, False, False),       # fp16 input
    (3, 40, 10, 4, 4, "l2", torch.bfloat16, True, True),        # bf16 input
    (2, 40, 10, 4, 4, "cosine", torch.bfloat16, False, False),  # bf16, spherical
]
TRITON_GRID = [GRID[i] for i in (0, 1, 2, 6, 7, 9, 12)]


def _grid_case(case, seed=0):
    B, N, D, k, n_blobs, metric, dtype, weighted, ragged = case
    x = blobs(B, N, D, n_blobs, seed=seed, dtype=dtype)
    g = torch.Generator().manual_seed(seed + 1)
    kwargs = dict(metric=metric)
    if weighted:
        kwargs["weights"] = torch.rand(B, N, generator=g) + 0.1
    if ragged:
        kwargs["lengths"] = torch.randint(k, N + 1, (B,), generator=g)
        kwargs["lengths"][0] = N
    return x, k, kwargs


def _param_grid(grid):
    return [pytest.param(c, id=f"B{c[0]}-N{c[1]}-D{c[2]}-k{c[3]}-{c[5]}-{str(c[6])[6:]}"
                         f"{'-w' if c[7] else ''}{'-ragged' if c[8] else ''}") for c in grid]


@pytest.mark.parametrize("init", ["k-means++", "random", "first"])
@pytest.mark.parametrize("case", _param_grid(GRID))
@pytest.mark.parametrize("backend", [b for b in FAST_BACKENDS if b != "torch"])
def test_backends_match_reference(backend, case, init):
    x, k, kwargs = _grid_case(case)
    ref = batched_kmeans(x, k, init=init, backend="torch", **kwargs)
    got = batched_kmeans(x, k, init=init, backend=backend, **kwargs)
    assert_same_result(got, ref)


@pytest.mark.skipif("triton" not in BACKENDS, reason="Triton unavailable")
@pytest.mark.parametrize("case", _param_grid(TRITON_GRID))
def test_triton_matches_reference(case):
    x, k, kwargs = _grid_case(case)
    ref = batched_kmeans(x, k, iters=4, backend="torch", **kwargs)
    got = batched_kmeans(x, k, iters=4, backend="triton", **kwargs)
    # Triton accumulates centre sums in float32 (the others in float64).
    assert_same_result(got, ref, centre_atol=5e-5)


def test_reference_runs_to_convergence_on_blobs():
    # Guards the grid against vacuity: the problems really iterate and stop early.
    x, k, kwargs = _grid_case(GRID[3])
    res = batched_kmeans(x, k, init="random", iters=50, backend="torch", **kwargs)
    assert (res.n_iter >= 2).all() and (res.n_iter < 50).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_ragged_labels_past_length_are_minus_one(backend):
    x = blobs(3, 20, 4, 3, seed=3)
    lengths = torch.tensor([20, 7, 3])
    res = batched_kmeans(x, 3, lengths=lengths, iters=3, backend=backend)
    for b, n in enumerate(lengths.tolist()):
        assert (res.labels[b, n:] == -1).all()
        assert (res.labels[b, :n] >= 0).all()
        alone = batched_kmeans(x[b, :n], 3, init=initial_centres(*_prep_for_init(x, 3, lengths))[b], iters=3,
                               backend=backend)
        assert torch.equal(alone.labels[0], res.labels[b, :n])
        torch.testing.assert_close(alone.inertia[0], res.inertia[b], rtol=1e-5, atol=0)


def _prep_for_init(x, k, lengths):
    from streammem_kernels.kmeans import _prepare

    points, weights, lengths_t, k, _, _, cosine = _prepare(x, k, 10, 1e-4, "l2", None, lengths)
    return points, k, "k-means++", weights, lengths_t, 0, cosine


@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_non_contiguous_and_numpy_inputs(backend):
    base = blobs(4, 60, 12, 3, seed=5)
    x = base[::2, 5:55, ::2]  # sliced in every dimension
    assert not x.is_contiguous()
    ref = batched_kmeans(x.contiguous(), 3, backend="torch")
    assert_same_result(batched_kmeans(x, 3, backend=backend), ref)
    assert_same_result(batched_kmeans(x.contiguous().numpy(), 3, backend=backend), ref)


@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_inputs_not_mutated(backend):
    x = blobs(2, 30, 5, 3, seed=6)
    w = torch.rand(2, 30) + 0.5
    init = x[:, :3].clone() + 0.01
    copies = (x.clone(), w.clone(), init.clone())
    batched_kmeans(x, 3, weights=w, init=init, backend=backend, metric="cosine")
    for before, after in zip(copies, (x, w, init)):
        assert torch.equal(before, after)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_input_equals_float32_run_on_the_rounded_values(dtype):
    x = blobs(2, 50, 9, 4, seed=7, dtype=dtype)
    for backend in FAST_BACKENDS:
        got = batched_kmeans(x, 4, backend=backend)
        ref = batched_kmeans(x.float(), 4, backend="torch")
        assert_same_result(got, ref)


# --------------------------------------------------------------------------
# Ground truth: scikit-learn with the same initial centres
# --------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("weighted", [False, True])
def test_matches_scikit_learn(backend, weighted):
    sklearn_cluster = pytest.importorskip("sklearn.cluster")
    # Overlapping blobs so Lloyd needs several iterations; float64 copies of the
    # float32 data for scikit-learn.
    B, N, D, k = (3, 120, 6, 5) if backend != "triton" else (2, 40, 4, 3)
    x = blobs(B, N, D, k + 2, seed=11, spread=1.0, scale=2.0)
    w = torch.rand(B, N, generator=torch.Generator().manual_seed(12)) + 0.2 if weighted else None
    init = initial_centres(x, k, "k-means++", torch.ones(B, N) if w is None else w,
                           torch.full((B,), N), 3, False)
    res = batched_kmeans(x, k, init=init, weights=w, iters=30, tol=1e-4, backend=backend)
    for b in range(B):
        km = sklearn_cluster.KMeans(k, n_init=1, init=init[b].double().numpy(), algorithm="lloyd", max_iter=30,
                                    tol=1e-4)
        km.fit(x[b].double().numpy(), sample_weight=None if w is None else w[b].double().numpy())
        np.testing.assert_array_equal(res.labels[b].numpy(), km.labels_)
        np.testing.assert_allclose(float(res.inertia[b]), km.inertia_, rtol=1e-5)
        np.testing.assert_allclose(res.centroids[b].numpy(), km.cluster_centers_, rtol=1e-5, atol=1e-5)
        assert int(res.n_iter[b]) == km.n_iter_
    assert int(res.n_iter.max()) > 2  # the comparison covers several iterations


def test_mean_feature_variance_matches_numpy():
    x = blobs(3, 40, 5, 2, seed=13)
    lengths = torch.tensor([40, 17, 5])
    got = mean_feature_variance(x, lengths)
    for b, n in enumerate(lengths.tolist()):
        np.testing.assert_allclose(float(got[b]), np.var(x[b, :n].double().numpy(), axis=0).mean(), rtol=1e-12)


# --------------------------------------------------------------------------
# Empty clusters
# --------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_cluster_reseeded_with_farthest_point(backend):
    # Points 0, 1, 2, 10 on a line; the centre at 100 gets no point.  It is
    # re-seeded with the point farthest from its own centre (10, distance 100
    # from centre 0), then Lloyd converges to {0, 1, 2} and {10}.
    x = torch.tensor([[0.0], [1.0], [2.0], [10.0]])
    init = torch.tensor([[0.0], [100.0]])
    res = batched_kmeans(x, 2, init=init, backend=backend)
    assert res.labels.tolist() == [[0, 0, 0, 1]]
    torch.testing.assert_close(res.centroids[0], torch.tensor([[1.0], [10.0]]))
    torch.testing.assert_close(res.inertia, torch.tensor([2.0]))
    assert res.n_iter.tolist() == [3]  # move + re-seed, move, no change


@pytest.mark.parametrize("backend", BACKENDS)
def test_several_empty_clusters_take_distinct_points_in_decreasing_distance(backend):
    # All four centres start far from the data except centre 0: three empty
    # clusters take the three farthest points (from centre 0) in decreasing
    # distance, in increasing cluster order.
    x = torch.tensor([[0.0, 0.0], [0.5, 0.0], [3.0, 0.0], [0.0, -5.0], [0.0, 7.0]])
    init = torch.tensor([[0.0, 0.0], [50.0, 50.0], [60.0, 60.0], [70.0, 70.0]])
    res = batched_kmeans(x, 4, init=init, iters=1, backend=backend)
    torch.testing.assert_close(res.centroids[0, 1:], torch.tensor([[0.0, 7.0], [0.0, -5.0], [3.0, 0.0]]))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("metric", ["l2", "cosine"])
def test_duplicated_points_k_close_to_n_never_nan(backend, metric):
    distinct = torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 3.0]])
    x = distinct.repeat(4, 1)[None].repeat(2, 1, 1)  # (2, 12, 3): 3 distinct points, 4 copies each
    for k in (3, 5, 11, 12):
        for init in ("k-means++", "random", "first"):
            res = batched_kmeans(x, k, init=init, metric=metric, backend=backend)
            assert torch.isfinite(res.centroids).all() and torch.isfinite(res.inertia).all()
            # Every centre is one of the data points and the partition is exact.
            expect = distinct if metric == "l2" else torch.nn.functional.normalize(distinct, dim=-1)
            gap = torch.cdist(res.centroids.reshape(-1, 3), expect).min(dim=1).values
            assert gap.max() < 1e-6
            assert res.inertia.abs().max() < 1e-5
            ref = batched_kmeans(x, k, init=init, metric=metric, backend="torch")
            assert torch.equal(res.labels, ref.labels)


@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_zero_weight_cluster_is_reseeded(backend):
    # Centre 1 only attracts a zero-weight point: its weighted mean is
    # undefined, so it is re-seeded (never NaN, never a zero centre).
    x = torch.tensor([[0.0], [1.0], [9.0], [2.0]])
    w = torch.tensor([1.0, 1.0, 0.0, 1.0])
    res = batched_kmeans(x, 2, init=torch.tensor([[0.5], [9.0]]), weights=w, iters=1, backend=backend)
    # The farthest point from its own centre is 2 (1.5 from 0.5): centre 1 moves there.
    torch.testing.assert_close(res.centroids[0], torch.tensor([[1.0], [2.0]]))


# --------------------------------------------------------------------------
# Initialisation and seeds
# --------------------------------------------------------------------------
def test_fixed_seed_is_reproducible_and_seeds_differ():
    x = blobs(4, 200, 8, 10, seed=21, spread=0.5)
    for backend in FAST_BACKENDS:
        a = batched_kmeans(x, 6, seed=5, backend=backend)
        b = batched_kmeans(x, 6, seed=5, backend=backend)
        assert torch.equal(a.labels, b.labels) and torch.equal(a.centroids, b.centroids)
        assert torch.equal(a.inertia, b.inertia)
    p = (x, torch.ones(4, 200), torch.full((4,), 200))
    init5 = initial_centres(p[0], 6, "k-means++", p[1], p[2], 5, False)
    init6 = initial_centres(p[0], 6, "k-means++", p[1], p[2], 6, False)
    assert not torch.equal(init5, init6)
    assert not torch.equal(initial_centres(p[0], 6, "random", p[1], p[2], 5, False),
                           initial_centres(p[0], 6, "random", p[1], p[2], 6, False))


def test_kmeans_plus_plus_is_d2_sampling():
    # Two tight blobs 100 apart: after the first centre, D^2 sampling picks the
    # other blob with probability ~1 - 1e-7; uniform sampling would not (50%).
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(1, 30, 2, generator=g) * 0.01, 100 + torch.randn(1, 30, 2, generator=g) * 0.01], 1)
    x = x.repeat(64, 1, 1)
    init = initial_centres(x, 2, "k-means++", torch.ones(64, 60), torch.full((64,), 60), 0, False)
    sides = (init[..., 0] > 50).sum(dim=1)
    assert (sides == 1).all()
    # The first centre is drawn by weight: a zero-weight blob is never chosen.
    w = torch.cat([torch.zeros(64, 30), torch.ones(64, 30)], 1)
    init = initial_centres(x, 1, "k-means++", w, torch.full((64,), 60), 0, False)
    assert (init[..., 0] > 50).all()


def test_random_and_first_inits_pick_distinct_valid_points():
    x = torch.arange(40.0).reshape(1, 20, 2).repeat(3, 1, 1)
    lengths = torch.tensor([20, 6, 4])
    ones = torch.ones(3, 20)
    init = initial_centres(x, 4, "random", ones, lengths, 1, False)
    for b, n in enumerate(lengths.tolist()):
        idx = (init[b, :, 0] / 2).long()
        assert len(set(idx.tolist())) == 4 and idx.max() < n
    assert torch.equal(initial_centres(x, 4, "first", ones, lengths, 1, False), x[:, :4])


# --------------------------------------------------------------------------
# kmeans_frames
# --------------------------------------------------------------------------
def test_kmeans_frames_clusters_whole_frames():
    frames = blobs(2, 12, 4 * 6, 3, seed=31).reshape(2, 12, 4, 6)
    res = kmeans_frames(frames, 3, init="first")
    flat = batched_kmeans(frames.reshape(2, 12, 24), 3, init="first")
    assert res.centroids.shape == (2, 3, 4, 6)
    assert torch.equal(res.centroids.reshape(2, 3, 24), flat.centroids)
    assert torch.equal(res.labels, flat.labels)
    init4 = frames[:, :3].clone()
    assert torch.equal(kmeans_frames(frames, 3, init=init4).labels, flat.labels)
    with pytest.raises(ValueError, match="frames"):
        kmeans_frames(frames[0], 3)


def test_two_dimensional_input_is_one_problem():
    x = blobs(1, 30, 3, 3, seed=32)
    a = batched_kmeans(x[0], 3, weights=torch.ones(30), lengths=torch.tensor([25]))
    b = batched_kmeans(x, 3, lengths=torch.tensor([25]))
    assert a.centroids.shape == (1, 3, 3) and torch.equal(a.labels, b.labels)


def test_auto_backend_runs_and_matches_reference():
    x = blobs(3, 50, 8, 4, seed=33)
    assert_same_result(batched_kmeans(x, 4), batched_kmeans(x, 4, backend="torch"))


# --------------------------------------------------------------------------
# Bad inputs
# --------------------------------------------------------------------------
_X = torch.zeros(2, 5, 3)


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        ((_X, 0), {}, "k must be >= 1"),
        ((_X, 6), {}, "k must be <="),
        ((_X, 3), {"lengths": torch.tensor([5, 2])}, "k must be <="),
        ((torch.zeros(2, 5, 0), 1), {}, "x must have at least one feature"),
        ((torch.zeros(5), 1), {}, "x must have shape"),
        ((torch.zeros(1, 2, 5, 3), 1), {}, "x must have shape"),
        ((torch.zeros(2, 5, 3, dtype=torch.int64), 1), {}, "x must have dtype"),
        ((torch.tensor([[[0.0], [float("nan")]]]), 1), {}, "x must be finite"),
        ((torch.tensor([[[0.0], [float("inf")]]]), 1), {}, "x must be finite"),
        ((_X, 2), {"weights": -torch.ones(2, 5)}, "weights must be non-negative"),
        ((_X, 2), {"weights": torch.ones(2, 4)}, "weights must have shape"),
        ((_X, 2), {"weights": torch.zeros(2, 5)}, "weights must have a positive sum"),
        ((_X, 2), {"weights": torch.full((2, 5), float("nan"))}, "weights must be finite"),
        ((_X, 2), {"lengths": torch.tensor([5, 6])}, "lengths must lie in"),
        ((_X, 1), {"lengths": torch.tensor([5, 0])}, "lengths must lie in"),
        ((_X, 2), {"lengths": torch.tensor([5])}, "lengths must have shape"),
        ((_X, 2), {"lengths": torch.tensor([5.0, 5.0])}, "lengths must be an integer"),
        ((_X, 2), {"init": torch.zeros(2, 3, 3)}, "init must have shape"),
        ((_X, 2), {"init": torch.full((2, 2, 3), float("nan"))}, "init must be finite"),
        ((_X, 2), {"init": "kmeans||"}, "init must be one of"),
        ((_X, 2), {"metric": "l1"}, "metric must be one of"),
        ((_X, 2), {"iters": 0}, "iters must be >= 1"),
        ((_X, 2), {"tol": -1.0}, "tol must be >= 0"),
        ((_X, 2), {"seed": 1.5}, "seed must be an int"),
        ((_X, 2), {"backend": "fortran"}, "backend must be one of"),
    ],
)
def test_bad_inputs_raise_value_error(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        batched_kmeans(*args, **kwargs)


# --------------------------------------------------------------------------
# Custom op: opcheck and torch.compile
# --------------------------------------------------------------------------
@pytest.mark.parametrize("backend", FAST_BACKENDS)
@pytest.mark.parametrize("cosine", [False, True])
def test_opcheck(backend, cosine):
    x = blobs(2, 20, 5, 3, seed=41)
    if cosine:
        x = torch.nn.functional.normalize(x, dim=-1)
    args = (x, torch.rand(2, 20) + 0.1, torch.tensor([20, 13]), x[:, :3].clone(), 1e-4, 5, cosine, backend)
    torch.library.opcheck(torch.ops.streammem.lloyd.default, args)


def test_torch_compile_on_cpu():
    x = blobs(2, 20, 5, 3, seed=42)

    @torch.compile(backend="aot_eager", fullgraph=True)
    def core(points, weights, lengths, centres):
        return torch.ops.streammem.lloyd(points, weights, lengths, centres, 1e-4, 10, False, "torch")

    got = core(x, torch.ones(2, 20), torch.tensor([20, 20]), x[:, :3].clone())
    ref = batched_kmeans(x, 3, init="first", backend="torch")
    assert torch.equal(got[1], ref.labels)
    torch.testing.assert_close(got[0], ref.centroids)


def test_long_dot_products_keep_float64_labels_regression():
    # Regression: with D = 65,536 (StreamChat frames) a single 65,536-term
    # float32 accumulation per dot product moved near-boundary frames of one
    # problem in 16 to another cluster, and the C++ kernel settled in a worse
    # fixed point than scikit-learn in float64.  Blocked float32 partial sums
    # added in float64 keep the labels.
    sklearn_cluster = pytest.importorskip("sklearn.cluster")
    B, N, D, k = 16, 40, 65536, 5
    g = torch.Generator().manual_seed(0)
    steps = 0.3 * torch.randn(B, N, D, generator=g)
    steps[:, 0] = torch.randn(B, D, generator=g)
    x = steps.cumsum(dim=1)  # video-like drifting frame features
    init = initial_centres(x, k, "k-means++", torch.ones(B, N), torch.full((B,), N), 0, False)
    res = batched_kmeans(x, k, init=init, tol=0.0, backend="cpp" if "cpp" in BACKENDS else "torch")
    for b in range(B):
        km = sklearn_cluster.KMeans(k, init=init[b].double().numpy(), n_init=1, max_iter=10, tol=0.0,
                                    algorithm="lloyd").fit(x[b].double().numpy())
        np.testing.assert_array_equal(res.labels[b].numpy(), km.labels_)
        assert int(res.n_iter[b]) == km.n_iter_
