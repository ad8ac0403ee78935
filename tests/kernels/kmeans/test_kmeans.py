"""Batched k-means: backend parity with the torch reference (on CPU and CUDA
tensors), scikit-learn ground truth, empty-cluster re-seeding, seeding, bad
inputs, opcheck and torch.compile, and the GPU path's contract: no host
synchronisation, CUDA-graph capture, 64-bit offsets."""
import numpy as np
import pytest
import torch

from tests.support.device_checks import cpu_backends
from tests.support.device_checks import (DEVICES, HAS_CUDA, HostSync, capture_in_cuda_graph, device_backends, guard_backend,
                           no_host_sync)
from streammem_kernels import KMeansResult, batched_kmeans, kmeans_frames
from streammem_kernels.kmeans import LLOYD, initial_centres
from streammem_kernels.kmeans.reference import (assign_torch, distance_to_own_centre, lloyd_loop,
                                                 mean_feature_variance)

BACKENDS = cpu_backends(LLOYD)
FAST_BACKENDS = [b for b in BACKENDS if b != "triton"]  # Triton is interpreted on CPU: small cases only
HAS_TRITON = "triton" in BACKENDS


def blobs(B, N, D, n_blobs, *, seed=0, spread=0.05, scale=4.0, dtype=torch.float32):
    """Well separated Gaussian blobs: no near-ties between centres, so labels are exact."""
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(B, n_blobs, D, generator=g) * scale
    which = torch.randint(0, n_blobs, (B, N), generator=g)
    x = torch.gather(means, 1, which[..., None].expand(B, N, D)) + spread * torch.randn(B, N, D, generator=g)
    return x.to(dtype)


def assert_same_result(got: KMeansResult, ref: KMeansResult, *, atol=1e-5, rtol=1e-5):
    """Labels and iteration counts exact; centres and inertia within (atol, rtol) (inertia: rtol only)."""
    got = KMeansResult(*(t.cpu() for t in got))
    assert got.labels.dtype == torch.int64 and got.n_iter.dtype == torch.int64
    assert got.centroids.dtype == torch.float32 and got.inertia.dtype == torch.float64
    assert torch.equal(got.labels, ref.labels)
    assert torch.equal(got.n_iter, ref.n_iter)
    torch.testing.assert_close(got.inertia, ref.inertia, rtol=rtol, atol=1e-6)
    torch.testing.assert_close(got.centroids, ref.centroids, rtol=rtol, atol=atol)
    assert torch.isfinite(got.centroids).all()


def _device_backend_params():
    """(device, backend) pairs: every non-reference CPU backend, and on CUDA every backend the op has
    (resolved against the GPU at run time by device_backends; the "cuda" params skip without one)."""
    # Interpreted Triton on CPU runs the TRITON_GRID subset only (test_triton_matches_reference).
    params = [pytest.param("cpu", b, id=f"cpu-{b}") for b in FAST_BACKENDS if b != "torch"]
    cuda = next(d for d in DEVICES if not isinstance(d, str))
    for b in ("torch", "triton", "cuda"):
        if b in LLOYD.impls:
            params.append(pytest.param("cuda", b, id=f"cuda-{b}", marks=cuda.marks))
    return params


def _require(device, backend):
    if backend not in device_backends(LLOYD, device):
        pytest.skip(f"{backend} cannot run on {device} here")


def _to(device, *tensors):
    return [t.to(device) if isinstance(t, torch.Tensor) else t for t in tensors]


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


def _cpu_initial_centres(x, k, init, kwargs):
    from streammem_kernels.kmeans import _prepare

    points, weights, lengths, k, _, _, cosine = _prepare(x, k, 10, 1e-4, kwargs.get("metric", "l2"),
                                                         kwargs.get("weights"), kwargs.get("lengths"))
    return initial_centres(points, k, init, weights, lengths, 0, cosine)


def _param_grid(grid):
    return [pytest.param(c, id=f"B{c[0]}-N{c[1]}-D{c[2]}-k{c[3]}-{c[5]}-{str(c[6])[6:]}"
                         f"{'-w' if c[7] else ''}{'-ragged' if c[8] else ''}") for c in grid]


@pytest.mark.parametrize("init", ["k-means++", "random", "first"])
@pytest.mark.parametrize("case", _param_grid(GRID))
@pytest.mark.parametrize("device, backend", _device_backend_params())
def test_backends_match_reference(device, backend, case, init):
    _require(device, backend)
    x, k, kwargs = _grid_case(case)
    if device != "cpu":  # the same initial centres for both: the seeding generator would run on the device
        init = _cpu_initial_centres(x, k, init, kwargs)
    ref = batched_kmeans(x, k, init=init, backend="torch", **kwargs)  # CPU reference
    if device != "cpu":
        init = init.to(device)
        kwargs = {name: value.to(device) if isinstance(value, torch.Tensor) else value
                  for name, value in kwargs.items()}
    got = batched_kmeans(x.to(device), k, init=init, backend=backend, **kwargs)
    atol, rtol = LLOYD.tolerance(backend, x.dtype)
    assert_same_result(got, ref, atol=atol, rtol=rtol)


@pytest.mark.skipif(not HAS_TRITON, reason="Triton unavailable")
@pytest.mark.parametrize("case", _param_grid(TRITON_GRID))
def test_triton_matches_reference(case):
    x, k, kwargs = _grid_case(case)
    ref = batched_kmeans(x, k, iters=4, backend="torch", **kwargs)
    got = batched_kmeans(x, k, iters=4, backend="triton", **kwargs)
    atol, rtol = LLOYD.tolerance("triton", x.dtype)
    assert_same_result(got, ref, atol=atol, rtol=rtol)


