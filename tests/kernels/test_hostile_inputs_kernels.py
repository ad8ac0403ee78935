"""Hostile-input regressions for the boundaries, k-means, log-probs and graph ops: each test is named after
the hostile input that crashed, hung, answered silently wrong or raised an unclear error.

Calls that could abort or hang the process if the fix regressed run in a subprocess with a timeout.
"""
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

import streammem_kernels as sk
from tests.support.device_checks import cpu_backends
from streammem_kernels import boundaries, graph, kmeans, logprobs

SEG_BACKENDS = cpu_backends(boundaries.ADJACENT_COSINE)
KM_BACKENDS = cpu_backends(kmeans.LLOYD)


def run_isolated(code: str, timeout: float = 120.0) -> str:
    """Run ``code`` in a fresh interpreter; fail (not hang, not die) on a signal, a timeout or an error."""
    try:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"timed out after {timeout} s; output so far:\n{exc.stdout}")
    assert done.returncode == 0, f"exit status {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    return done.stdout


# ---------------------------------------------------------------------------------------------------------
# Absurd sizes: rejected with a ValueError naming the argument, before anything is allocated
# ---------------------------------------------------------------------------------------------------------
def test_absurd_sizes_raise_value_error_before_allocating_in_a_subprocess():
    out = run_isolated("""
        import torch, streammem_kernels as sk
        x = torch.randn(30, 4)
        g = sk.CSRGraph.from_edges(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]), 3)
        cases = {
            "window": lambda: sk.StreamingSegmenter(window=10**9, backend="cpp").push(torch.randn(4)),
            "window ": lambda: sk.detect_boundaries(x, window=2**40, backend="cpp"),
            "k": lambda: sk.batched_kmeans(torch.randn(2, 50, 8), 10**9, lengths=torch.tensor([50, 50])),
            "iters": lambda: sk.batched_kmeans(x, 3, iters=2**40, backend="triton"),
            "random_state": lambda: sk.batched_kmeans(x, 3, random_state=2**70),
        }
        for arg, call in cases.items():
            print("start", arg, flush=True)
            try:
                call()
                print("no error", arg)
            except ValueError as exc:
                assert arg.strip() in str(exc), (arg, str(exc))
                print("ValueError", arg)
        # Huge but harmless: clamped, same answer as the largest meaningful value, no pybind overflow.
        for b in ("torch", "cpp"):
            assert torch.equal(sk.khop_neighbourhood(g, torch.tensor([[0]]), hops=2**40, capacity=4, backend=b).nodes,
                               sk.khop_neighbourhood(g, torch.tensor([[0]]), hops=3, capacity=4, backend=b).nodes)
        n = len(sk.detect_boundaries(x, max_event=2**70, backend="cpp"))
        assert n == len(sk.detect_boundaries(x, backend="cpp")), n
        print("clamped ok")
    """)
    assert out.count("ValueError") == 5 and "no error" not in out and "clamped ok" in out, out


# ---------------------------------------------------------------------------------------------------------
# Meta tensors and requires_grad inputs
# ---------------------------------------------------------------------------------------------------------
META_CALLS = {
    "features": lambda m: sk.detect_boundaries(m((20, 4))),
    "x": lambda m: sk.batched_kmeans(m((2, 10, 3)), 2),
    "logits": lambda m: sk.token_logprobs(m((3, 5)), torch.tensor([1, 2, 3])),
    "logprobs": lambda m: sk.divergence_point(m((30,))),
    "row_ptr": lambda m: sk.CSRGraph(m((3,), torch.int64), torch.tensor([0, 1])),
}


@pytest.mark.parametrize("arg", list(META_CALLS))
def test_meta_tensors_are_refused_with_a_value_error_naming_the_argument(arg):
    def meta(shape, dtype=torch.float32):
        return torch.empty(shape, dtype=dtype, device="meta")

    with pytest.raises(ValueError, match=f"{arg} must hold data .*meta tensor"):
        META_CALLS[arg](meta)


