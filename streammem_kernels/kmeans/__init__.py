"""Batched k-means: many independent clustering problems in one call.

StreamChat's long-term memory compresses each chunk of L frame features into C
cluster centres and compresses again when g nodes merge into a parent (sec.
3.1.1, Eq. 3 and 5); ProStream merges near-duplicate memory nodes.  This module
solves B independent (optionally weighted, ragged) k-means problems at once.

Semantics shared by every backend (the torch reference below is the spec):

* Initialisation is computed once, here, in torch (``init="k-means++"``:
  standard D^2 sampling, one candidate per step, probabilities ``w * D^2``,
  drawn with a ``torch.Generator`` seeded by ``seed``; ``"random"``: k distinct
  points; ``"first"``: the first k points; or given centres).  Every backend
  starts its Lloyd iterations from the same centres.  The CPU fast path (unweighted
  ``l2`` ``k-means++`` on float32 C-contiguous points, ``_kmeans_pp_fast``) seeds
  in C++ on the same generator stream (torch's CPU mt19937 exponential noise of
  ``torch.multinomial``, reproduced bit for bit), with D^2 in float64.
* One Lloyd iteration: assign every point to its nearest centre (``l2``:
  smallest ``||c||^2 - 2 x.c``, the constant ``||x||^2`` dropped; ``cosine``:
  largest ``x.c`` on L2-normalised points; ties go to the lowest centre index),
  then move each centre to the weighted mean of its points (``cosine``: the
  normalised weighted sum).  Centre sums are accumulated in float64 (the Triton
  backend: float32, in a fixed order).
* Empty cluster (total weight 0, or for ``cosine`` a zero summed direction):
  re-seeded with the point farthest from the centre it was assigned to in that
  iteration (distance accumulated in float64: ``||x - c||^2``, or
  ``1 - x.c`` for cosine); several empty clusters of one problem take the
  farthest points in decreasing distance (ties: lowest point index), in
  increasing cluster order, each point at most once.  This is scikit-learn's
  rule, except that the chosen point is not removed from its previous cluster's
  mean for that iteration.
* Problem b stops after ``iters`` iterations, or as soon as the total squared
  centre shift of that iteration is ``<= tol * mean_d var(x_b[:, d])``
  (scikit-learn's rule; the variance is unweighted, over the problem's valid
  points, of the data as clustered, i.e. normalised for cosine).  Unchanged
  labels give a zero shift, so scikit-learn's "strict convergence" stop
  coincides.
* After the last iteration a final assignment step makes ``labels`` consistent
  with the returned centres (scikit-learn does the same), and ``inertia`` is
  ``sum w * ||x - c_label||^2`` (cosine: ``sum w * (1 - x.c_label)``),
  accumulated in float64 from direct differences, not the expanded form.

Backends: ``torch`` (batched bmm, chunked so memory stays bounded; the BLAS
path), ``cpp`` (one fused assign + accumulate pass over the points per
iteration; scores from a register-tiled float32 micro-kernel whose partial dot
products over 256 features are added in float64; OpenMP over problems when
there are at least 2 per thread, otherwise problem by problem with the points
split across threads),
``triton`` (fused distance + running argmin per tile of points, the N x k
distance matrix never written; centre sums by a deterministic one-hot
reduction per (problem, centre tile, feature tile), no atomics, so results are
bit-reproducible run to run).  ``auto`` on CPU takes the C++ kernel for every
shape: it beat the torch/BLAS path in all three benchmark regimes, including
the large-k x D one (bench/RESULTS.md), so no per-shape rule is needed.

GPU path (``triton`` on CUDA tensors): the whole call is device-resident, with
no host synchronisation, so it can be captured in a CUDA graph
(_kmeans_triton.py).  All problems iterate together; each problem's stop is a
device-side flag, and a stopped problem keeps its centres and ``n_iter``
while its kernels' programs skip their work.  There is no early exit of the
loop (it would need the host to read the flags): a batch that has converged
still launches 5 kernels per remaining iteration up to ``iters``, each a few
microseconds of launch with programs that exit at once (less inside a CUDA
graph), which is why ``iters`` should be a real cap rather than a large
number.  Value checks of the input run as device-side assertions there
(``torch._assert_async``).  To capture a call, pass the initial centres (or
``init="first"``): "k-means++" and "random" draw from a generator whose
graph replay would not repeat the eager draws; pass ``lengths`` and
``weights`` on the device of ``x``.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ..runtime.validate import cpu_fast_path
from ..runtime.dispatch import Op, call_op, load_native
from ..runtime.validate import (as_tensor, check_dtype, check_finite, check_float, check_int,
                     check_rank, check_values)

__all__ = ["KMeansResult", "batched_kmeans", "kmeans_frames", "lloyd"]

_POINT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_METRICS = ("l2", "cosine")
_INITS = ("k-means++", "random", "first")
# Elements of float64 scratch (about 64 MB) the torch reference allows itself
# per chunk of problems or points; keeps the reference's memory bounded.
_CHUNK_ELEMENTS = 1 << 23
# Lloyd iterations are a real cap: the GPU path launches every iteration up to it (no host-read early exit).
MAX_ITERS = 10_000
# A problem whose largest |x| (or weight) lies outside [2**-40, 2**40] is clustered at a power-of-two scale
# that brings it into [0.5, 1): squared distances and weighted sums then neither overflow float32 (|x| near
# float32 max gave inf inertia and, on Triton, NaN centres) nor underflow (|x| ~ 1e-30 made every distance 0).
# Multiplying by a power of two is exact, so labels and centres are those of the unscaled problem wherever
# that one is computable; inside the range nothing is scaled and results are unchanged bit for bit.
_SCALE_RANGE = (2.0 ** -40, 2.0 ** 40)
# The fast path draws the k seeding steps' noise up front (k x B x N float64): at most 32 MB of it.
_FAST_NOISE_LIMIT = 1 << 22
_from_numpy = torch.from_numpy
_is_compiling = torch.compiler.is_compiling


class KMeansResult(NamedTuple):
    """Result of ``batched_kmeans`` for B problems.

    Attributes
    ----------
    centroids : (B, k, D) float32
        Final centres (unit-norm for ``metric="cosine"``), float32 whatever the
        input dtype.
    labels : (B, N) int64
        Index of each point's centre (consistent with ``centroids``); -1 for the
        points past ``lengths[b]``.
    inertia : (B,) float64
        Weighted sum of squared distances (cosine: of ``1 - x.c``) of each
        problem's points to their centres; float64 so that it is finite for
        every finite float32 input (points near float32 max have squared
        distances far beyond it).
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
def batched_kmeans(x, k: int, *, iters: int = 10, tol: float = 1e-4, init="k-means++", metric: str = "l2",
                   weights=None, lengths=None, seed: int = 0, backend: str = "auto") -> KMeansResult:
    """Lloyd k-means on B independent problems at once.

    Parameters
    ----------
    x : (B, N, D) or (N, D) tensor or array
        Points, float32, float16 or bfloat16 (computed in float32).  A 2-d input
        is one problem (B = 1) and the result keeps the batch dimension.
        Not modified.
    k : int
        Clusters per problem, ``1 <= k <= lengths[b]`` for every b.
    iters : int
        Maximum Lloyd iterations (>= 1).
    tol : float
        Per-problem stop: total squared centre shift ``<= tol`` x the mean
        per-feature variance of that problem's points (scikit-learn's rule).
    init : {"k-means++", "random", "first"} or (B, k, D) tensor
        Initial centres: D^2 sampling, k distinct points drawn uniformly, the
        first k points, or given centres ((k, D) for a 2-d ``x``).
    metric : {"l2", "cosine"}
        Squared Euclidean, or spherical k-means (points and centres
        L2-normalised, assignment by largest dot product).
    weights : (B, N) or (N,) tensor, optional
        Non-negative point weights (weighted means and inertia); each problem
        needs a positive total weight.
    lengths : (B,) integer tensor, optional
        Problem b uses its first ``lengths[b]`` points (1..N); the others get
        label -1.
    seed : int
        Seed of the ``torch.Generator`` used by the "k-means++" and "random"
        initialisations (on the device of ``x``).
    backend : {"auto", "torch", "cpp", "triton", "cuda"}

    Returns
    -------
    KMeansResult
        ``centroids (B, k, D)`` float32, ``labels (B, N)`` int64,
        ``inertia (B,)`` float64, ``n_iter (B,)`` int64.

    Notes
    -----
    Problems whose largest magnitude (or weight) lies outside
    ``[2**-40, 2**40]`` are clustered at an exact power-of-two scale, so
    inputs near float32 max or tiny ones give finite centres and inertia on
    every backend.  Inputs that require grad are accepted (outputs never
    require grad); meta tensors are refused.
    """
    if (weights is None and lengths is None and type(init) is str and init == "k-means++" and metric == "l2"
            and type(k) is int and type(iters) is int and type(tol) is float and type(seed) is int
            and cpu_fast_path(x)):
        fast = _kmeans_pp_fast(x, k, iters, tol, seed, backend)
        if fast is not None:
            return fast
    points, point_weights, lengths_t, k, iters, tol, cosine, x_scale, w_scale = _prepare_scaled(
        x, k, iters, tol, metric, weights, lengths)
    centres = initial_centres(points, k, init, point_weights, lengths_t, seed, cosine, scale=x_scale)
    name = select_backend(backend, points, k)
    centroids, labels, inertia, n_iter = call_op(torch.ops.streammem.lloyd, LLOYD.impls, name, points,
                                                 point_weights, lengths_t, centres, tol, iters, cosine)
    inertia = inertia.double()
    if x_scale is not None:
        inertia = inertia / x_scale.double() ** 2
        centroids = (centroids.double() / x_scale.double()[:, None, None]).to(torch.float32)
    if w_scale is not None:
        inertia = inertia / w_scale.double()
    return KMeansResult(centroids, labels, inertia, n_iter)