def test_reference_runs_to_convergence_on_blobs():
    # Guards the grid against vacuity: the problems really iterate and stop early.
    x, k, kwargs = _grid_case(GRID[3])
    res = batched_kmeans(x, k, init="random", iters=50, backend="torch", **kwargs)
    assert (res.n_iter >= 2).all() and (res.n_iter < 50).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_problems_stop_independently(backend):
    # One batch whose problems converge after different numbers of iterations: a problem that has
    # stopped keeps its centres and n_iter (the Triton loop masks it on the device while the others
    # go on), so each problem's result equals that of running it alone.
    x = torch.cat([blobs(1, 24, 3, 3, seed=50, spread=0.01),  # tight blobs: converges at once
                   blobs(1, 24, 3, 3, seed=68, spread=1.5, scale=1.0),  # overlapping: several iterations
                   blobs(1, 24, 3, 3, seed=168, spread=1.0, scale=1.0)])  # (2, 3 and 4 iterations)
    init = x[:, [0, 1, 2]].clone()
    res = batched_kmeans(x, 3, init=init, iters=6, backend=backend)
    ref = batched_kmeans(x, 3, init=init, iters=6, backend="torch")
    atol, rtol = LLOYD.tolerance(backend, x.dtype)
    assert_same_result(res, ref, atol=atol, rtol=rtol)
    assert len(set(ref.n_iter.tolist())) == 3 and int(ref.n_iter.max()) < 6, ref.n_iter  # distinct stops
    for b in range(3):
        alone = batched_kmeans(x[b], 3, init=init[b], iters=6, backend=backend)
        assert torch.equal(alone.labels, res.labels[b]) and int(alone.n_iter) == int(res.n_iter[b])
        assert torch.equal(alone.centroids, res.centroids[b])


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
        assert torch.equal(alone.labels, res.labels[b, :n])
        torch.testing.assert_close(alone.inertia, res.inertia[b], rtol=1e-5, atol=0)


def _prep_for_init(x, k, lengths):
    from streammem_kernels.kmeans import _prepare

    points, weights, lengths_t, k, _, _, cosine = _prepare(x, k, 10, 1e-4, "l2", None, lengths)
    return points, k, "k-means++", weights, lengths_t, 0, cosine


_SLICED_PARAMS = _device_backend_params() + ([pytest.param("cpu", "triton", id="cpu-triton")] if HAS_TRITON else [])


@pytest.mark.parametrize("device, backend", _SLICED_PARAMS)
def test_non_contiguous_and_numpy_inputs(device, backend):
    base = blobs(4, 60, 12, 3, seed=5)
    x = base[::2, 5:55, ::2]  # sliced in every dimension
    _require(device, backend)
    iters = 4 if backend == "triton" and device == "cpu" else 10
    init = _cpu_initial_centres(x, 3, "k-means++", {})
    ref = batched_kmeans(x.contiguous(), 3, init=init, iters=iters, backend="torch")
    sliced = base.to(device)[::2, 5:55, ::2]
    assert not sliced.is_contiguous()
    atol, rtol = LLOYD.tolerance(backend, x.dtype)
    assert_same_result(batched_kmeans(sliced, 3, init=init.to(device), iters=iters, backend=backend), ref,
                       atol=atol, rtol=rtol)
    if device == "cpu":
        assert_same_result(batched_kmeans(x.contiguous().numpy(), 3, init=init, iters=iters, backend=backend), ref,
                           atol=atol, rtol=rtol)


@pytest.mark.parametrize("backend", BACKENDS)
def test_inputs_not_mutated(backend):
    x = blobs(2, 30, 5, 3, seed=6)
    w = torch.rand(2, 30) + 0.5
    init = x[:, :3].clone() + 0.01
    copies = (x.clone(), w.clone(), init.clone())
    batched_kmeans(x, 3, weights=w, init=init, iters=3, backend=backend, metric="cosine")
    batched_kmeans(x, 3, weights=w, init=init, iters=3, backend=backend)
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
    assert res.labels.tolist() == [0, 0, 0, 1]
    torch.testing.assert_close(res.centroids, torch.tensor([[1.0], [10.0]]))
    torch.testing.assert_close(res.inertia, torch.tensor(2.0, dtype=torch.float64))
    assert res.n_iter.tolist() == 3  # move + re-seed, move, no change


@pytest.mark.parametrize("backend", BACKENDS)
def test_several_empty_clusters_take_distinct_points_in_decreasing_distance(backend):
    # All four centres start far from the data except centre 0: three empty
    # clusters take the three farthest points (from centre 0) in decreasing
    # distance, in increasing cluster order.
    x = torch.tensor([[0.0, 0.0], [0.5, 0.0], [3.0, 0.0], [0.0, -5.0], [0.0, 7.0]])
    init = torch.tensor([[0.0, 0.0], [50.0, 50.0], [60.0, 60.0], [70.0, 70.0]])
    res = batched_kmeans(x, 4, init=init, iters=1, backend=backend)
    torch.testing.assert_close(res.centroids[1:], torch.tensor([[0.0, 7.0], [0.0, -5.0], [3.0, 0.0]]))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("metric", ["l2", "cosine"])
def test_duplicated_points_k_close_to_n_never_nan(backend, metric):
    distinct = torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 3.0]])
    x = distinct.repeat(4, 1)[None].repeat(2, 1, 1)  # (2, 12, 3): 3 distinct points, 4 copies each
    # Interpreted Triton re-seeds cluster by cluster in one program per problem: a subset.
    for k in (3, 5, 11, 12) if backend != "triton" else (5, 12):
        for init in ("k-means++", "random", "first") if backend != "triton" else ("k-means++", "first"):
            # Every case converges within 3 iterations: the cap of 4 only saves interpreted launches.
            res = batched_kmeans(x, k, init=init, metric=metric, iters=4, backend=backend)
            assert torch.isfinite(res.centroids).all() and torch.isfinite(res.inertia).all()
            # Every centre is one of the data points and the partition is exact.
            expect = distinct if metric == "l2" else torch.nn.functional.normalize(distinct, dim=-1)
            gap = torch.cdist(res.centroids.reshape(-1, 3), expect).min(dim=1).values
            assert gap.max() < 1e-6
            assert res.inertia.abs().max() < 1e-5
            ref = batched_kmeans(x, k, init=init, metric=metric, iters=4, backend="torch")
            assert torch.equal(res.labels, ref.labels) and torch.equal(res.n_iter, ref.n_iter)
            assert int(ref.n_iter.max()) < 4