def test_requires_grad_inputs_are_supported_and_outputs_never_require_grad():
    x = torch.randn(20, 4, requires_grad=True)
    assert not sk.adjacent_cosine(x).requires_grad
    assert torch.equal(sk.event_ends(x), sk.event_ends(x.detach()))
    res = sk.batched_kmeans(torch.randn(2, 10, 3, requires_grad=True), 2)
    assert not any(t.requires_grad for t in res)
    lp = sk.token_logprobs(torch.randn(3, 5, requires_grad=True), torch.tensor([1, 2, 3]))
    assert not lp.requires_grad


# ---------------------------------------------------------------------------------------------------------
# Boundaries
# ---------------------------------------------------------------------------------------------------------
def _clip_with_cuts(scale: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    scenes = torch.randn(3, 8, generator=g).repeat_interleave(7, dim=0)
    return (scenes + 0.05 * torch.randn(21, 8, generator=g)) * scale


@pytest.mark.parametrize("scale", [1e20, 1e-30, 3e37])
def test_streaming_segmentation_of_huge_and_tiny_features_gives_the_events_of_unit_features(scale):
    """|features| ~ 1e20 gave 1 event on Triton where torch/cpp gave 4."""
    expected = sk.detect_boundaries(_clip_with_cuts(1.0), window=4, backend="torch")
    assert [e.end for e in expected] == [6, 13, 20]
    x = _clip_with_cuts(scale)
    for backend in SEG_BACKENDS:
        assert sk.detect_boundaries(x, window=4, backend=backend) == expected, backend
        seg = sk.StreamingSegmenter(window=4, backend=backend)
        events = [e for frame in x for e in seg.push(frame)] + seg.flush()
        assert events == expected, backend


def test_window_above_the_bound_is_rejected_by_every_entry_point():
    with pytest.raises(ValueError, match="window must be <= 65536"):
        sk.StreamingSegmenter(window=boundaries.MAX_WINDOW + 1)
    with pytest.raises(ValueError, match="window must be <= 65536"):
        sk.event_ends(torch.randn(5, 3), window=boundaries.MAX_WINDOW + 1)
    sk.StreamingSegmenter(window=boundaries.MAX_WINDOW)  # the bound itself is allowed


def test_native_step_refuses_an_unbounded_window_before_allocating():
    mod, _ = boundaries.load_native("cpu", "boundaries")
    if mod is None:
        pytest.skip("C++ backend not built")
    from streammem_kernels.runtime.native import view

    # A caller's broken promise (the public functions bound the window first): refused before any scratch.
    with pytest.raises(RuntimeError, match=r"window must lie in \[2, 65536\]"):
        mod.window_choices(view(torch.zeros((1, 4))), 10**9, 0.7, 0.2, 0, view(torch.empty((1, 0), dtype=torch.int64)))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "0.5", True])
def test_non_finite_or_non_numeric_thresholds_are_rejected(bad):
    with pytest.raises(ValueError, match="tau must be"):
        sk.StreamingSegmenter(tau=bad)
    with pytest.raises(ValueError, match="alpha must be"):
        sk.divergence_point(torch.randn(30), alpha=bad)