def _kmeans_pp_fast(x, k, iters, tol, seed, backend) -> KMeansResult | None:
    """The common small CPU call (unweighted l2 k-means++ on float32 C-contiguous points, C++ backend) in
    one native call: value checks, seeding and Lloyd in C++, no torch op on the way.  The seeding draws
    the reference's generator stream (the same mt19937 noise as ``torch.multinomial``) and computes D^2
    in float64 from direct differences, so its picks are the reference's except where the reference's
    float32 ``||x||^2 - 2 x.c + ||c||^2`` rounding decides (near-ties, duplicates of a chosen centre).
    None: not this case (the general path handles it and raises its errors)."""
    shape = x.shape
    if len(shape) == 3:
        B, N, D = shape
    elif len(shape) == 2:
        (N, D), B = shape, 1
    else:
        return None
    if not (B >= 1 and D >= 1 and 1 <= k <= N and 1 <= iters <= MAX_ITERS and 0.0 <= tol < math.inf
            and -(1 << 63) <= seed < (1 << 64) and k * B * N <= _FAST_NOISE_LIMIT):
        return None
    mod = LLOYD.cpp_module(backend)
    if mod is None or _is_compiling():
        return None
    out = mod.kmeans_pp(x.data_ptr(), B, N, D, k, iters, tol, seed & 0xFFFFFFFF)  # manual_seed keeps 32 bits
    if out is None:  # a problem needs the power-of-two rescaling
        return None
    return KMeansResult(*map(_from_numpy, out))