@pytest.mark.parametrize("device", DEVICES)
def test_triton_centre_update_rounds_like_the_reference(device):
    # The update kernel divides float32 sums by float32 masses in float32 (tl.div_rn), the reference
    # in float64 then rounds to float32: the same bits (double rounding is innocuous for a division
    # when 53 >= 2 * 24 + 2).  Quotients over 70 orders of magnitude; an empty cluster (mass 0) keeps its sums.
    if "triton" not in device_backends(LLOYD, device):
        pytest.skip("Triton cannot run here")
    import triton

    from streammem_kernels.kmeans import _triton as kt

    g = torch.Generator().manual_seed(90)
    B, K, D = 2, 40, 50
    sums = torch.randn(B, K, D, generator=g) * torch.logspace(-25, 25, D)  # quotients stay finite
    mass = torch.rand(B, K, generator=g) * torch.logspace(-10, 10, K)
    mass[0, 3] = 0.0
    old = torch.randn(B, K, D, generator=g)
    # kmeans.finish_update's arithmetic (an empty cluster keeps its sums until it is re-seeded).
    expect = (sums.double() / torch.where(mass > 0, mass, 1.0).double()[..., None]).float()
    t = [v.to(device) for v in (sums, mass, old)]
    new = torch.empty_like(t[2])
    csq = torch.empty(B, K, dtype=torch.float64, device=device)
    empty = torch.empty(B, K, dtype=torch.int32, device=device)
    row_shift = torch.empty(B, K, dtype=torch.float64, device=device)
    n_empty = torch.zeros(B, dtype=torch.int32, device=device)
    active = torch.ones(B, dtype=torch.int32, device=device)
    kt._update_kernel[(triton.cdiv(K, kt.ROWS_BLOCK_K), B)](
        t[0], t[1], t[2], new, csq, empty, n_empty, row_shift, active, D, K, 0,
        BLOCK_K=kt.ROWS_BLOCK_K, BLOCK_D=kt.ROWS_BLOCK_D, enable_fp_fusion=False)
    assert torch.equal(new.cpu(), expect)
    assert n_empty.tolist() == [1, 0] and empty.cpu()[0, 3] == 1


@pytest.mark.skipif(not HAS_TRITON, reason="Triton unavailable")
@pytest.mark.parametrize("cosine", [False, True])
def test_triton_assignment_ties_go_to_the_lowest_centre_index(cosine):
    # Centres 2, 5 and 18 coincide (18 in the second tile of 16 centres): the points nearest to them
    # take label 2, as the reference's argmin does.  (A Lloyd step re-seeds the tied, now empty,
    # centres, so the public function is checked against the reference in the duplicate tests.)
    from streammem_kernels.kmeans import _triton as kt

    g = torch.Generator().manual_seed(80)
    centres = torch.randn(1, 20, 4, generator=g) * 10
    centres[0, [5, 18]] = centres[0, 2].clone()
    x = torch.cat([centres[0, 2] + 0.01 * torch.randn(6, 4, generator=g), centres[0, [0, 7, 19]]])[None]
    if cosine:
        x, centres = torch.nn.functional.normalize(x, dim=-1), torch.nn.functional.normalize(centres, dim=-1)
    labels = torch.full((1, 9), -1, dtype=torch.int64)
    kt._assign(x, centres, (centres.double() ** 2).sum(-1), torch.tensor([9]), torch.ones(1, dtype=torch.int32),
               labels, cosine)
    assert labels.tolist() == [[2] * 6 + [0, 7, 19]]
    assert torch.equal(labels, assign_torch(x, centres, torch.ones(1, 9, dtype=torch.bool), cosine))


@pytest.mark.parametrize("backend", BACKENDS)
def test_reseeding_ties_go_to_the_lowest_point_index(backend):
    # Points -3 and 3 are equally far (9) from centre 0; the two empty clusters (1 and 2, far away)
    # take them in increasing cluster order: cluster 1 the lower index (-3), cluster 2 the other.
    x = torch.tensor([[0.0], [0.0], [-3.0], [3.0], [1.0]])
    res = batched_kmeans(x, 3, init=torch.tensor([[0.0], [100.0], [200.0]]), iters=1, backend=backend)
    torch.testing.assert_close(res.centroids[1:], torch.tensor([[-3.0], [3.0]]))
    x = torch.tensor([[0.0], [3.0], [0.0], [-3.0], [1.0]])  # the same points, the tie in the other order
    res = batched_kmeans(x, 3, init=torch.tensor([[0.0], [100.0], [200.0]]), iters=1, backend=backend)
    torch.testing.assert_close(res.centroids[1:], torch.tensor([[3.0], [-3.0]]))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("metric", ["l2", "cosine"])
def test_reseeding_batched_problems_with_different_empty_clusters(backend, metric):
    # One batch: problem 0 has two empty clusters, problem 1 none, problem 2 one (and a shorter
    # length, so its padded points must never be chosen); each equals its own run.
    g = torch.Generator().manual_seed(60)
    x = torch.randn(3, 20, 4, generator=g)
    x[2, 15:] = 50.0  # padding far from everything: it would win the farthest-point rule if considered
    init = x[:, :4].clone()
    init[0, 2:] = 80.0  # two centres far from every point
    init[2, 3] = -80.0
    lengths = torch.tensor([20, 20, 15])
    res = batched_kmeans(x, 4, init=init, lengths=lengths, iters=2, metric=metric, backend=backend)
    ref = batched_kmeans(x, 4, init=init, lengths=lengths, iters=2, metric=metric, backend="torch")
    atol, rtol = LLOYD.tolerance(backend, x.dtype)
    assert_same_result(res, ref, atol=atol, rtol=rtol)
    for b in range(3):
        n = int(lengths[b])
        alone = batched_kmeans(x[b, :n], 4, init=init[b], iters=2, metric=metric, backend=backend)
        assert torch.equal(alone.labels, res.labels[b, :n]) and torch.equal(alone.n_iter, res.n_iter[b])
        torch.testing.assert_close(alone.centroids, res.centroids[b], atol=atol, rtol=rtol)
    assert (res.centroids[2].abs() < 49).all()  # the padding was never taken


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_weight_cluster_is_reseeded(backend):
    # Centre 1 only attracts a zero-weight point: its weighted mean is
    # undefined, so it is re-seeded (never NaN, never a zero centre).
    x = torch.tensor([[0.0], [1.0], [9.0], [2.0]])
    w = torch.tensor([1.0, 1.0, 0.0, 1.0])
    res = batched_kmeans(x, 2, init=torch.tensor([[0.5], [9.0]]), weights=w, iters=1, backend=backend)
    # The farthest point from its own centre is 2 (1.5 from 0.5): centre 1 moves there.
    torch.testing.assert_close(res.centroids, torch.tensor([[1.0], [2.0]]))