# ---------------------------------------------------------------------------------------------------------
# k-means
# ---------------------------------------------------------------------------------------------------------
def _blobs(scale: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    x = torch.rand(2, 40, 4, generator=g) * 2 - 1
    x[:, :20] += 3
    return (x * scale).float()


@pytest.mark.parametrize("metric", ["l2", "cosine"])
@pytest.mark.parametrize("scale", [3.0e38 / 4.5, 1e38 / 4.5, 1e-30])
@pytest.mark.parametrize("init", ["k-means++", "first"])
def test_kmeans_near_float32_max_or_tiny_is_finite_and_scale_equivariant_on_every_backend(metric, scale, init):
    """Near float32 max inertia was inf (Triton: NaN/inf centres) and k-means++ raised 'probability tensor
    contains inf'; clustering is now done at an exact power-of-two scale."""
    unit = sk.batched_kmeans(_blobs(1.0), 3, init=init, metric=metric, iters=4, backend="torch")
    for backend in KM_BACKENDS:
        res = sk.batched_kmeans(_blobs(scale), 3, init=init, metric=metric, iters=4, backend=backend)
        assert torch.isfinite(res.centroids).all() and torch.isfinite(res.inertia).all(), backend
        assert torch.equal(res.labels, unit.labels), backend
        atol, rtol = kmeans.LLOYD.tolerance(backend, torch.float32)
        if metric == "cosine":
            torch.testing.assert_close(res.centroids, unit.centroids, atol=atol, rtol=rtol)
            torch.testing.assert_close(res.inertia, unit.inertia, atol=1e-5, rtol=rtol)
        else:  # scale is not a power of two: equal up to the rounding of x * scale
            torch.testing.assert_close(res.centroids.double() / scale, unit.centroids.double(), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(res.inertia / scale**2, unit.inertia, atol=0, rtol=1e-4)


@pytest.mark.parametrize("scale", [3.0e38 / 4.5, 1e38 / 4.5])
def test_kmeans_one_cluster_near_float32_max_equals_the_reference_on_every_backend(scale):
    """k = 1 at |x| ~ 1e38: the Triton centre sums overflowed where the reference stays finite."""
    x = _blobs(scale)
    want = sk.batched_kmeans(x, 1, init="first", iters=4, backend="torch")
    assert torch.isfinite(want.centroids).all() and torch.isfinite(want.inertia).all()
    for backend in KM_BACKENDS:
        res = sk.batched_kmeans(x, 1, init="first", iters=4, backend=backend)
        assert torch.equal(res.labels, want.labels), backend
        atol, rtol = kmeans.LLOYD.tolerance(backend, torch.float32)
        torch.testing.assert_close(res.centroids, want.centroids, atol=atol, rtol=rtol)
        torch.testing.assert_close(res.inertia, want.inertia, atol=0, rtol=1e-4)


def test_kmeans_inputs_inside_the_scale_range_are_not_rescaled():
    x = _blobs(1.0)
    points, *_ = kmeans._prepare(x, 3, 10, 1e-4, "l2", None, None)
    assert kmeans._power_of_two_scale(kmeans._largest_magnitude(points)) is None  # host decision on CPU
    scale = kmeans._power_of_two_scale(kmeans._largest_magnitude(points * 2.0**60))
    assert torch.equal(scale, torch.full((2,), 2.0**-62))
    tiny_and_plain = kmeans._power_of_two_scale(kmeans._largest_magnitude(torch.stack((points[0] * 1e-30, points[1]))))
    assert tiny_and_plain[1] == 1 and tiny_and_plain[0] > 2.0**90


def test_kmeans_huge_weights_give_the_unweighted_clustering():
    x = _blobs(1.0)
    plain = sk.batched_kmeans(x, 3, init="first", backend="torch")
    for backend in KM_BACKENDS:
        res = sk.batched_kmeans(x, 3, init="first", weights=torch.full((2, 40), 3e38), backend=backend)
        assert torch.equal(res.labels, plain.labels), backend
        assert torch.isfinite(res.inertia).all() and torch.isfinite(res.centroids).all()
        torch.testing.assert_close(res.inertia / 3e38, plain.inertia, atol=0, rtol=1e-4)


def test_kmeans_complex_weights_are_rejected():
    with pytest.raises(ValueError, match="weights must be real"):
        sk.batched_kmeans(torch.randn(2, 10, 3), 2, weights=torch.ones(2, 10, dtype=torch.complex64))


def test_kmeans_k_above_n_is_rejected_on_the_host_even_with_lengths():
    with pytest.raises(ValueError, match="k must be <="):
        sk.batched_kmeans(torch.randn(2, 10, 3), 10**9, lengths=torch.tensor([10, 10]))


# ---------------------------------------------------------------------------------------------------------
# Log-probs and prefix reuse
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("targets", [torch.tensor([True, False, True]), [True, False, True],
                                     torch.tensor([1, 2, 3], dtype=torch.uint64), torch.tensor([1.0, 2.0, 3.0])])
def test_token_ids_of_the_wrong_dtype_are_rejected(targets):
    with pytest.raises(ValueError, match="targets must have dtype"):
        sk.token_logprobs(torch.randn(3, 5), targets)


@pytest.mark.parametrize("arg,value", [("delta", 2**40), ("delta", 2**63 + 5)])
def test_ints_beyond_int32_never_reach_pybind(arg, value):
    """Ints >= 2**31 gave pybind 'incompatible function arguments' (a TypeError)."""
    lp = torch.randn(30, dtype=torch.float64)
    for backend in cpu_backends(logprobs.DIVERGENCE_POINT):
        out = sk.divergence_point(lp, **{arg: value}, backend=backend)
        assert int(out) == int(sk.divergence_point(lp, delta=30, backend="torch")), backend


# ---------------------------------------------------------------------------------------------------------
# Graph: hostile CSR inputs
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("row_ptr,col_idx,match", [
    ([0, 2, 1, 3], [0, 1, 2], "non-decreasing"),
    ([0, -1, 1], [0], "non-decreasing"),
    ([0, 2**40], [0], "start at 0 and end"),
    ([1, 2], [0], "start at 0 and end"),
    ([0.0, 1.0], [0], "row_ptr must have dtype"),
    ([[0, 1]], [0], "row_ptr must have shape"),
    ([0, 1], [True], "col_idx must have dtype"),
    ([0, 1], [5], r"col_idx must hold ids in \[0, num_cols=1\)"),
    ([0, 1], [-1], r"col_idx must hold ids"),
    (torch.zeros(0, dtype=torch.int64), [], "row_ptr must have shape"),
])
def test_csr_graph_rejects_hostile_arrays(row_ptr, col_idx, match):
    with pytest.raises(ValueError, match=match):
        sk.CSRGraph(row_ptr, col_idx)


def test_csr_graph_rejects_absurd_num_cols():
    with pytest.raises(ValueError, match="fewer than 2"):
        sk.CSRGraph([0, 1], [0], num_cols=2**40)
    with pytest.raises(ValueError, match="num_cols must be"):
        sk.CSRGraph([0, 1], [0], num_cols=-1)


# ---------------------------------------------------------------------------------------------------------
# Threads: interpreted Triton launches are serialised (_dispatch.call_op)
# ---------------------------------------------------------------------------------------------------------
def test_eight_threads_running_triton_ops_at_once_get_the_single_threaded_answers():
    if "triton" not in SEG_BACKENDS:
        pytest.skip("Triton backend unavailable")
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(3, 17, 8, generator=g)
    logits, targets = torch.randn(2, 9, 33, generator=g), torch.randint(0, 33, (2, 9), generator=g)
    graph_ = sk.CSRGraph.from_edges(torch.randint(0, 12, (30,), generator=g), torch.randint(0, 12, (30,), generator=g),
                                    12)
    seeds = torch.tensor([[0, 5], [3, -1]])
    points = torch.randn(2, 12, 3, generator=g)
    calls = [
        lambda: sk.adjacent_cosine(feats, backend="triton"),
        lambda: sk.event_ends(feats, window=4, min_depth=0.0, backend="triton"),
        lambda: sk.token_logprobs(logits, targets, backend="triton"),
        lambda: sk.khop_neighbourhood(graph_, seeds, hops=2, capacity=8, backend="triton").nodes,
        lambda: sk.batched_kmeans(points, 3, init="first", iters=2, backend="triton").labels,
    ]
    expected = [call() for call in calls]
    failures: list[str] = []

    def worker(index: int) -> None:
        for round_ in range(2):
            which = (index + round_) % len(calls)
            try:
                got = calls[which]()
                if not torch.equal(got, expected[which]):
                    failures.append(f"thread {index}: call {which} differs")
            except Exception as exc:  # noqa: BLE001 -- any error in a thread is a failure to report
                failures.append(f"thread {index}: call {which} raised {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not failures, failures
