"""Batched k-means vs faiss, scikit-learn and fast-pytorch-kmeans (regimes a, b, c), and the KMeans estimator
vs scikit-learn's.

Run:  .venv/bin/python -m pytest bench/bench_kmeans.py --benchmark-json bench/results/kmeans.json
Table: .venv/bin/python bench/bench_kmeans.py bench/results/kmeans.json

Regimes (B problems of N points in D dims, k centres, at most 10 Lloyd iterations):
  (a) StreamChat frames   B=16,   N=40,     D=65,536, k=5
  (b) token clustering    B=8,    N=16,384, D=128,    k=256
  (c) many tiny problems  B=4,096, N=64,    D=64,     k=8
``STREAMMEM_BENCH_QUICK=1`` shrinks B (and N or D) so the file runs in about a minute.

Every provider gets the same float32 data and the same initial centres (our
shared k-means++ with seed 0).  Ours and scikit-learn use tol=0: a problem
stops only when an iteration changes nothing (its labels are a fixed point, so
later iterations would be no-ops); faiss always runs its 10 iterations;
fast-pytorch-kmeans (MultiKMeans) stops when the summed shift of all problems
is 0.  ``extra_info`` holds the iterations actually run and the final inertia
of each provider's centres, evaluated by one shared float64 evaluator
(every point to its nearest returned centre).

Scaling (``kmeans-vs-<axis>-<value>`` groups): time per call as one of B, N, D
grows while the others stay at B=64, N=256, D=64 (k=8, Gaussian blobs), ours
(auto) next to the faiss loop and fast-pytorch-kmeans on the same data.

The estimator (``kmeans-estimator-<case>`` groups): ``streammem_kernels.KMeans`` against scikit-learn's
``KMeans`` on the same float64 numpy blobs (numpy's default dtype, what a scikit-learn user passes) with
the same ``n_init``, ``max_iter=300`` and ``tol=1e-4``, each from its own k-means++ seeding
(``random_state=0``): one problem of 20,000 points, and a batch of 64 problems (ours: one batched fit;
scikit-learn: a loop).  ``extra_info`` holds each side's own reported inertia (summed over problems),
the mean iterations and ``recovered``, the problems whose generating clusters were found exactly.

In a GPU run (``STREAMMEM_BENCH_DEVICE=cuda``, bench/_device.py) the
``kmeans-gpu-<regime>`` groups time ours (auto, triton, and triton replayed
from a CUDA graph) and fast-pytorch-kmeans on CUDA tensors, and the faiss loop
on the GPU when faiss has GPU support; the
``kmeans-gpu-after-convergence-<regime>`` groups time the Triton backend with
``iters`` equal to the iterations needed and with 20 more (masked iterations
after convergence), eagerly and from a CUDA graph.
"""
import json
import os
import sys

import numpy as np
import pytest
import torch

from bench._device import faiss_gpu_resources, gpu_params, require_gpu, synced
from streammem_kernels import KMeans, batched_kmeans
from streammem_kernels.kmeans import assign_torch, distance_to_own_centre, initial_centres, select_backend

QUICK = os.environ.get("STREAMMEM_BENCH_QUICK") == "1"
ITERS = 10
REGIMES = {
    "a-frames": dict(B=4 if QUICK else 16, N=40, D=16384 if QUICK else 65536, k=5),
    "b-tokens": dict(B=2 if QUICK else 8, N=4096 if QUICK else 16384, D=128, k=256),
    "c-tiny": dict(B=512 if QUICK else 4096, N=64, D=64, k=8),
}


def make_data(name, B, N, D, k):
    g = torch.Generator().manual_seed(0)
    if name.startswith("a"):
        # Video-like: consecutive frame features drift (a random walk per chunk).
        steps = 0.3 * torch.randn(B, N, D, generator=g)
        steps[:, 0] = torch.randn(B, D, generator=g)
        x = steps.cumsum(dim=1)
    else:
        # Overlapping Gaussian blobs (as many as centres), unit spread.
        means = torch.randn(B, k, D, generator=g)
        which = torch.randint(0, k, (B, N), generator=g)
        x = torch.gather(means, 1, which[..., None].expand(B, N, D)) + torch.randn(B, N, D, generator=g)
    x = x.contiguous()
    init = initial_centres(x, k, "k-means++", torch.ones(B, N), torch.full((B,), N), 0, False)
    return x, init