def _largest_magnitude(t: torch.Tensor) -> torch.Tensor | list[float]:
    """Largest ``|t[b]|`` of each problem (NaN if it holds one): two reductions, no temporary.  A list of
    floats for CPU tensors, a (B,) float32 tensor otherwise."""
    flat = t.reshape(t.shape[0], -1)
    low, high = flat.amin(dim=1), flat.amax(dim=1)
    if t.device.type == "cpu":
        return [max(-a, b) if a == a and b == b else math.nan for a, b in zip(low.tolist(), high.tolist())]
    return torch.maximum(-low, high).to(torch.float32)


def _power_of_two_scale(amax: torch.Tensor) -> torch.Tensor | None:
    """(B,) float32: ``2**-e`` bringing each problem's largest magnitude ``amax`` into [0.5, 1) when it lies
    outside ``_SCALE_RANGE``, else 1.  ``None`` when no problem needs it, decided on the host for CPU tensors
    only (free there); on CUDA always a tensor (no synchronisation)."""
    low, high = _SCALE_RANGE
    if isinstance(amax, list):  # CPU: decided on the host
        if all(low <= v <= high or v == 0 for v in amax):
            return None
        amax = torch.tensor(amax, dtype=torch.float32)
    outside = (amax > high) | ((amax < low) & (amax > 0))
    _, exponent = torch.frexp(amax)  # amax = m * 2**exponent, m in [0.5, 1)
    # Clamped to float32's normal exponent range (a subnormal-only problem scales up by 2**126 at most).
    scale = torch.ldexp(torch.ones_like(amax), (-exponent).clamp(-128, 126))
    return torch.where(outside, scale, torch.ones_like(amax))


