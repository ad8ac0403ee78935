"""Batched k-means: B independent (optionally weighted, ragged) clustering problems in one call.

StreamChat compresses each chunk of frame features into cluster centres (sec. 3.1.1, Eq. 3 and 5);
ProStream merges near-duplicate memory nodes.  Every backend starts Lloyd's iterations from the same
centres (scikit-learn's greedy k-means++, random, first k or given, computed in torch) and follows the
torch reference (``reference.py``); ``docs/ops/kmeans.md`` states the semantics (the seeding,
assignment ties, empty clusters, the stop rule, the inertia) and the numerics of each backend.
``KMeans`` (``estimator.py``) is the scikit-learn-shaped estimator built on ``batched_kmeans``.

Backends: ``torch`` (batched bmm, chunked), ``cpp`` (one fused assign + accumulate pass per
iteration), ``triton`` (device-resident, no host synchronisation: capturable in a CUDA graph with
given centres or ``init="first"``).  Labels and ``n_iter`` are identical on every backend; centres and
inertia agree within each backend's declared tolerance (``LLOYD.tolerances``).
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import numpy as np
import torch

from ..runtime.dispatch import Op, call_op, load_native
from ..runtime.native import NativeChecks, view
from ..runtime.validate import (as_tensor, check_dtype, check_finite, check_float, check_int, check_rank, check_values,
                                cpu_fast_path, host_checks, sized_message)
from .reference import default_local_trials, kmeans_plus_plus, lloyd_torch, shift_thresholds
# Read here by bench/bench_kmeans.py and by the estimator.
from .reference import assign_torch, distance_to_own_centre  # noqa: F401

__all__ = ["KMeansResult", "batched_kmeans", "kmeans_frames", "lloyd"]

# Clustered in float32 whatever the dtype (float64: rounded once, after the power-of-two scale below).
_POINT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_METRICS = ("l2", "cosine")
_INITS = ("k-means++", "random", "first")
# Lloyd iterations are a real cap: the GPU path launches every iteration up to it (no host-read early exit).
MAX_ITERS = 10_000
# A problem whose largest |x| (or weight) lies outside [2**-40, 2**40] is clustered at a power-of-two scale
# that brings it into [0.5, 1): squared distances and weighted sums then neither overflow float32 (|x| near
# float32 max gave inf inertia and, on Triton, NaN centres) nor underflow (|x| ~ 1e-30 made every distance 0).
# Multiplying by a power of two is exact, so labels and centres are those of the unscaled problem wherever
# that one is computable; inside the range nothing is scaled and results are unchanged bit for bit.  float64
# input is scaled in float64 before it is rounded to float32, so values beyond float32's range come in too.
_SCALE_RANGE = (2.0 ** -40, 2.0 ** 40)
# Exponents of the scale 2**e each working dtype holds exactly (float32: subnormal-only problems scale up by
# 2**126 at most).
_SCALE_EXPONENTS = {torch.float32: (-128, 126), torch.float64: (-1024, 1023)}
# The latency path draws the seeding's noise up front (B x N + (k - 1) x B x trials float64): at most 32 MB.
_FAST_NOISE_LIMIT = 1 << 22
# Each value-check message once: the general path raises it from Python, the C++ seeding by status.
_X_NOT_FINITE = "x must be finite, found NaN or Inf"


class KMeansResult(NamedTuple):
    """Result of ``batched_kmeans`` for B problems (for an ``(N, D)`` input, one problem without the
    batch dimension: ``centroids (k, D)``, ``labels (N,)``, 0-d ``inertia`` and ``n_iter``).

    Attributes
    ----------
    centroids : (B, k, D) float32, or float64 for float64 input
        Final centres (unit-norm for ``metric="cosine"``).  Computed in
        float32 whatever the input dtype; float64 input gets them widened
        (and back at its own scale, so values beyond float32's range stay
        finite).
    labels : (B, N) int64
        Index of each point's centre (consistent with ``centroids``); -1 for the
        points past ``lengths[b]``.
    inertia : (B,) float64
        Weighted sum of squared distances (cosine: of ``1 - x.c``) of each
        problem's points to their centres; float64 so that it is finite for
        every finite input (points near float32 max have squared distances far
        beyond it).
    n_iter : (B,) int64
        Lloyd iterations run by each problem (1..iters).
    """

    centroids: torch.Tensor
    labels: torch.Tensor
    inertia: torch.Tensor
    n_iter: torch.Tensor


# --------------------------------------------------------------------------
# Public functions: contract, validation, preparation
# --------------------------------------------------------------------------
def batched_kmeans(x, k: int, *, iters: int = 10, tol: float = 1e-4, init="k-means++", n_local_trials=None,
                   metric: str = "l2", weights=None, lengths=None, random_state: int = 0,
                   backend: str = "auto") -> KMeansResult:
    """Lloyd k-means on B independent problems at once.

    Parameters
    ----------
    x : (B, N, D) or (N, D) tensor or array
        Points, float32, float16, bfloat16 or float64 (every dtype is
        clustered in float32; float64 is rounded once, see Notes).  A 2-d
        input is one problem and the result has no batch dimension.  Not
        modified.
    k : int
        Clusters per problem, ``1 <= k <= lengths[b]`` for every b.
    iters : int
        Maximum Lloyd iterations, ``1 <= iters <= 10,000`` (scikit-learn's
        ``max_iter``; a real cap: the GPU path launches every iteration up to
        it).
    tol : float
        Per-problem stop: total squared centre shift ``<= tol`` x the mean
        per-feature variance of that problem's points (scikit-learn's rule);
        ``n_iter`` reports the iterations run.
    init : {"k-means++", "random", "first"} or (B, k, D) tensor
        Initial centres: scikit-learn's greedy k-means++ (``n_local_trials``
        candidates per step drawn by D^2 sampling, the one lowering the
        potential most kept), k distinct points drawn uniformly, the first k
        points, or given centres ((k, D) for a 2-d ``x``).
    n_local_trials : int, optional
        Candidates per k-means++ step, ``1 <= n_local_trials <= N`` (drawn
        with replacement); default ``2 + floor(ln k)`` (scikit-learn's).  1 is
        the standard (non-greedy) D^2 sampling.
    metric : {"l2", "cosine"}
        Squared Euclidean, or spherical k-means (points and centres
        L2-normalised, assignment by largest dot product).
    weights : (B, N) or (N,) tensor or array, optional
        Non-negative point weights (weighted means and inertia); each problem
        needs a positive total weight.
    lengths : (B,) integer tensor, optional
        Problem b uses its first ``lengths[b]`` points (1..N); the others get
        label -1.
    random_state : int
        Seed, in ``[-2**63, 2**64)``, of the ``torch.Generator`` that the
        "k-means++" and "random" initialisations draw from (on the device of
        ``x``): the same seed gives the same centres.
    backend : {"auto", "torch", "cpp", "triton", "cuda"}

    Returns
    -------
    KMeansResult
        ``centroids (B, k, D)`` float32 (float64 for float64 ``x``),
        ``labels (B, N)`` int64, ``inertia (B,)`` float64, ``n_iter (B,)``
        int64; without the batch dimension for a 2-d ``x``.

    Raises
    ------
    ValueError
        Naming the argument: a shape, dtype or range outside the above, NaN or
        Inf in ``x``, ``weights`` or ``init``.

    Notes
    -----
    float64 input is rounded to float32 (after the scale below): labels and
    centres are those of the float32-rounded points, so points whose
    distances to two centres differ by less than float32 rounding may be
    assigned otherwise than a float64 computation (scikit-learn's) would.
    Problems whose largest magnitude (or weight) lies outside
    ``[2**-40, 2**40]`` are clustered at an exact power-of-two scale, so
    inputs near float32 max or tiny ones give finite centres and inertia on
    every backend.  Inputs that require grad are accepted (outputs never
    require grad); meta tensors are refused.
    """
    fast = LLOYD.run_fast(backend, x, k, iters, tol, init, n_local_trials, metric, weights, lengths, random_state)
    if fast is not None:
        return fast
    p = _prepare_scaled(x, k, iters, tol, metric, weights, lengths)
    # Input the latency path declined only for its form (float64, half precision, numpy, strided, out of the
    # scale range) takes it once prepared: the same native seeding and Lloyd, on the rounded, rescaled points.
    native = None if weights is not None or lengths is not None else LLOYD.run_fast(
        backend, p.points, p.k, p.iters, p.tol, init, n_local_trials, metric, None, None, random_state)
    if native is not None:
        centroids, labels, inertia, n_iter = native
    else:
        centres = initial_centres(p.points, p.k, init, p.weights, p.lengths, random_state, p.cosine,
                                  scale=p.x_scale, n_local_trials=n_local_trials)
        name = select_backend(backend, p.points, p.k)
        centroids, labels, inertia, n_iter = call_op(torch.ops.streammem.lloyd, LLOYD.impls, name, p.points,
                                                     p.weights, p.lengths, centres, p.tol, p.iters, p.cosine)
    inertia = inertia.double()
    if p.x_scale is not None:
        inertia = inertia / p.x_scale.double() ** 2
        centroids = centroids.double() / p.x_scale.double()[:, None, None]
    if p.w_scale is not None:
        inertia = inertia / p.w_scale.double()
    centroids = centroids.to(torch.float64 if p.dtype == torch.float64 else torch.float32)
    if p.single:
        return KMeansResult(centroids[0], labels[0], inertia[0], n_iter[0])
    return KMeansResult(centroids, labels, inertia, n_iter)


def _largest_magnitude(t: torch.Tensor) -> torch.Tensor | list[float]:
    """Largest ``|t[b]|`` of each problem (NaN if it holds one): two reductions, no temporary.  A list of
    floats for CPU tensors, a (B,) float32 (float64 for float64 ``t``) tensor otherwise (and while
    torch.compile traces)."""
    flat = t.reshape(t.shape[0], -1)
    low, high = flat.amin(dim=1), flat.amax(dim=1)
    if host_checks(t):
        return [max(-a, b) if a == a and b == b else math.nan for a, b in zip(low.tolist(), high.tolist())]
    return torch.maximum(-low, high).to(torch.float64 if t.dtype == torch.float64 else torch.float32)


def _power_of_two_scale(amax: torch.Tensor | list[float], work: torch.dtype = torch.float32) -> torch.Tensor | None:
    """(B,) ``work``-dtype (float32 or float64): ``2**-e`` bringing each problem's largest magnitude ``amax``
    into [0.5, 1) when it lies outside ``_SCALE_RANGE``, else 1.  ``None`` when no problem needs it, decided
    on the host for CPU tensors only (free there); on CUDA always a tensor (no synchronisation)."""
    low, high = _SCALE_RANGE
    if isinstance(amax, list):  # CPU: decided on the host
        if all(low <= v <= high or v == 0 for v in amax):
            return None
        amax = torch.tensor(amax, dtype=work)
    amax = amax.to(work)
    outside = (amax > high) | ((amax < low) & (amax > 0))
    _, exponent = torch.frexp(amax)  # amax = m * 2**exponent, m in [0.5, 1)
    # Clamped to the exponents the working dtype holds exactly.
    scale = torch.ldexp(torch.ones_like(amax), (-exponent).clamp(*_SCALE_EXPONENTS[work]))
    return torch.where(outside, scale, torch.ones_like(amax))


def _working_dtype(t: torch.Tensor) -> torch.dtype:
    """float64 for float64 ``t`` (scaled before it is rounded), float32 for every other dtype."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _scaled_float32(t: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """Contiguous float32 ``t * scale`` per problem (``scale`` None: 1), the product formed in ``t``'s working
    dtype: exact (a power of two), then rounded once to float32."""
    work = _working_dtype(t)
    t = t.to(work)
    if scale is not None:
        t = t * scale.to(device=t.device, dtype=work).reshape((-1,) + (1,) * (t.dim() - 1))
    return t.to(torch.float32).contiguous()


def kmeans_frames(frames, k: int, **kwargs) -> KMeansResult:
    """Cluster whole frames: each frame (its P x D tokens, or its D features) is one point.

    Parameters
    ----------
    frames : (B, L, P, D), (B, L, D) or (L, D) tensor or array
        B chunks of L frames of P tokens of D features (StreamChat: P pooled
        tokens per frame), or of one D-feature vector per frame; (L, D) is one
        chunk.  Any dtype ``batched_kmeans`` takes.
    k : int
        Centre frames per chunk.
    **kwargs
        Passed to ``batched_kmeans`` (iters, tol, init as (B, k, P, D) or
        (B, k, P*D) for 4-d frames, (B, k, D) or (k, D) otherwise,
        n_local_trials, metric, weights (B, L) or (L,), lengths (B,),
        random_state, backend).

    Returns
    -------
    KMeansResult
        ``centroids`` are centre frames in the dtype of ``frames`` (computed
        in float32): ``(B, k, P, D)``, ``(B, k, D)`` or ``(k, D)``; ``labels``
        ``(B, L)`` (``(L,)`` for 2-d frames); ``inertia`` and ``n_iter`` as
        ``batched_kmeans``.

    Raises
    ------
    ValueError
        ``frames`` of another rank, and everything ``batched_kmeans`` raises.
    """
    frames = as_tensor(frames, "frames")
    check_rank(frames, "frames", (2, 3, 4), "(B, L, P, D), (B, L, D) or (L, D)")
    check_dtype(frames, "frames", _POINT_DTYPES)
    points = frames
    if frames.dim() == 4:
        B, L, P, D = frames.shape
        init = kwargs.get("init", "k-means++")
        if isinstance(init, torch.Tensor) and init.dim() == 4:
            kwargs["init"] = init.reshape(init.shape[0], init.shape[1], -1)
        points = frames.reshape(B, L, P * D)
    res = batched_kmeans(points, k, **kwargs)
    centroids = res.centroids.reshape(res.centroids.shape[:-1] + frames.shape[2:-1] + frames.shape[-1:])
    return KMeansResult(centroids.to(frames.dtype), res.labels, res.inertia, res.n_iter)


def select_backend(backend: str, points: torch.Tensor, k: int) -> str:
    """Backend ``batched_kmeans`` would use for prepared ``points (B, N, D)``."""
    _, N, D = points.shape
    return LLOYD.select(backend, points.device, n_points=N, k=k, dim=D)


class _Prepared(NamedTuple):
    """``batched_kmeans``' validated input: float32 contiguous (B, N, D) points, float32 (B, N) weights,
    int64 (B,) lengths, the checked scalars, the power-of-two scales applied to the points (l2) and weights
    (None: unscaled), whether ``x`` was one (N, D) problem, and its dtype."""

    points: torch.Tensor
    weights: torch.Tensor
    lengths: torch.Tensor
    k: int
    iters: int
    tol: float
    cosine: bool
    x_scale: torch.Tensor | None
    w_scale: torch.Tensor | None
    single: bool
    dtype: torch.dtype


def _prepare(x, k, iters, tol, metric, weights, lengths):
    """Validate; return float32 contiguous (B,N,D) points, float32 (B,N) weights, int64 (B,) lengths."""
    return tuple(_prepare_scaled(x, k, iters, tol, metric, weights, lengths))[:7]


def _prepare_scaled(x, k, iters, tol, metric, weights, lengths) -> _Prepared:
    """``_prepare``, plus the scales, whether ``x`` was 2-d and its dtype."""
    x = as_tensor(x, "x")
    check_rank(x, "x", (2, 3), "(B, N, D) or (N, D)")
    check_dtype(x, "x", _POINT_DTYPES)
    single = x.dim() == 2
    if single:
        x = x.unsqueeze(0)
    B, N, D = x.shape
    if D == 0:
        raise ValueError(f"x must have at least one feature (D >= 1), got shape {tuple(x.shape)}")
    if N == 0 or B == 0:
        raise ValueError(f"x must hold at least one problem with one point, got shape {tuple(x.shape)}")
    # Per-problem extremes decide finiteness (min and max propagate NaN and expose +-Inf, as in
    # check_finite) and the power-of-two scale.
    x_amax = _largest_magnitude(x)
    if isinstance(x_amax, list):  # plain floats on the host: the common small call stays cheap
        if not all(math.isfinite(v) for v in x_amax):
            raise ValueError(_X_NOT_FINITE)
    else:
        check_values(torch.isfinite(x_amax).all(), _X_NOT_FINITE)
    k = check_int(k, "k", minimum=1)
    if k > N:  # a host check before anything of size k is allocated (lengths <= N, so it always holds)
        raise ValueError(f"k must be <= the number of points of every problem ({N}), got k={k}")
    iters = check_int(iters, "iters", minimum=1)
    if iters > MAX_ITERS:
        raise ValueError(f"iters must be <= {MAX_ITERS}, got {iters}")
    tol = check_float(tol, "tol", low=0.0)
    if metric not in _METRICS:
        raise ValueError(f"metric must be one of {_METRICS}, got {metric!r}")
    cosine = metric == "cosine"

    if lengths is None:
        lengths_t = torch.full((B,), N, dtype=torch.int64, device=x.device)
    else:
        lengths_t = as_tensor(lengths, "lengths")
        if lengths_t.dim() == 0 and single:
            lengths_t = lengths_t.reshape(1)
        check_rank(lengths_t, "lengths", (1,), "(B,)")
        if lengths_t.is_floating_point() or lengths_t.is_complex() or lengths_t.dtype == torch.bool:
            raise ValueError(f"lengths must be an integer tensor, got dtype {lengths_t.dtype}")
        if lengths_t.shape[0] != B:
            raise ValueError(f"lengths must have shape (B,) = ({B},), got {tuple(lengths_t.shape)}")
        lengths_t = lengths_t.to(device=x.device, dtype=torch.int64)
        # Value checks: on the host for CPU tensors, device-side assertions on CUDA (no synchronisation).
        shortest, longest = torch.aminmax(lengths_t)
        check_values((shortest >= 1) & (longest <= N), sized_message("lengths must lie in [1, N={N}]", N=N))
        check_values(shortest >= k, f"k must be <= the number of points of every problem (lengths), got k={k}")

    x_scale = _power_of_two_scale(x_amax, _working_dtype(x))
    points = _scaled_float32(x, x_scale)
    if cosine:  # normalised at a power-of-two scale: the norms of huge or tiny points neither overflow nor vanish
        points, x_scale = torch.nn.functional.normalize(points, dim=-1).contiguous(), None
    valid = torch.arange(N, device=x.device)[None, :] < lengths_t[:, None]

    if weights is None:
        point_weights, w_scale = torch.ones((B, N), dtype=torch.float32, device=x.device), None
    else:
        w = as_tensor(weights, "weights")
        if single and w.dim() == 1:
            w = w.unsqueeze(0)
        if tuple(w.shape) != (B, N):
            raise ValueError(f"weights must have shape (B, N) = ({B}, {N}), got {tuple(w.shape)}")
        if w.is_complex():
            raise ValueError(f"weights must be real, got dtype {str(w.dtype).replace('torch.', '')}")
        if not w.is_floating_point():
            w = w.to(torch.float32)
        check_finite(w, "weights")
        w = w.to(device=x.device)
        check_values((w >= 0).all(), "weights must be non-negative, found a negative weight")
        check_values(((w * valid).sum(dim=1) > 0).all(),
                     "weights must have a positive sum over the points of every problem")
        w_scale = _power_of_two_scale(_largest_magnitude(w), _working_dtype(w))
        point_weights = _scaled_float32(w, w_scale)
    return _Prepared(points, point_weights, lengths_t, k, iters, tol, cosine, x_scale, w_scale, single, x.dtype)


# --------------------------------------------------------------------------
# Initialisation (shared by every backend)
# --------------------------------------------------------------------------
def initial_centres(points, k, init, weights, lengths, random_state, cosine, scale=None,
                    n_local_trials=None) -> torch.Tensor:
    """(B, k, D) float32 starting centres for prepared points (B, N, D); given centres are multiplied by
    ``scale`` ((B,), the points' power-of-two scale) when it is passed."""
    B, N, D = points.shape
    if n_local_trials is not None:
        n_local_trials = check_int(n_local_trials, "n_local_trials", minimum=1)
        if n_local_trials > N:  # drawn with replacement: more candidates than points only repeat them
            raise ValueError(f"n_local_trials must be <= the number of points ({N}), got {n_local_trials}")
    valid = torch.arange(N, device=points.device)[None, :] < lengths[:, None]
    if isinstance(init, str):
        if init not in _INITS:
            raise ValueError(f"init must be one of {_INITS} or a (B, k, D) tensor, got {init!r}")
        random_state = check_int(random_state, "random_state")
        if not -(1 << 63) <= random_state < (1 << 64):
            raise ValueError(f"random_state must lie in [-2**63, 2**64) (a torch.Generator seed), got {random_state}")
        if init == "first":
            return points[:, :k].clone()
        if torch.compiler.is_compiling():  # a traced graph cannot make a torch.Generator: the draws run in an op
            signed = random_state - (1 << 64) if random_state >= (1 << 63) else random_state  # manual_seed's bits
            return torch.ops.streammem.kmeans_init(points, weights, lengths, k, init, signed, cosine, n_local_trials)
        generator = torch.Generator(device=points.device)
        generator.manual_seed(random_state)
        if init == "random":
            keys = torch.rand((B, N), generator=generator, device=points.device)
            keys = keys.masked_fill(~valid, 2.0)
            chosen = keys.argsort(dim=1, stable=True)[:, :k]
            return torch.gather(points, 1, chosen[..., None].expand(B, k, D)).contiguous()
        trials = default_local_trials(k) if n_local_trials is None else n_local_trials
        return kmeans_plus_plus(points, k, weights * valid, generator, cosine, trials)
    init_t = as_tensor(init, "init")
    if init_t.dim() == 2 and B == 1:
        init_t = init_t.unsqueeze(0)
    if tuple(init_t.shape) != (B, k, D):
        raise ValueError(f"init must have shape (B, k, D) = ({B}, {k}, {D}), got {tuple(init_t.shape)}")
    if not init_t.is_floating_point():
        raise ValueError(f"init must be a floating tensor, got dtype {init_t.dtype}")
    check_finite(init_t, "init")
    centres = _scaled_float32(init_t.to(points.device), scale)
    if cosine:
        centres = torch.nn.functional.normalize(centres, dim=-1)
    return centres.contiguous()


# --------------------------------------------------------------------------
# Custom op (works under torch.compile; opcheck-tested)
# --------------------------------------------------------------------------
@torch.library.custom_op("streammem::lloyd", mutates_args=())
def lloyd(points: torch.Tensor, weights: torch.Tensor, lengths: torch.Tensor, centres: torch.Tensor,
          tol: float, iters: int, cosine: bool, backend: str
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch.ops.streammem.lloyd`` (its schema: docs/compile.md).

    Core op on prepared input.

    points (B,N,D) float32 contiguous (unit rows for cosine), weights (B,N)
    float32, lengths (B,) int64, centres (B,k,D) float32 initial centres, tol
    relative shift threshold (x each problem's mean feature variance).  Returns (centroids (B,k,D) float32,
    labels (B,N) int64, inertia (B,) float32, n_iter (B,) int64).
    """
    return LLOYD.impls[backend](points, weights, lengths, centres, tol, iters, cosine)


@lloyd.register_fake
def _(points, weights, lengths, centres, tol, iters, cosine, backend):
    B, N, _ = points.shape
    return (
        torch.empty_like(centres),
        points.new_empty((B, N), dtype=torch.int64),
        points.new_empty((B,), dtype=torch.float32),
        points.new_empty((B,), dtype=torch.int64),
    )


@torch.library.custom_op("streammem::kmeans_init", mutates_args=())
def kmeans_init(points: torch.Tensor, weights: torch.Tensor, lengths: torch.Tensor, k: int, init: str,
                random_state: int, cosine: bool, n_local_trials: Optional[int]) -> torch.Tensor:
    """``torch.ops.streammem.kmeans_init`` (its schema: docs/compile.md).

    The drawn initialisations of :func:`initial_centres` ("k-means++", "random"), which torch.compile
    cannot trace (a ``torch.Generator`` is made per call): prepared points (B, N, D) float32, weights
    (B, N) float32, lengths (B,) int64, ``random_state`` as a signed int64 (the generator keeps its 64
    bits), ``n_local_trials`` None for the default.  Returns the (B, k, D) float32 centres, the same as an
    eager call draws."""
    return initial_centres(points, k, init, weights, lengths, random_state, cosine, n_local_trials=n_local_trials)


@kmeans_init.register_fake
def _(points, weights, lengths, k, init, random_state, cosine, n_local_trials):
    return points.new_empty((points.shape[0], k, points.shape[2]))


# --------------------------------------------------------------------------
# Backend: C++ (csrc/cpu/kmeans.cpp), and batched_kmeans' latency path
# --------------------------------------------------------------------------
_NO_CHECKS = NativeChecks()
# The checks of lloyd's k-means++ seeding (batched_kmeans' latency path), by status.
_SEED_CHECKS = NativeChecks(_X_NOT_FINITE)
_NEEDS_RESCALING = 2  # a problem outside _SCALE_RANGE: not an error, the general path rescales it


def _lloyd_cpp(points, weights, lengths, centres, tol, iters, cosine):
    mod, _ = load_native("cpu", "kmeans")
    B, N, _ = points.shape
    centroids = centres.clone(memory_format=torch.contiguous_format)  # the entry updates it in place
    labels = torch.empty((B, N), dtype=torch.int64)
    inertia = torch.empty(B, dtype=torch.float32)
    n_iter = torch.empty(B, dtype=torch.int64)
    status = mod.lloyd(view(points.contiguous()), view(weights.contiguous()), view(lengths.contiguous()),
                       view(centroids), -1, 0, float(tol), int(iters), bool(cosine), view(labels), view(inertia),
                       view(n_iter))
    _NO_CHECKS.raise_for(status)
    return centroids, labels, inertia, n_iter


_from_numpy, _np_empty, _new_tuple = torch.from_numpy, np.empty, tuple.__new__
_NP_F32, _NP_F64, _NP_I64 = np.float32, np.float64, np.int64
_INF = math.inf
_default_trials = default_local_trials


def _kmeans_pp_fast(mod, x, k, iters, tol, init, n_local_trials, metric, weights, lengths,
                    random_state) -> KMeansResult | None:
    """batched_kmeans' common small CPU call: unweighted l2 greedy k-means++ on C-contiguous float32 points
    with plain parameters in range, in one call of the C++ backend's ``lloyd`` entry, which seeds the
    centres and checks the points first (the same ValueError).  The seeding draws the reference's
    generator stream (the same mt19937 draws as ``torch.multinomial`` and ``torch.rand``) and computes D^2
    from direct differences, so its picks are the reference's except where the reference's float32
    ``||x||^2 - 2 x.c + ||c||^2`` rounding decides (near-ties, duplicates of a chosen centre).  None for
    anything else, and for points that need the power-of-two rescaling (the general path does it)."""
    if not (weights is None and lengths is None and type(init) is str and init == "k-means++" and metric == "l2"
            and type(k) is int and type(iters) is int and type(tol) is float and type(random_state) is int
            and cpu_fast_path(x)):
        return None
    shape = x.shape
    if len(shape) == 3:
        B, N, D = shape
    elif len(shape) == 2:
        (N, D), B = shape, 1
    else:
        return None
    if n_local_trials is None:
        trials = _default_trials(k) if k >= 1 else 0
    elif type(n_local_trials) is int and n_local_trials <= shape[-2]:
        trials = n_local_trials
    else:
        return None
    if not (B >= 1 and D >= 1 and 1 <= k <= N and 1 <= trials and 1 <= iters <= MAX_ITERS and 0.0 <= tol < _INF
            and -(1 << 63) <= random_state < (1 << 64) and B * (N + (k - 1) * trials) <= _FAST_NOISE_LIMIT):
        return None
    # Results allocated through numpy, whose arrays speak DLPack too (cheaper than tensors and their views);
    # for (N, D) points, without the batch dimension (the entry takes (k, D) centres and B-element outputs).
    if len(shape) == 3:
        centroids, labels = _np_empty((B, k, D), _NP_F32), _np_empty((B, N), _NP_I64)
        inertia, n_iter = _np_empty(B, _NP_F64), _np_empty(B, _NP_I64)
    else:
        centroids, labels = _np_empty((k, D), _NP_F32), _np_empty(N, _NP_I64)
        inertia, n_iter = _np_empty((), _NP_F64), _np_empty((), _NP_I64)
    status = mod.lloyd(view(x), None, None, centroids.__dlpack__(), random_state & 0xFFFFFFFF,  # manual_seed: 32 bits
                       trials, tol, iters, False, labels.__dlpack__(), inertia.__dlpack__(), n_iter.__dlpack__())
    if status:
        if status == _NEEDS_RESCALING:
            return None
        _SEED_CHECKS.raise_for(status)
    return _new_tuple(KMeansResult, (_from_numpy(centroids), _from_numpy(labels), _from_numpy(inertia),
                                     _from_numpy(n_iter)))


# --------------------------------------------------------------------------
# Backend: Triton
# --------------------------------------------------------------------------
def _lloyd_triton(points, weights, lengths, centres, tol, iters, cosine):
    from ._triton import lloyd_triton

    return lloyd_triton(points, weights, lengths, centres, shift_thresholds(points, lengths, tol), iters, cosine)


# (atol, rtol) of each backend's centres and inertia against the torch reference on the CPU, per input
# dtype (every dtype is clustered in float32, so they agree); labels and n_iter must be identical.
# torch: on CUDA, cuBLAS orders the dot products differently.  cpp: float64 sums like the reference.
# triton: float32 centre sums (one rounding per point added, in a fixed order).
_TOLERANCES = {"torch": (1e-5, 1e-5), "cpp": (1e-5, 1e-5), "triton": (5e-5, 1e-5)}

LLOYD = Op(
    "kmeans",
    {"torch": lloyd_torch, "cpp": _lloyd_cpp, "triton": _lloyd_triton},
    tolerances={backend: dict.fromkeys(_POINT_DTYPES, tol) for backend, tol in _TOLERANCES.items()},
    fast=_kmeans_pp_fast,
)