@pytest.fixture(scope="module", params=list(REGIMES), ids=list(REGIMES))
def regime(request):
    name = request.param
    p = REGIMES[name]
    x, init = make_data(name, **p)
    return name, p, x, init


def evaluate_inertia(x, centres):
    """Total over problems of sum_i min_j ||x_i - c_j||^2 (float64)."""
    centres = torch.as_tensor(centres, dtype=torch.float32)
    valid = torch.ones(x.shape[:2], dtype=torch.bool)
    labels = assign_torch(x, centres, valid, False)
    return float(distance_to_own_centre(x, centres, labels, False).sum())


def _run(benchmark, name, p, fn, provider, rounds):
    benchmark.group = f"kmeans-{name}"
    out = {}

    def call():
        out["centres"], out["n_iter"] = fn()

    benchmark.pedantic(call, rounds=rounds, iterations=1, warmup_rounds=1 if rounds > 1 else 0)
    benchmark.extra_info.update(provider=provider, problems=p["B"], N=p["N"], D=p["D"], k=p["k"], max_iters=ITERS,
                                mean_iters=float(np.mean(out["n_iter"])), quick=QUICK,
                                torch_threads=torch.get_num_threads())
    return out


def _record_inertia(benchmark, x, out):
    benchmark.extra_info["inertia"] = evaluate_inertia(x, out["centres"])


def _ours(backend):
    def run(x, init, k):
        res = batched_kmeans(x, k, init=init, iters=ITERS, tol=0.0, backend=backend)
        return res.centroids, res.n_iter.cpu().numpy()

    return run


@pytest.mark.parametrize("backend", ["auto", "cpp", "torch"])
def test_ours(benchmark, regime, backend):
    name, p, x, init = regime
    chosen = select_backend(backend, x, p["k"])
    rounds = 1 if (backend == "torch" and not QUICK) else 3
    out = _run(benchmark, name, p, lambda: _ours(backend)(x, init, p["k"]), f"ours-{backend}", rounds)
    benchmark.extra_info["backend_used"] = chosen
    _record_inertia(benchmark, x, out)


def test_faiss_loop(benchmark, regime):
    faiss = pytest.importorskip("faiss")
    name, p, x, init = regime
    xs, inits = x.numpy(), init.numpy()
    out = _run(benchmark, name, p, lambda: _faiss_loop(faiss, xs, inits, p), "faiss-loop", 1 if not QUICK else 2)
    _record_inertia(benchmark, x, out)


def test_sklearn_loop(benchmark, regime):
    cluster = pytest.importorskip("sklearn.cluster")
    name, p, x, init = regime
    xs, inits = x.numpy(), init.numpy()

    def run():
        centres = np.empty_like(inits)
        n_iter = []
        for b in range(p["B"]):
            km = cluster.KMeans(p["k"], init=inits[b], n_init=1, max_iter=ITERS, tol=0.0, algorithm="lloyd")
            km.fit(xs[b])
            centres[b] = km.cluster_centers_
            n_iter.append(km.n_iter_)
        return centres, n_iter

    out = _run(benchmark, name, p, run, "sklearn-loop", 1)
    _record_inertia(benchmark, x, out)


def test_fast_pytorch_kmeans(benchmark, regime):
    fpk = pytest.importorskip("fast_pytorch_kmeans")
    name, p, x, init = regime

    out = _run(benchmark, name, p, lambda: _fpk(fpk, x, init, p), "fast-pytorch-kmeans", 1 if not QUICK else 2)
    _record_inertia(benchmark, x, out)