# --------------------------------------------------------------------------
# Initialisation and seeds
# --------------------------------------------------------------------------
def test_fixed_seed_is_reproducible_and_seeds_differ():
    x = blobs(4, 200, 8, 10, seed=21, spread=0.5)
    for backend in FAST_BACKENDS:
        a = batched_kmeans(x, 6, random_state=5, backend=backend)
        b = batched_kmeans(x, 6, random_state=5, backend=backend)
        assert torch.equal(a.labels, b.labels) and torch.equal(a.centroids, b.centroids)
        assert torch.equal(a.inertia, b.inertia)
    p = (x, torch.ones(4, 200), torch.full((4,), 200))
    init5 = initial_centres(p[0], 6, "k-means++", p[1], p[2], 5, False)
    init6 = initial_centres(p[0], 6, "k-means++", p[1], p[2], 6, False)
    assert not torch.equal(init5, init6)
    assert not torch.equal(initial_centres(p[0], 6, "random", p[1], p[2], 5, False),
                           initial_centres(p[0], 6, "random", p[1], p[2], 6, False))


# --------------------------------------------------------------------------
# CPU fast path (unweighted l2 k-means++ on float32 C-contiguous points: one native call)
# --------------------------------------------------------------------------
_cpp_kmeans = pytest.mark.skipif("cpp" not in BACKENDS, reason="the C++ backend is not built")


def _native_noise(mod, seed, n_exponential, n_uniform=0):
    """The C++ seeding's draws for a generator seeded with ``seed`` (manual_seed keeps 32 bits): n exponentials,
    then n uniforms."""
    from streammem_kernels.runtime.native import view

    exponential = torch.empty(n_exponential, dtype=torch.float64)
    uniform = torch.empty(n_uniform, dtype=torch.float64)
    assert mod.seeding_noise(seed & 0xFFFFFFFF, view(exponential), view(uniform)) == 0
    return exponential, uniform


@_cpp_kmeans
@pytest.mark.parametrize("seed", [0, 1, 5, 2**31, 2**32 + 7, -3, 2**63 - 1, -(2**63), 2**64 - 1])
def test_fast_path_noise_is_torchs_generator_stream(seed):
    # The reference draws torch.multinomial(w, 1) (argmax(w / q), q = exponential_(1) of the generator), then
    # torch.rand((B, trials), float64) per step: the C++ seeding draws the same values bit for bit, so its
    # picks follow the reference's generator.
    from streammem_kernels.runtime.dispatch import load_native

    mod, _ = load_native("cpu", "kmeans")
    g = torch.Generator().manual_seed(seed)
    exponential = torch.empty(3000, dtype=torch.float64).exponential_(1, generator=g)
    uniform = torch.rand((7, 3), dtype=torch.float64, generator=g).flatten()
    native = _native_noise(mod, seed, 3000, 21)
    assert torch.equal(native[0], exponential) and torch.equal(native[1], uniform)
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(2, 40, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    drawn = torch.multinomial(p, 1, generator=g)[:, 0]
    q = _native_noise(mod, seed, 80)[0].view(2, 40)
    assert torch.equal(drawn, (p / q).argmax(dim=1))


@_cpp_kmeans
@pytest.mark.parametrize("shape,k", [((1, 64, 384), 4), ((3, 20, 5), 3), ((5, 33, 17), 5), ((1, 7, 3), 7),
                                     ((40, 9), 2), ((2, 1, 4), 1)])
def test_fast_path_equals_the_general_path_and_the_reference(shape, k):
    for seed in range(12):
        x = torch.randn(shape, generator=torch.Generator().manual_seed(seed + 100)) * 3
        fast = LLOYD.run_fast("auto", x, k, 5, 1e-4, "k-means++", None, "l2", None, None, seed)
        assert fast is not None  # the case the fast path exists for: it must not fall back
        assert all(torch.equal(a, b) for a, b in zip(fast, batched_kmeans(x, k, iters=5, random_state=seed)))
        ones = torch.ones(x.shape[:-1])  # weights force the general path (torch seeding, same C++ Lloyd)
        general = batched_kmeans(x, k, iters=5, random_state=seed, weights=ones, backend="cpp")
        for a, b in zip(fast, general):
            assert a.dtype == b.dtype and torch.equal(a, b)
        ref = batched_kmeans(x, k, iters=5, random_state=seed, backend="torch")
        assert torch.equal(fast.labels, ref.labels) and torch.equal(fast.n_iter, ref.n_iter)
        atol, rtol = LLOYD.tolerances["cpp"][torch.float32]
        torch.testing.assert_close(fast.centroids, ref.centroids, atol=atol, rtol=rtol)
        torch.testing.assert_close(fast.inertia, ref.inertia, atol=atol, rtol=rtol)


@_cpp_kmeans
def test_fast_path_never_seeds_on_a_duplicate_of_a_chosen_centre():
    # Four distinct points, each repeated 16 times: D^2 sampling gives every copy of a chosen centre
    # zero mass (exactly, from direct differences), so the k = 4 seeds are the 4 points.
    base = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]) * 7.3 + 0.1
    x = base.repeat(16, 1)[torch.randperm(64, generator=torch.Generator().manual_seed(2))]
    for seed in range(20):
        res = batched_kmeans(x, 4, iters=1, random_state=seed)
        assert sorted(map(tuple, res.centroids.tolist())) == sorted(map(tuple, base.tolist()))
        assert res.inertia.item() == 0.0


@_cpp_kmeans
def test_inputs_outside_the_fast_path_give_the_same_result():
    # Non-contiguous or requiring grad: the general path, with the same seeding (and the torch backend).
    x = blobs(2, 40, 6, 3, seed=8)
    fast = batched_kmeans(x, 3, random_state=4)
    wide = torch.stack([x, x], dim=3).reshape(2, 40, 12)[:, :, ::2]  # non-contiguous view of x's values
    assert torch.equal(wide, x) and not wide.is_contiguous()
    for other in (batched_kmeans(wide, 3, random_state=4),
                  batched_kmeans(x.clone().requires_grad_(), 3, random_state=4),
                  batched_kmeans(x, 3, random_state=4, backend="torch")):
        assert torch.equal(other.labels, fast.labels) and torch.equal(other.n_iter, fast.n_iter)
        torch.testing.assert_close(other.centroids, fast.centroids, atol=1e-5, rtol=1e-5)
        assert not other.centroids.requires_grad


