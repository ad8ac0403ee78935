"""The torch reference of the kmeans op: the spec every backend is tested against.

``docs/ops/kmeans.md`` states the semantics in prose (the seeding, one Lloyd iteration, empty
clusters, the stop rule, the final assignment and the inertia).  Here: k-means++ seeding in torch
(the one every backend starts from), and the Lloyd loop of the torch backend, chunked so that its
float64 scratch stays bounded.  Imports nothing of the op.
"""
from __future__ import annotations

import math

import torch

# Elements of float64 scratch (about 64 MB) the torch reference allows itself
# per chunk of problems or points; keeps the reference's memory bounded.
CHUNK_ELEMENTS = 1 << 23


def mean_feature_variance(points: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """(B,) float64: mean over features of each problem's (unweighted, ddof 0) variance.

    Two passes (mean, then squared deviations) in float64; the C++ kernel uses
    one pass of float64 sums and sums of squares, equal to ~1e-12 relative.
    """
    B, N, D = points.shape
    out = torch.empty(B, dtype=torch.float64, device=points.device)
    step = max(1, CHUNK_ELEMENTS // max(1, N * D))
    for b0 in range(0, B, step):
        chunk = points[b0:b0 + step].double()
        n = lengths[b0:b0 + step].to(torch.float64)[:, None]
        valid = (torch.arange(N, device=points.device)[None, :] < lengths[b0:b0 + step, None])[..., None]
        mean = (chunk * valid).sum(dim=1) / n
        var = (((chunk - mean[:, None, :]) ** 2) * valid).sum(dim=1) / n
        out[b0:b0 + step] = var.mean(dim=1)
    return out


def default_local_trials(k: int) -> int:
    """Candidates per k-means++ step by default: ``2 + floor(ln k)`` (scikit-learn's, after Arthur and
    Vassilvitskii's conclusion)."""
    return 2 + int(math.log(k))


def squared_distances(points, centres, cosine) -> torch.Tensor:
    """(B, N, T) float32 distance of every point to every one of T centres (B, T, D): ``||x - c||^2`` in the
    expanded form ``||x||^2 - 2 x.c + ||c||^2`` (cosine: ``1 - x.c``, half the squared chord on the unit
    sphere), clamped at 0."""
    dots = torch.bmm(points, centres.transpose(1, 2))
    if cosine:
        return (1.0 - dots).clamp_min(0.0)
    sq_norm = (points * points).sum(-1)[:, :, None]
    return (sq_norm - 2.0 * dots + (centres * centres).sum(-1)[:, None, :]).clamp_min(0.0)


def kmeans_plus_plus(points, k, weights, generator, cosine, n_local_trials) -> torch.Tensor:
    """Greedy k-means++ (scikit-learn's ``_kmeans_plusplus``), batched over problems: (B, k, D) centres.

    Step 1 draws one point with probability proportional to its weight (``torch.multinomial``).  Each
    next step draws ``n_local_trials`` candidates with probability ``w * D^2``, D^2 the distance to the
    nearest centre chosen so far, by inverse CDF: a float64 uniform ``u`` (``torch.rand``, one
    ``(B, n_local_trials)`` draw per step) times the total of the running sum ``cumsum(w * D^2)`` picks
    the first point whose running sum exceeds it.  It keeps the candidate whose addition leaves the
    smallest potential ``sum w * min(D^2, d(x, candidate))`` (the first on ties).  One trial is the
    standard D^2 sampling of Arthur and Vassilvitskii (2007).  scikit-learn takes the first running sum
    that reaches the target (``searchsorted`` side left), which can pick a zero-mass point when the draw
    lands on a boundary; exceeding it never does.  A problem whose remaining mass is zero (every point on
    a chosen centre) draws by weight again; the duplicate centre then becomes an empty cluster.
    """
    B, N, D = points.shape
    w = weights.double()
    rows = torch.arange(B, device=points.device)
    first = torch.multinomial(w, 1, generator=generator)[:, 0]
    centres = [points[rows, first]]
    nearest = squared_distances(points, centres[0][:, None, :], cosine)[..., 0].double()  # (B, N)
    for _ in range(1, k):
        running = torch.cumsum(w * nearest, dim=1)
        empty_mass = running[:, -1:] <= 0
        running = torch.where(empty_mass, torch.cumsum(w, dim=1), running)
        targets = torch.rand((B, n_local_trials), generator=generator, dtype=torch.float64,
                             device=points.device) * running[:, -1:]
        candidates = torch.searchsorted(running, targets, right=True).clamp_max(N - 1)  # (B, T)
        candidate_points = torch.gather(points, 1, candidates[..., None].expand(B, n_local_trials, D))
        trial = torch.minimum(nearest[:, :, None], squared_distances(points, candidate_points, cosine).double())
        potential = (w[:, :, None] * trial).sum(dim=1)  # (B, T)
        best = potential.argmin(dim=1)
        nearest = trial[rows, :, best]
        centres.append(candidate_points[rows, best])
    return torch.stack(centres, dim=1).contiguous()


def assign_torch(points, centres, valid, cosine) -> torch.Tensor:
    """(B, N) labels: nearest centre (first on ties), -1 for invalid points; chunked over N."""
    B, N, D = points.shape
    k = centres.shape[1]
    labels = torch.empty((B, N), dtype=torch.int64, device=points.device)
    centres_t = centres.transpose(1, 2)
    sq_norm = (centres * centres).sum(-1)[:, None, :]
    step = max(1, CHUNK_ELEMENTS // max(1, B * k))
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
    step = max(1, CHUNK_ELEMENTS // max(1, B * D))
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
    # Row B * k is a sink for the invalid points (label -1): no boolean-mask copies, and each cluster
    # still adds its points in point order.
    sums = torch.zeros((B * k + 1, D), dtype=torch.float64, device=points.device)
    mass = torch.zeros((B * k + 1,), dtype=torch.float64, device=points.device)
    offset = (torch.arange(B, device=points.device) * k)[:, None]
    step = max(1, CHUNK_ELEMENTS // max(1, B * D))
    for n0 in range(0, N, step):
        lab = labels[:, n0:n0 + step]
        slot = torch.where(lab >= 0, lab + offset, B * k).reshape(-1)
        w = weights[:, n0:n0 + step].reshape(-1).double()
        x = points[:, n0:n0 + step].reshape(-1, D).double()
        sums.index_add_(0, slot, x * w[:, None])
        mass.index_add_(0, slot, w)
    return sums[:-1].view(B, k, D), mass[:-1].view(B, k)


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


def lloyd_torch(points, weights, lengths, centres, tol, iters, cosine):
    B, N, D = points.shape
    outs = []
    step = max(1, CHUNK_ELEMENTS // max(1, N * D))  # problems per chunk: bounds the float64 scratch
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