# --------------------------------------------------------------------------
# Scaling: time per call against B, N and D
# --------------------------------------------------------------------------
SCALE_BASE = dict(B=64, N=256, D=64, k=8)
SCALE_AXES = {
    "B": (16, 64, 256) if QUICK else (16, 64, 256, 1024),
    "N": (64, 256, 1024) if QUICK else (64, 256, 1024, 4096),
    "D": (16, 64, 256) if QUICK else (16, 64, 256, 1024),
}
SCALE_CASES = [(axis, value) for axis, values in SCALE_AXES.items() for value in values]


@pytest.fixture(scope="module", params=SCALE_CASES, ids=[f"{a}{v}" for a, v in SCALE_CASES])
def scale_case(request):
    axis, value = request.param
    p = dict(SCALE_BASE, **{axis: value})
    x, init = make_data("scale", **p)
    return axis, value, p, x, init


def _scale_run(benchmark, scale_case, fn, provider):
    axis, value, p, x, init = scale_case
    benchmark.group = f"kmeans-vs-{axis}-{value}"
    out = {}

    def call():
        out["centres"], out["n_iter"] = fn(x, init, p)

    call()  # warm-up, also checks the provider runs at this size
    rounds = 3 if p["B"] * p["N"] * p["D"] <= 64 * 1024 * 256 else 2
    benchmark.pedantic(call, rounds=rounds, iterations=1)
    benchmark.extra_info.update(provider=provider, scale=axis, problems=p["B"], B=p["B"], N=p["N"], D=p["D"],
                                k=p["k"], plot_per="call", mean_iters=float(np.mean(out["n_iter"])))
    _record_inertia(benchmark, x, out)


def _fpk(fpk, x, init, p):
    km = fpk.MultiKMeans(p["k"], max_iter=ITERS, tol=0.0)
    km.fit_predict(x, centroids=init.clone())
    return km.centroids, [ITERS] * p["B"]  # it reports no per-problem count


def test_scale_ours(benchmark, scale_case):
    _scale_run(benchmark, scale_case, lambda x, init, p: _ours("auto")(x, init, p["k"]), "ours-auto")


def _faiss_loop(faiss, xs, inits, p, gpu=False):
    centres = np.empty_like(inits)
    for b in range(p["B"]):
        km = faiss.Kmeans(p["D"], p["k"], niter=ITERS, nredo=1, seed=0, min_points_per_centroid=1,
                          max_points_per_centroid=p["N"], gpu=gpu)  # no subsampling
        km.train(xs[b], init_centroids=inits[b])
        centres[b] = km.centroids
    return centres, [ITERS] * p["B"]


def test_scale_faiss_loop(benchmark, scale_case):
    faiss = pytest.importorskip("faiss")
    _scale_run(benchmark, scale_case, lambda x, init, p: _faiss_loop(faiss, x.numpy(), init.numpy(), p),
               "faiss-loop")


def test_scale_fast_pytorch_kmeans(benchmark, scale_case):
    fpk = pytest.importorskip("fast_pytorch_kmeans")
    _scale_run(benchmark, scale_case, lambda x, init, p: _fpk(fpk, x, init, p), "fast-pytorch-kmeans")


# --------------------------------------------------------------------------
# The estimator: KMeans vs scikit-learn's KMeans (same data, n_init, max_iter, tol)
# --------------------------------------------------------------------------
ESTIMATOR_CASES = {
    "one-n_init1": dict(B=1, N=4000 if QUICK else 20_000, D=16, k=16, n_init=1),
    "one-n_init10": dict(B=1, N=4000 if QUICK else 20_000, D=16, k=16, n_init=10),
    "batch-n_init3": dict(B=16 if QUICK else 64, N=256, D=32, k=8, n_init=3),
}