@_cpp_kmeans
def test_fast_path_keeps_the_checks_and_the_rescaling():
    x = blobs(2, 30, 5, 3, seed=4)
    bad = x.clone()
    bad[1, 3, 2] = float("nan")
    with pytest.raises(ValueError, match="x must be finite"):
        batched_kmeans(bad, 3)
    with pytest.raises(ValueError, match="k must be <="):
        batched_kmeans(x, 31)
    with pytest.raises(ValueError, match="iters"):
        batched_kmeans(x, 3, iters=0)
    # Huge points take the general path's power-of-two scale: finite and equal to the scaled problem's.
    huge = batched_kmeans(x * 2.0**100, 3, random_state=3)
    plain = batched_kmeans(x, 3, random_state=3)
    assert torch.equal(huge.labels, plain.labels)
    torch.testing.assert_close(huge.centroids, plain.centroids * 2.0**100)
    before = x.clone()
    batched_kmeans(x, 3)
    assert torch.equal(x, before)



@_cpp_kmeans
def test_fast_path_and_general_path_raise_the_same_errors():
    # The latency path checks the points in C++ (by status); the message is the general path's, written once.
    x = blobs(2, 30, 5, 3, seed=4)
    for bad in (float("nan"), float("inf"), -float("inf")):
        broken = x.clone()
        broken[1, 29, 4] = bad
        errors = []
        for call in (lambda: batched_kmeans(broken, 3),  # the latency path
                     lambda: batched_kmeans(broken, 3, backend="torch"),
                     lambda: batched_kmeans(broken, 3, weights=torch.ones(2, 30))):  # the general cpp path
            with pytest.raises(ValueError) as info:
                call()
            errors.append(str(info.value))
        assert errors == ["x must be finite, found NaN or Inf"] * 3
    # Out of the scale range: the latency path declines, the general path rescales.
    assert LLOYD.run_fast("auto", x * 2.0**60, 3, 5, 1e-4, "k-means++", None, "l2", None, None, 0) is None


@_cpp_kmeans
def test_cpp_backend_takes_strided_lengths_and_weights():
    x = blobs(3, 25, 4, 3, seed=6)
    lengths = torch.tensor([[25, 0], [18, 0], [9, 0]])[:, 0]  # a strided view
    weights = (torch.rand(25, 3, generator=torch.Generator().manual_seed(1)) + 0.1).t()
    assert not lengths.is_contiguous() and not weights.is_contiguous()
    strided = batched_kmeans(x, 3, lengths=lengths, weights=weights, backend="cpp")
    plain = batched_kmeans(x, 3, lengths=lengths.contiguous(), weights=weights.contiguous(), backend="cpp")
    assert all(torch.equal(a, b) for a, b in zip(strided, plain))


@_cpp_kmeans
def test_native_entry_refuses_a_broken_border_contract():
    from streammem_kernels.runtime.dispatch import load_native
    from streammem_kernels.runtime.native import view

    mod, _ = load_native("cpu", "kmeans")
    x = blobs(1, 10, 4, 2, seed=1)
    labels, inertia, n_iter = torch.empty(1, 10, dtype=torch.int64), torch.empty(1), torch.empty(1, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="centroids must be"):
        mod.lloyd(view(x), None, None, view(torch.empty(1, 11, 4)), -1, 0, 0.0, 3, False, view(labels),
                  view(inertia), view(n_iter))
    with pytest.raises(RuntimeError, match="labels must be a C-contiguous CPU int64 tensor of 10 elements"):
        mod.lloyd(view(x), None, None, view(x[:, :2].clone()), -1, 0, 0.0, 3, False, view(labels[:, :5]),
                  view(inertia), view(n_iter))
    with pytest.raises(RuntimeError, match="unweighted l2"):
        mod.lloyd(view(x), None, None, view(x[:, :2].clone()), 7, 3, 0.0, 3, True, view(labels), view(inertia),
                  view(n_iter))

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


def _greedy_seeds_numpy(x, w, k, trials, seed):
    """scikit-learn's greedy ``_kmeans_plusplus`` written out in float64 numpy, fed the draws the reference
    takes from its generator (the first pick by ``torch.multinomial(w, 1)``, each step's uniforms by
    ``torch.rand((B, trials), float64)``): the rule, independently of the reference's code."""
    g = torch.Generator().manual_seed(seed)
    B, N, D = x.shape
    first = torch.multinomial(w.double(), 1, generator=g)[:, 0].numpy()
    uniforms = [torch.rand((B, trials), dtype=torch.float64, generator=g).numpy() for _ in range(1, k)]
    xs, ws = x.double().numpy(), w.double().numpy()
    out = np.empty((B, k, D))
    for b in range(B):
        chosen = [first[b]]
        closest = ((xs[b] - xs[b, first[b]]) ** 2).sum(-1)
        for step in range(1, k):
            running = np.cumsum(ws[b] * closest)
            candidates = np.searchsorted(running, uniforms[step - 1][b] * running[-1], side="right")
            to_candidates = ((xs[b][None] - xs[b, candidates][:, None]) ** 2).sum(-1)
            trial = np.minimum(closest, to_candidates)
            best = int(np.argmin(trial @ ws[b]))
            closest = trial[best]
            chosen.append(candidates[best])
        out[b] = xs[b, chosen]
    return torch.from_numpy(out).float()


@pytest.mark.parametrize("trials", [None, 1, 4])
@pytest.mark.parametrize("weighted", [False, True])
def test_kmeans_plus_plus_is_scikit_learns_greedy_rule(trials, weighted):
    # Overlapping blobs (no near-ties between candidates' potentials at float32 precision): the reference's
    # seeds are those of the rule written out in numpy on the same draws, for the default 2 + floor(ln k)
    # candidates per step, one (plain D^2 sampling) and more; and the C++ latency path seeds the same.
    x = blobs(3, 80, 4, 9, seed=38, spread=0.5, scale=2.0)
    w = torch.rand(3, 80, generator=torch.Generator().manual_seed(39)) + 0.2 if weighted else torch.ones(3, 80)
    k = 7
    for seed in range(4):
        got = initial_centres(x, k, "k-means++", w, torch.full((3,), 80), seed, False, n_local_trials=trials)
        expect = _greedy_seeds_numpy(x, w, k, 2 + int(np.log(k)) if trials is None else trials, seed)
        assert torch.equal(got, expect)
        if not weighted:  # unweighted: the latency path seeds in C++, then runs Lloyd as the general path does
            fast = batched_kmeans(x, k, iters=3, random_state=seed, n_local_trials=trials)
            general = batched_kmeans(x, k, iters=3, init=got, backend="cpp")
            assert all(torch.equal(a, b) for a, b in zip(fast, general))