def _apply_scale(t: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """``t * scale`` per problem (``t`` itself when ``scale`` is None)."""
    if scale is None:
        return t
    return (t * scale.reshape((-1,) + (1,) * (t.dim() - 1))).contiguous()


def kmeans_frames(frames, k: int, **kwargs) -> KMeansResult:
    """Cluster whole frames: each frame's P x D tokens are one point.

    Parameters
    ----------
    frames : (B, L, P, D) tensor or array
        B chunks of L frames of P tokens of D features (StreamChat: P pooled
        tokens per frame).
    k : int
        Centre frames per chunk.
    **kwargs
        Passed to ``batched_kmeans`` (iters, tol, init as (B, k, P, D) or
        (B, k, P*D), metric, weights (B, L), lengths (B,), seed, backend).

    Returns
    -------
    KMeansResult
        As ``batched_kmeans`` but ``centroids`` is ``(B, k, P, D)`` (centre
        frames) and ``labels`` is ``(B, L)``.
    """
    frames = as_tensor(frames, "frames")
    check_rank(frames, "frames", (4,), "(B, L, P, D)")
    B, L, P, D = frames.shape
    init = kwargs.get("init", "k-means++")
    if isinstance(init, torch.Tensor) and init.dim() == 4:
        kwargs["init"] = init.reshape(init.shape[0], init.shape[1], -1)
    res = batched_kmeans(frames.reshape(B, L, P * D), k, **kwargs)
    return KMeansResult(res.centroids.reshape(B, k, P, D), res.labels, res.inertia, res.n_iter)


def select_backend(backend: str, points: torch.Tensor, k: int) -> str:
    """Backend ``batched_kmeans`` would use for prepared ``points (B, N, D)``."""
    _, N, D = points.shape
    return LLOYD.select(backend, points.device, n_points=N, k=k, dim=D)


def _prepare(x, k, iters, tol, metric, weights, lengths):
    """Validate; return float32 contiguous (B,N,D) points, float32 (B,N) weights, int64 (B,) lengths."""
    return _prepare_scaled(x, k, iters, tol, metric, weights, lengths)[:7]


def _prepare_scaled(x, k, iters, tol, metric, weights, lengths):
    """``_prepare``, plus the power-of-two scales applied to the points (l2) and weights (None: unscaled)."""
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
    # check_finite_by_extremes) and the power-of-two scale.
    x_amax = _largest_magnitude(x)
    if x.device.type == "cpu":  # plain floats on the host: the common small call stays cheap
        if not all(math.isfinite(v) for v in x_amax):
            raise ValueError("x must be finite, found NaN or Inf")
    else:
        check_values(torch.isfinite(x_amax).all(), "x must be finite, found NaN or Inf")
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
        check_values((shortest >= 1) & (longest <= N), f"lengths must lie in [1, N={N}]")
        check_values(shortest >= k, f"k must be <= the number of points of every problem (lengths), got k={k}")

    x_scale = _power_of_two_scale(x_amax)
    points = _apply_scale(x.to(torch.float32), x_scale)
    if cosine:  # normalised at a power-of-two scale: the norms of huge or tiny points neither overflow nor vanish
        points, x_scale = torch.nn.functional.normalize(points, dim=-1), None
    points = points.contiguous()
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
        w = w.to(device=x.device, dtype=torch.float32)
        check_values((w >= 0).all(), "weights must be non-negative, found a negative weight")
        check_values(((w * valid).sum(dim=1) > 0).all(),
                     "weights must have a positive sum over the points of every problem")
        w_scale = _power_of_two_scale(_largest_magnitude(w))
        point_weights = _apply_scale(w, w_scale).contiguous()
    return points, point_weights, lengths_t, k, iters, tol, cosine, x_scale, w_scale


def mean_feature_variance(points: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """(B,) float64: mean over features of each problem's (unweighted, ddof 0) variance.

    Two passes (mean, then squared deviations) in float64; the C++ kernel uses
    one pass of float64 sums and sums of squares, equal to ~1e-12 relative.
    """
    B, N, D = points.shape
    out = torch.empty(B, dtype=torch.float64, device=points.device)
    step = max(1, _CHUNK_ELEMENTS // max(1, N * D))
    for b0 in range(0, B, step):
        chunk = points[b0:b0 + step].double()
        n = lengths[b0:b0 + step].to(torch.float64)[:, None]
        valid = (torch.arange(N, device=points.device)[None, :] < lengths[b0:b0 + step, None])[..., None]
        mean = (chunk * valid).sum(dim=1) / n
        var = (((chunk - mean[:, None, :]) ** 2) * valid).sum(dim=1) / n
        out[b0:b0 + step] = var.mean(dim=1)
    return out


# --------------------------------------------------------------------------
# Initialisation (shared by every backend)
# --------------------------------------------------------------------------
def initial_centres(points, k, init, weights, lengths, seed, cosine, scale=None) -> torch.Tensor:
    """(B, k, D) float32 starting centres for prepared points (B, N, D); given centres are multiplied by
    ``scale`` ((B,), the points' power-of-two scale) when it is passed."""
    B, N, D = points.shape
    valid = torch.arange(N, device=points.device)[None, :] < lengths[:, None]
    if isinstance(init, str):
        if init not in _INITS:
            raise ValueError(f"init must be one of {_INITS} or a (B, k, D) tensor, got {init!r}")
        seed = check_int(seed, "seed")
        if not -(1 << 63) <= seed < (1 << 64):
            raise ValueError(f"seed must lie in [-2**63, 2**64) (a torch.Generator seed), got {seed}")
        if init == "first":
            return points[:, :k].clone()
        generator = torch.Generator(device=points.device)
        generator.manual_seed(seed)
        if init == "random":
            keys = torch.rand((B, N), generator=generator, device=points.device)
            keys = keys.masked_fill(~valid, 2.0)
            chosen = keys.argsort(dim=1, stable=True)[:, :k]
            return torch.gather(points, 1, chosen[..., None].expand(B, k, D)).contiguous()
        return _kmeans_plus_plus(points, k, weights * valid, generator, cosine)
    init_t = as_tensor(init, "init")
    if init_t.dim() == 2 and B == 1:
        init_t = init_t.unsqueeze(0)
    if tuple(init_t.shape) != (B, k, D):
        raise ValueError(f"init must have shape (B, k, D) = ({B}, {k}, {D}), got {tuple(init_t.shape)}")
    if not init_t.is_floating_point():
        raise ValueError(f"init must be a floating tensor, got dtype {init_t.dtype}")
    check_finite(init_t, "init")
    centres = init_t.to(device=points.device, dtype=torch.float32)
    if scale is not None:
        centres = _apply_scale(centres, scale)
    if cosine:
        centres = torch.nn.functional.normalize(centres, dim=-1)
    return centres.contiguous()


def _kmeans_plus_plus(points, k, weights, generator, cosine) -> torch.Tensor:
    """Standard D^2 sampling (Arthur & Vassilvitskii 2007), batched over problems.

    Step 1 draws a point with probability proportional to its weight; each next
    centre is drawn with probability ``w * D^2`` where D^2 is the squared
    distance to the nearest centre chosen so far (cosine: ``1 - x.c``, half
    the squared chord on the unit sphere).  A problem whose
    remaining mass is zero (all points coincide with chosen centres) draws by
    weight again; the duplicate centre is then handled as an empty cluster.
    """
    B, N, D = points.shape
    w = weights.double()
    rows = torch.arange(B, device=points.device)
    first = torch.multinomial(w, 1, generator=generator)[:, 0]
    centres = [points[rows, first]]
    sq_norm = (points * points).sum(-1)
    nearest = None
    for _ in range(1, k):
        c = centres[-1]
        dots = torch.bmm(points, c[:, :, None])[..., 0]
        if cosine:
            dist = (1.0 - dots).clamp_min(0.0)
        else:
            dist = (sq_norm - 2.0 * dots + (c * c).sum(-1)[:, None]).clamp_min(0.0)
        nearest = dist if nearest is None else torch.minimum(nearest, dist)
        # On unit vectors ||x - c||^2 = 2 (1 - x.c): cosine D^2 sampling uses 1 - x.c.
        mass = w * nearest.double()
        empty_mass = mass.sum(dim=1) <= 0
        mass = torch.where(empty_mass[:, None], w, mass)
        pick = torch.multinomial(mass, 1, generator=generator)[:, 0]
        centres.append(points[rows, pick])
    return torch.stack(centres, dim=1).contiguous()


# --------------------------------------------------------------------------
# Custom op (works under torch.compile; opcheck-tested)
# --------------------------------------------------------------------------
@torch.library.custom_op("streammem::lloyd", mutates_args=())
def lloyd(points: torch.Tensor, weights: torch.Tensor, lengths: torch.Tensor, centres: torch.Tensor,
          tol: float, iters: int, cosine: bool, backend: str
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Core op on prepared input.

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


# --------------------------------------------------------------------------
# Backend: torch reference (the spec)
# --------------------------------------------------------------------------
def assign_torch(points, centres, valid, cosine) -> torch.Tensor:
    """(B, N) labels: nearest centre (first on ties), -1 for invalid points; chunked over N."""
    B, N, D = points.shape
    k = centres.shape[1]
    labels = torch.empty((B, N), dtype=torch.int64, device=points.device)
    centres_t = centres.transpose(1, 2)
    sq_norm = (centres * centres).sum(-1)[:, None, :]
    step = max(1, _CHUNK_ELEMENTS // max(1, B * k))
    for n0 in range(0, N, step):
        dots = torch.bmm(points[:, n0:n0 + step], centres_t)
        if cosine:
            labels[:, n0:n0 + step] = torch.argmax(dots, dim=-1)
        else:
            labels[:, n0:n0 + step] = torch.argmin(sq_norm - 2.0 * dots, dim=-1)
    return labels.masked_fill_(~valid, -1)


def distance_to_own_centre(points, centres, labels, cosine) -> torch.Tensor:
    """(B, N) float64 direct distance of each point to its labelled centre (0 where label = -1)."""
    B, N, D = points.shape
    out = torch.zeros((B, N), dtype=torch.float64, device=points.device)
    step = max(1, _CHUNK_ELEMENTS // max(1, B * D))
    for n0 in range(0, N, step):
        lab = labels[:, n0:n0 + step]
        own = torch.gather(centres, 1, lab.clamp_min(0)[..., None].expand(-1, -1, D)).double()
        x = points[:, n0:n0 + step].double()
        if cosine:
            d = 1.0 - (x * own).sum(-1)
        else:
            d = ((x - own) ** 2).sum(-1)
        out[:, n0:n0 + step] = torch.where(lab >= 0, d, torch.zeros_like(d))
    return out


def centre_sums_torch(points, weights, labels, k):
    """(B,k,D) float64 weighted sums and (B,k) float64 weights of each cluster."""
    B, N, D = points.shape
    sums = torch.zeros((B * k, D), dtype=torch.float64, device=points.device)
    mass = torch.zeros((B * k,), dtype=torch.float64, device=points.device)
    offset = (torch.arange(B, device=points.device) * k)[:, None]
    step = max(1, _CHUNK_ELEMENTS // max(1, B * D))
    for n0 in range(0, N, step):
        lab = labels[:, n0:n0 + step]
        keep = (lab >= 0).reshape(-1)
        slot = (lab + offset).reshape(-1)[keep]
        w = weights[:, n0:n0 + step].reshape(-1)[keep].double()
        x = points[:, n0:n0 + step].reshape(-1, D)[keep].double()
        sums.index_add_(0, slot, x * w[:, None])
        mass.index_add_(0, slot, w)
    return sums.view(B, k, D), mass.view(B, k)


def finish_update(points, labels, centres, sums, mass, cosine) -> torch.Tensor:
    """New (B,k,D) float32 centres from float64 cluster sums, empty clusters re-seeded.

    The C++ kernel and the Triton ``_update_kernel`` / ``_finish_kernel`` mirror it.
    """
    if cosine:
        norm = torch.linalg.vector_norm(sums, dim=-1)
        empty = (mass <= 0) | (norm <= 0)
        new = sums / torch.where(empty, torch.ones_like(norm), norm)[..., None]
    else:
        empty = mass <= 0
        new = sums / torch.where(empty, torch.ones_like(mass), mass)[..., None]
    new = new.to(torch.float32)
    if bool(empty.any()):
        dist = distance_to_own_centre(points, centres, labels, cosine)
        dist = dist.masked_fill(labels < 0, -1.0)  # invalid points are never chosen
        for b in torch.nonzero(empty.any(dim=1)).flatten().tolist():
            clusters = torch.nonzero(empty[b]).flatten()
            # Stable descending sort: equal distances keep increasing point order.
            order = torch.sort(dist[b], descending=True, stable=True).indices[: clusters.numel()]
            new[b, clusters] = points[b, order]
    return new


def _lloyd_torch(points, weights, lengths, centres, tol, iters, cosine):
    B, N, D = points.shape
    outs = []
    step = max(1, _CHUNK_ELEMENTS // max(1, N * D))  # problems per chunk: bounds the float64 scratch
    for b0 in range(0, B, step):
        outs.append(lloyd_loop(points[b0:b0 + step], weights[b0:b0 + step], lengths[b0:b0 + step],
                               centres[b0:b0 + step], tol, iters, cosine))
    return tuple(torch.cat(parts) for parts in zip(*outs))


def shift_thresholds(points, lengths, tol: float) -> torch.Tensor:
    """(B,) float64 absolute stop thresholds: ``tol`` x each problem's mean feature variance."""
    if tol > 0:
        return tol * mean_feature_variance(points, lengths)
    # Stop only at a fixed point: no variance needed.
    return torch.zeros(points.shape[0], dtype=torch.float64, device=points.device)


def lloyd_loop(points, weights, lengths, centres, tol, iters, cosine):
    """Lloyd iterations with per-problem stopping: the reference (torch backend).

    Each iteration runs only the problems still active (a host loop: the
    Triton backend keeps the same semantics on the device, masking converged
    problems instead of selecting the active ones).
    """
    B, N, D = points.shape
    k = centres.shape[1]
    valid = torch.arange(N, device=points.device)[None, :] < lengths[:, None]
    tol = shift_thresholds(points, lengths, tol)
    centres = centres.clone()
    active = torch.ones(B, dtype=torch.bool, device=points.device)
    n_iter = torch.zeros(B, dtype=torch.int64, device=points.device)
    for _ in range(iters):
        idx = torch.nonzero(active).flatten()
        if idx.numel() == 0:
            break
        if idx.numel() == B:  # no copies while every problem iterates
            x, w, c, ok = points, weights, centres, valid
        else:
            x, w, c, ok = points[idx], weights[idx], centres[idx], valid[idx]
        labels = assign_torch(x, c, ok, cosine)
        sums, mass = centre_sums_torch(x, w, labels, k)
        new = finish_update(x, labels, c, sums, mass, cosine)
        shift = ((new.double() - c.double()) ** 2).sum(dim=(1, 2))
        centres[idx] = new
        n_iter[idx] += 1
        active[idx] = shift > tol[idx]
    labels = assign_torch(points, centres, valid, cosine)
    dist = distance_to_own_centre(points, centres, labels, cosine)
    inertia = (dist * weights.double() * valid).sum(dim=1).to(torch.float32)
    return centres, labels, inertia, n_iter


# --------------------------------------------------------------------------
# Backend: C++ (csrc/cpu/kmeans.cpp)
# --------------------------------------------------------------------------
def _lloyd_cpp(points, weights, lengths, centres, tol, iters, cosine):
    mod, _ = load_native("cpu", "kmeans")
    c, labels, inertia, n_iter = mod.lloyd(points.numpy(), weights.numpy(), lengths.numpy(),
                                           centres.contiguous().numpy(), float(tol), int(iters), bool(cosine))
    return torch.from_numpy(c), torch.from_numpy(labels), torch.from_numpy(inertia), torch.from_numpy(n_iter)


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
    {"torch": _lloyd_torch, "cpp": _lloyd_cpp, "triton": _lloyd_triton},
    tolerances={backend: dict.fromkeys(_POINT_DTYPES, tol) for backend, tol in _TOLERANCES.items()},
)