@pytest.fixture(scope="module", params=list(ESTIMATOR_CASES), ids=list(ESTIMATOR_CASES))
def estimator_case(request):
    """Float64 numpy blobs (B, N, D), uniform centres in [-10, 10]^D, unit spread, and the generating labels."""
    p = ESTIMATOR_CASES[request.param]
    rng = np.random.default_rng(0)
    centres = rng.uniform(-10.0, 10.0, (p["B"], p["k"], p["D"]))
    truth = rng.integers(0, p["k"], (p["B"], p["N"]))
    x = np.take_along_axis(centres, truth[..., None], axis=1) + rng.standard_normal((p["B"], p["N"], p["D"]))
    return request.param, p, x, truth


def _recovered(truth, labels) -> int:
    """Problems whose labels are the generating partition (a bijection between the two label sets)."""
    return sum(len(set(zip(t.tolist(), lab.tolist()))) == len(set(t.tolist())) == len(set(lab.tolist()))
               for t, lab in zip(truth, labels))


def _estimator_run(benchmark, case, fit, provider):
    name, p, x, truth = case
    benchmark.group = f"kmeans-estimator-{name}"
    out = {}

    def call():
        out["labels"], out["inertia"], out["n_iter"] = fit(x, p)

    rounds = 1 if p["n_init"] >= 10 and not QUICK else 3
    benchmark.pedantic(call, rounds=rounds, iterations=1, warmup_rounds=1 if rounds > 1 else 0)
    benchmark.extra_info.update(provider=provider, problems=p["B"], N=p["N"], D=p["D"], k=p["k"], n_init=p["n_init"],
                                max_iters=300, mean_iters=float(np.mean(out["n_iter"])),
                                inertia=float(np.sum(out["inertia"])), recovered=_recovered(truth, out["labels"]),
                                quick=QUICK, torch_threads=torch.get_num_threads())


def test_estimator_ours(benchmark, estimator_case):
    def fit(x, p):
        km = KMeans(p["k"], n_init=p["n_init"], random_state=0).fit(x[0] if p["B"] == 1 else x)
        labels = km.labels_[None] if p["B"] == 1 else km.labels_
        return labels, np.atleast_1d(km.inertia_), np.atleast_1d(km.n_iter_)

    _estimator_run(benchmark, estimator_case, fit, "ours-KMeans")


def test_estimator_sklearn(benchmark, estimator_case):
    cluster = pytest.importorskip("sklearn.cluster")

    def fit(x, p):
        fits = [cluster.KMeans(p["k"], n_init=p["n_init"], random_state=0).fit(problem) for problem in x]
        return (np.stack([f.labels_ for f in fits]), np.array([f.inertia_ for f in fits]),
                np.array([f.n_iter_ for f in fits]))

    _estimator_run(benchmark, estimator_case, fit, "sklearn-KMeans")