@pytest.mark.host_sync
@pytest.mark.parametrize("cosine", [False, True])
def test_greedy_seeding_never_reads_a_value_on_the_host(cosine):
    # On CUDA tensors every backend is seeded by the reference on the device: its steps (draws, running
    # sums, inverse CDF, potentials, argmin) stay tensors, so seeding a GPU batch never synchronises.
    from streammem_kernels.kmeans.reference import kmeans_plus_plus

    x = blobs(3, 40, 5, 4, seed=41)
    if cosine:
        x = torch.nn.functional.normalize(x, dim=-1)
    weights = torch.rand(3, 40, generator=torch.Generator().manual_seed(42)) + 0.1
    with no_host_sync():
        seeds = kmeans_plus_plus(x, 6, weights, torch.Generator().manual_seed(0), cosine, 3)
    assert seeds.shape == (3, 6, 5)


def test_greedy_seeding_lowers_the_potential():
    # Each step keeps the best of its candidates, so on average the seeds' potential (the inertia of the
    # initial centres) is lower than with one candidate per step, drawn from the same generator.
    x = blobs(16, 200, 2, 12, seed=40, spread=0.3, scale=3.0)
    ones, lengths = torch.ones(16, 200), torch.full((16,), 200)
    valid = torch.ones(16, 200, dtype=torch.bool)

    def potential(centres):
        return distance_to_own_centre(x, centres, assign_torch(x, centres, valid, False), False).sum(dim=1)

    greedy = potential(initial_centres(x, 12, "k-means++", ones, lengths, 0, False))
    plain = potential(initial_centres(x, 12, "k-means++", ones, lengths, 0, False, n_local_trials=1))
    assert greedy.mean() < 0.8 * plain.mean() and (greedy <= plain).float().mean() > 0.7


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
    for bad in (frames[0, 0, 0], frames[None]):
        with pytest.raises(ValueError, match="frames must have shape"):
            kmeans_frames(bad, 3)


def test_kmeans_frames_takes_one_vector_per_frame_and_one_chunk():
    # StreamChat's chunks are (B, L, D) (one feature vector per frame); one chunk is (L, D).
    chunks = blobs(3, 16, 20, 4, seed=34)
    res = kmeans_frames(chunks, 4, random_state=2)
    ref = batched_kmeans(chunks, 4, random_state=2)
    assert res.centroids.shape == (3, 4, 20) and res.labels.shape == (3, 16)
    assert all(torch.equal(a, b) for a, b in zip(res, ref))
    one = kmeans_frames(chunks[1].numpy(), 4, init=chunks[1, :4])
    alone = batched_kmeans(chunks[1], 4, init=chunks[1, :4])
    assert one.centroids.shape == (4, 20) and one.labels.shape == (16,) and one.inertia.shape == ()
    assert all(torch.equal(a, b) for a, b in zip(one, alone))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("rank", [2, 3, 4])
def test_kmeans_frames_keeps_the_input_dtype(dtype, rank):
    frames = blobs(2, 10, 12, 3, seed=35).reshape((2, 10, 3, 4)[:rank] if rank == 4 else (2, 10, 12)).to(dtype)
    if rank == 2:
        frames = frames[0]
    res = kmeans_frames(frames, 3, init="first")
    assert res.centroids.dtype == dtype and res.labels.dtype == torch.int64 and res.inertia.dtype == torch.float64
    # The centres of the float32 computation, rounded once to the input dtype.
    flat = batched_kmeans(frames.reshape(frames.shape[:-2] + (-1,)) if rank == 4 else frames, 3, init="first")
    assert torch.equal(res.centroids.reshape(flat.centroids.shape), flat.centroids.to(dtype))