# --------------------------------------------------------------------------
# GPU: the regimes on CUDA tensors (GPU runs only)
# --------------------------------------------------------------------------
def _graphed(call):
    """Capture ``call()`` (a batched_kmeans call on CUDA tensors) in a CUDA graph; return a replay that
    gives (centres, n_iter) like ``_ours``.  The Triton backend is device-resident, so it captures."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()  # compiles the kernels outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        res = call()

    def replay():
        graph.replay()
        torch.cuda.synchronize()
        return res.centroids, res.n_iter.cpu().numpy()

    return replay


@pytest.mark.parametrize("provider", gpu_params("ours-auto", "ours-triton", "ours-triton-graph",
                                                "fast-pytorch-kmeans", "faiss-gpu-loop"))
def test_gpu(benchmark, regime, provider):
    device = require_gpu()
    name, p, x, init = regime
    xg, initg = x.to(device), init.to(device)
    if provider == "ours-triton-graph":  # one CUDA-graph replay per call: no per-launch host overhead
        fn = _graphed(lambda: batched_kmeans(xg, p["k"], init=initg, iters=ITERS, tol=0.0, backend="triton"))
    elif provider.startswith("ours"):
        backend = provider.split("-", 1)[1]
        fn = synced(lambda: _ours(backend)(xg, initg, p["k"]), device)
    elif provider == "fast-pytorch-kmeans":
        fpk = pytest.importorskip("fast_pytorch_kmeans")
        fn = synced(lambda: _fpk(fpk, xg, initg, p), device)
    else:
        faiss = pytest.importorskip("faiss")
        if faiss_gpu_resources() is None:
            pytest.skip("the installed faiss has no GPU support (faiss-cpu); install faiss-gpu for this peer")
        xs, inits = x.numpy(), init.numpy()
        fn = lambda: _faiss_loop(faiss, xs, inits, p, gpu=True)  # noqa: E731
    fn()  # compile / warm up
    out = _run(benchmark, f"gpu-{name}", p, fn, provider + "-gpu", 3)
    out["centres"] = torch.as_tensor(out["centres"]).cpu()
    _record_inertia(benchmark, x, out)


# Iterations after convergence: the Triton loop has no host-side early exit (it would synchronise),
# so a batch that has converged still launches 5 kernels per iteration up to `iters`, whose
# programs exit at once.  Same data and result, `iters` = the iterations needed vs 20 more.
@pytest.mark.parametrize("provider", gpu_params("eager-needed", "eager-plus-20", "graph-needed", "graph-plus-20"))
def test_gpu_iterations_after_convergence(benchmark, regime, provider):
    device = require_gpu()
    name, p, x, init = regime
    xg, initg = x.to(device), init.to(device)
    needed = int(batched_kmeans(xg, p["k"], init=initg, iters=ITERS, tol=0.0, backend="triton").n_iter.max())
    iters = needed + (20 if provider.endswith("plus-20") else 0)

    def call():
        return batched_kmeans(xg, p["k"], init=initg, iters=iters, tol=0.0, backend="triton")

    if provider.startswith("graph"):
        fn = _graphed(call)
    else:
        fn = synced(lambda: (lambda r: (r.centroids, r.n_iter.cpu().numpy()))(call()), device)
    fn()
    _run(benchmark, f"gpu-after-convergence-{name}", p, fn, f"triton-{provider}", 5)
    benchmark.extra_info.update(iters_cap=iters, iters_needed=needed)


def markdown_table(path):
    """Rows per regime: provider, backend, mean s, problems/s, point-iterations/s, ratio to ours-auto, inertia."""
    with open(path) as f:
        data = json.load(f)
    rows = {}
    for bench in data["benchmarks"]:
        info = bench["extra_info"]
        rows.setdefault(bench["group"], []).append((info, bench["stats"]))
    lines = []
    for group in sorted(rows):
        entries = rows[group]
        # Ratios against ours-auto, or against the first entry in groups without it.
        ours = next((s["mean"] for i, s in entries if i["provider"] == "ours-auto"), entries[0][1]["mean"])
        info0 = entries[0][0]
        n_init = f", n_init={info0['n_init']}" if "n_init" in info0 else ""
        recovered = "recovered" in info0
        lines.append(f"\n**{group}** (B={info0['problems']}, N={info0['N']}, D={info0['D']}, k={info0['k']}"
                     f"{n_init}, max {info0['max_iters']} iterations)\n")
        lines.append("| provider | mean s (rounds) | problems/s | mean iterations | point-iterations/s "
                     "| time / ours-auto | final inertia |" + (" problems recovered |" if recovered else ""))
        lines.append("|---|---|---|---|---|---|---|" + ("---|" if recovered else ""))
        for info, s in sorted(entries, key=lambda e: e[1]["mean"]):
            name = info["provider"] + (f" ({info['backend_used']})" if "backend_used" in info else "")
            pits = info["problems"] * info["N"] * info["mean_iters"] / s["mean"]
            lines.append(f"| {name} | {s['mean']:.3f} ({s['rounds']}) | {info['problems'] / s['mean']:.1f} "
                         f"| {info['mean_iters']:.2f} | {pits:.3g} | {s['mean'] / ours:.2f}x "
                         f"| {info['inertia']:.6g} |" + (f" {info['recovered']} |" if recovered else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table(sys.argv[1] if len(sys.argv) > 1 else "bench/results/kmeans.json"))