def test_two_dimensional_input_is_one_problem_without_a_batch_dimension():
    x = blobs(1, 30, 3, 3, seed=32)
    for backend in BACKENDS:
        a = batched_kmeans(x[0], 3, weights=torch.ones(30), lengths=torch.tensor([25]), iters=4, backend=backend)
        b = batched_kmeans(x, 3, lengths=torch.tensor([25]), iters=4, backend=backend)
        assert a.centroids.shape == (3, 3) and a.labels.shape == (30,) and a.inertia.shape == a.n_iter.shape == ()
        for one, batch in zip(a, b):
            assert torch.equal(one, batch[0])
    # The latency path (unweighted l2 k-means++ on float32 points) and a numpy array too.
    fast = batched_kmeans(x[0], 3)
    assert all(torch.equal(one, batch[0]) for one, batch in zip(fast, batched_kmeans(x, 3)))
    assert all(torch.equal(one, batch[0]) for one, batch in zip(batched_kmeans(x[0].numpy(), 3), batched_kmeans(x, 3)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_float64_input_is_clustered_as_its_float32_rounding(backend):
    # numpy's default dtype: the points are rounded once to float32 and the centres come back widened to
    # float64 (labels, n_iter and inertia those of the float32 run).
    x = blobs(2, 40, 5, 3, seed=36).double() + 1e-9  # values no float32 holds exactly
    iters = 4 if backend == "triton" else 10
    ref = batched_kmeans(x.float(), 3, iters=iters, backend=backend)
    for given in (x, x.numpy(), x[0].numpy()):
        got = batched_kmeans(given, 3, iters=iters, backend=backend)
        single = given.ndim == 2
        expect = KMeansResult(*(t[0] for t in ref)) if single else ref
        assert got.centroids.dtype == torch.float64
        assert torch.equal(got.centroids, expect.centroids.double())
        assert torch.equal(got.labels, expect.labels) and torch.equal(got.n_iter, expect.n_iter)
        if not single:  # (one problem alone draws its seeds from another generator state)
            assert torch.equal(got.inertia, expect.inertia)


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@pytest.mark.parametrize("scale", [2.0**600, 2.0**-600])
def test_float64_beyond_float32_range_is_rescaled_before_rounding(backend, scale):
    # float64 values no float32 can hold (1e180, 1e-180): scaled by a power of two in float64, then rounded,
    # so the clustering is that of the unscaled problem and the centres come back at the input's scale.
    x = blobs(2, 30, 4, 3, seed=37).double()
    init = x[:, :3].clone()
    plain = batched_kmeans(x, 3, init=init, iters=5, backend=backend)
    big = batched_kmeans(x * scale, 3, init=init * scale, iters=5, backend=backend)
    assert torch.equal(big.labels, plain.labels) and torch.equal(big.n_iter, plain.n_iter)
    assert torch.isfinite(big.centroids).all() and (big.centroids != 0).any()
    torch.testing.assert_close(big.centroids / scale, plain.centroids, rtol=1e-6, atol=0)


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
        ((_X, 2), {"random_state": 1.5}, "random_state must be an int"),
        ((_X, 2), {"random_state": 2**64}, "random_state must lie in"),
        ((_X, 2), {"n_local_trials": 0}, "n_local_trials must be >= 1"),
        ((_X, 2), {"n_local_trials": 2.0}, "n_local_trials must be an int"),
        ((_X, 2), {"n_local_trials": 6}, "n_local_trials must be <= the number of points"),
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


_CUDA_MARKS = next(d for d in DEVICES if not isinstance(d, str)).marks


@pytest.mark.parametrize("device, backend", [
    pytest.param("cpu", "cpp" if "cpp" in BACKENDS else "torch", id="cpu"),
    pytest.param("cuda", "triton", id="cuda-triton", marks=_CUDA_MARKS),  # interpreted: far too slow at this D
])
def test_long_dot_products_keep_float64_labels_regression(device, backend):
    # Regression: with D = 65,536 (StreamChat frames) a single 65,536-term
    # float32 accumulation per dot product moved near-boundary frames of one
    # problem in 16 to another cluster, and the C++ kernel settled in a worse
    # fixed point than scikit-learn in float64.  Blocked float32 partial sums
    # added in float64 (C++) or with Kahan compensation (Triton) keep the labels.
    sklearn_cluster = pytest.importorskip("sklearn.cluster")
    _require(device, backend)
    B, N, D, k = 16, 40, 65536, 5
    g = torch.Generator().manual_seed(0)
    steps = 0.3 * torch.randn(B, N, D, generator=g)
    steps[:, 0] = torch.randn(B, D, generator=g)
    x = steps.cumsum(dim=1)  # video-like drifting frame features
    init = initial_centres(x, k, "k-means++", torch.ones(B, N), torch.full((B,), N), 0, False)
    res = batched_kmeans(x.to(device), k, init=init.to(device), tol=0.0, backend=backend)
    for b in range(B):
        km = sklearn_cluster.KMeans(k, init=init[b].double().numpy(), n_init=1, max_iter=10, tol=0.0,
                                    algorithm="lloyd").fit(x[b].double().numpy())
        np.testing.assert_array_equal(res.labels[b].cpu().numpy(), km.labels_)
        assert int(res.n_iter[b]) == km.n_iter_


@pytest.mark.skipif(not HAS_TRITON, reason="Triton unavailable")
def test_triton_assignment_compensates_long_dot_products():
    # The Triton assignment adds its per-tile float32 dots with Kahan compensation.  Points placed
    # at a distance 1e-3..1e-2 (in score) from the bisector of two centres, on features ~1 (so the
    # D = 8192 dots are ~8192): the float64 argmin is the ground truth.  Plain float32 sums of the
    # same 64-feature tiles flip some of them (checked below: the case can fail); the kernel's do not.
    from streammem_kernels.kmeans import _triton as kt

    D, N = 8192, 64
    g = torch.Generator().manual_seed(2)
    c = 1 + 0.01 * torch.randn(2, D, generator=g, dtype=torch.float64)
    axis = c[0] - c[1]
    eps = torch.logspace(-3, -2, N, dtype=torch.float64) * torch.where(torch.rand(N, generator=g) < 0.5, -1.0, 1.0)
    x = (((c[0] + c[1]) / 2)[None] + eps[:, None] * axis[None] / (axis @ axis)).float()[None]
    c = c.float()[None]
    csq = (c.double() ** 2).sum(-1)
    exact = (csq[:, None, :] - 2 * torch.bmm(x.double(), c.double().transpose(1, 2))).argmin(-1)
    plain = torch.zeros(1, N, 2)
    for d0 in range(0, D, kt.ASSIGN_BLOCK_D_ALIGNED):
        plain = plain + torch.bmm(x[:, :, d0:d0 + kt.ASSIGN_BLOCK_D_ALIGNED],
                                  c[:, :, d0:d0 + kt.ASSIGN_BLOCK_D_ALIGNED].transpose(1, 2))
    assert ((csq[:, None, :] - 2 * plain.double()).argmin(-1) != exact).sum() >= 5
    labels = torch.full((1, N), -1, dtype=torch.int64)
    kt._assign(x, c, csq, torch.tensor([N]), torch.ones(1, dtype=torch.int32), labels, False)
    assert torch.equal(labels, exact)


# --------------------------------------------------------------------------
# GPU path: no host synchronisation, CUDA-graph capture, 64-bit offsets
# --------------------------------------------------------------------------
@pytest.mark.host_sync
@pytest.mark.skipif(not HAS_TRITON, reason="Triton unavailable")
@pytest.mark.parametrize("metric", ["l2", "cosine"])
def test_triton_path_never_synchronises_with_the_host(monkeypatch, metric):
    # The Triton backend runs inside a mode that raises on any tensor-to-host conversion (.item(),
    # bool(tensor), nonzero, boolean-mask indexing...): its Lloyd loop, convergence mask, re-seeding
    # and inertia stay on the device.  Ragged lengths, weights, empty clusters and early stops included.
    guard_backend(monkeypatch, LLOYD, "triton")
    x = blobs(3, 20, 6, 3, seed=70)
    x[1, 10:] = x[1, 0]  # duplicates: empty clusters get re-seeded
    init = x[:, :4].clone()
    init[0, 3] = 40.0  # a centre far from every point: empty at the first step
    lengths = torch.tensor([20, 20, 13])
    weights = torch.rand(3, 20, generator=torch.Generator().manual_seed(71)) + 0.1
    res = batched_kmeans(x, 4, init=init, lengths=lengths, weights=weights, iters=3, metric=metric,
                         backend="triton")
    ref = batched_kmeans(x, 4, init=init, lengths=lengths, weights=weights, iters=3, metric=metric, backend="torch")
    atol, rtol = LLOYD.tolerance("triton", x.dtype)
    assert_same_result(res, ref, atol=atol, rtol=rtol)
    frames = kmeans_frames(x.reshape(3, 20, 2, 3), 3, init="first", iters=2, metric=metric, backend="triton")
    assert frames.centroids.shape == (3, 3, 2, 3)


@pytest.mark.host_sync
def test_host_sync_guard_catches_the_reference_loop(monkeypatch):
    # The guard of the test above can fail: the reference's host loop (torch.nonzero per iteration)
    # trips it.
    guard_backend(monkeypatch, LLOYD, "torch")
    with pytest.raises(HostSync):
        batched_kmeans(blobs(2, 10, 3, 2, seed=72), 2, iters=2, backend="torch")


def _graph_case(device, metric):
    x = blobs(3, 50, 24, 4, seed=73).to(device)
    x[1, 30:] = x[1, 0]  # duplicates: the re-seeding path runs inside the graph too
    init = x[:, :5].clone()
    init[0, 4] = 40.0
    lengths = torch.tensor([50, 50, 37], device=device)
    weights = (torch.rand(3, 50, generator=torch.Generator().manual_seed(74)) + 0.1).to(device)
    return x, init, lengths, weights


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("metric", ["l2", "cosine"])
def test_cuda_graph_capture(metric):
    # Both public functions capture in a CUDA graph (the initial centres given: k-means++ and
    # "random" draw from a generator, whose replay would not repeat the eager draws) and a replay
    # reproduces the eager result bit for bit.
    x, init, lengths, weights = _graph_case("cuda", metric)
    eager, replayed = capture_in_cuda_graph(
        lambda: batched_kmeans(x, 5, init=init, lengths=lengths, weights=weights, iters=6, metric=metric,
                               backend="triton"))
    for a, b in zip(eager, replayed):
        assert torch.equal(a, b)
    ref = batched_kmeans(x.cpu(), 5, init=init.cpu(), lengths=lengths.cpu(), weights=weights.cpu(), iters=6,
                         metric=metric, backend="torch")
    atol, rtol = LLOYD.tolerance("triton", x.dtype)
    assert_same_result(KMeansResult(*replayed), ref, atol=atol, rtol=rtol)
    frames = x.reshape(3, 50, 4, 6)
    eager, replayed = capture_in_cuda_graph(lambda: kmeans_frames(frames, 3, init="first", iters=3, metric=metric,
                                                                  backend="triton"))
    for a, b in zip(eager, replayed):
        assert torch.equal(a, b)


@pytest.mark.skipif(not HAS_TRITON, reason="Triton unavailable")
def test_triton_offsets_are_64_bit():
    # Regression: offsets computed as rows[:, None] * D in int32 overflow once one problem holds
    # N * D >= 2^31 elements.  The kernels take the points' row stride, so strided views of an
    # untouched 8 GB allocation (virtual memory only: a few rows are touched) put rows 2^31
    # elements apart; every kernel that reads points (assign, sums, distances, re-seeding) runs on
    # them.  An int32 offset reads 8 GB before the allocation: the run dies of a segmentation
    # fault, whose faulthandler traceback names this test.
    from streammem_kernels.kmeans._triton import lloyd_triton

    try:
        base = torch.empty(2**31 + 64, dtype=torch.float32)
    except RuntimeError:  # no overcommit: the address space is not available
        pytest.skip("cannot reserve 8 GB of virtual memory")
    g = torch.Generator().manual_seed(0)
    views = [
        base.as_strided((1, 3, 16), (3 * 2**30, 2**30, 1)),  # rows 0, 2^30, 2^31: row * stride overflows int32
        base[32:].as_strided((3, 1, 16), (2**30, 2**30, 1)),  # problem 2 at 2^31: b * N * stride overflows
    ]
    for x in views:
        x.copy_(torch.randn(x.shape, generator=g))
        B, N, D = x.shape
        k = min(N, 2)
        init = x[:, :k].clone()
        if k == 2:
            x[0, 2] += 10.0  # the farthest point from centre 0 (row 0): row 2, at 8 GB
            init[:, 1] = 100.0  # an empty cluster, re-seeded with that point
        weights, lengths = torch.ones(B, N), torch.full((B,), N)
        got = lloyd_triton(x, weights, lengths, init, torch.zeros(B, dtype=torch.float64), 1, False)
        ref = lloyd_loop(x.contiguous(), weights, lengths, init, 0.0, 1, False)
        assert torch.equal(got[1], ref[1]) and torch.equal(got[3], ref[3])
        torch.testing.assert_close(got[0], ref[0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(got[2], ref[2], rtol=1e-6, atol=1e-6)
        if k == 2:
            assert torch.equal(got[0][0, 1], x[0, 2])  # the point at 2^31 elements became a centre
    del views, base


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
def test_cuda_problem_larger_than_2_31_elements():
    # The real thing where the GPU has the memory: one problem of 32,769 frames x 65,536 features
    # (8.6 GB, N * D > 2^31) through the public function.
    free, _ = torch.cuda.mem_get_info()
    if free < 24 * 2**30:
        pytest.skip("needs 24 GB of free GPU memory")
    N, D = 2**15 + 1, 2**16
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(1, N, D, device="cuda", generator=g)
    x[0, -100:] += 5.0  # the last rows (past 2^31 elements) form their own cluster
    init = torch.stack([x[0, 0], x[0, -1]])[None].clone()
    res = batched_kmeans(x, 2, init=init, iters=2, tol=0.0, backend="triton")
    ref = batched_kmeans(x, 2, init=init, iters=2, tol=0.0, backend="torch")
    assert torch.equal(res.labels, ref.labels)
    assert (res.labels[0, -100:] == 1).all()
    torch.testing.assert_close(res.centroids, ref.centroids, atol=5e-5, rtol=1e-5)
