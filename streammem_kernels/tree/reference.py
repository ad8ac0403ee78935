"""The torch reference of the tree family: the scoring rules every backend implements, the size
bounds the public functions check, and the exact top-k and the tree searches written with them.

The scoring rules, shared by :func:`~streammem_kernels.cosine_topk`,
:func:`~streammem_kernels.tree_search` and the store (which normalises on insertion):

* A score is ``dot(q / |q|, v / |v|)`` in float32; norms are taken after scaling the row by the
  power of two that brings its largest |component| into [0.5, 1) (:func:`pow2_row_scale`, exact),
  so rows of any finite magnitude get their true direction.  An all-zero row scores 0 against
  everything (:func:`unit_rows`).
* A dot product is a product summed along D (:func:`dot_rows`), never a GEMM, so identical rows
  score identically wherever they lie and the tie rule holds.
* A ranking orders by (score desc, id asc); ``-inf`` marks an absent entry (:func:`topk_low_id`).

:func:`cosine_topk_reference`, :func:`index_topk_reference` and :func:`tree_search_reference` are the specs the
tests compare every backend with, and the torch backends themselves (chunked so that memory stays bounded).
Every shape in them comes from host metadata (query and root counts, the tree's height and
``max_fanout``, the beam widths), never from tensor values, so they run on a GPU without
synchronising.  ``docs/ops/tree.md`` explains the algorithms.  Imports nothing of the op but the
shared runtime.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from ..runtime.launch import block_elements
from ..runtime.validate import check_int

# Size bounds checked before anything is allocated (a ValueError naming the argument instead of
# a MemoryError, a pybind type error for ints >= 2^63 or an int32 overflow in a kernel).
MAX_DIM = 1 << 20  # embedding dimension
MAX_NODES = 1 << 40  # tree nodes / keys
MAX_TABLE = 1 << 36  # capacity x dim floats of a CosineTree's embedding table (256 GiB)
MAX_RESULTS = 1 << 28  # entries of one result tensor (Q x k, Q x R x (H + 1))
MAX_WIDTH = 2**31 - 1  # a beam width

FLOAT_INPUTS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
INT_INPUTS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)

# Floats of a scan's temporaries at once on a CPU (256K, 1 MB; large on a GPU, block_elements): each block of keys (or
# of gathered candidate rows) is normalised and scored while in cache, and no temporary is large enough for a fresh
# mmap (a page fault per 4 KB).  At Q = 64, N = 10^4, D = 384 one 64 MB product block took 1.0 s on one core, 1 MB
# blocks 0.14 s; unit_rows and each row's sum along D give the same bits whatever the block.
SCAN_BLOCK = 1 << 18


def check_size(value, name: str, *, minimum: int = 1, maximum: int) -> int:
    """``value`` as an int in [minimum, maximum] (ValueError naming ``name`` otherwise)."""
    value = check_int(value, name, minimum=minimum)
    if value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


# --------------------------------------------------------------------------
# Scoring and ranking rules
# --------------------------------------------------------------------------
# Exponent range of the row scale: 2^-e for e in [-126, 126] is a normal float32, so the scale
# itself is exact; a row whose largest |component| is >= 2^127 ends in [2, 4), a subnormal one
# at >= 2^-23 -- either way its squares neither overflow nor underflow.
POW2_SCALE_EXPONENT = 126


def pow2_row_scale(x: torch.Tensor) -> torch.Tensor:
    """(..., 1) float32 power of two that brings each row's largest |component| into [0.5, 1)
    (1 for an all-zero row; the exponent clamped to +-126).  Multiplying by it is exact."""
    # max |x| = max(max x, -min x): two read-only passes, 5x faster than abs() then amax() on CPU (and
    # than a per-row aminmax, which torch does not vectorise).
    amax = torch.maximum(x.amax(-1, keepdim=True), -x.amin(-1, keepdim=True))
    _, exponent = torch.frexp(amax)
    return torch.ldexp(torch.ones_like(amax), (-exponent).clamp(-POW2_SCALE_EXPONENT, POW2_SCALE_EXPONENT))


def unit_rows(x: torch.Tensor) -> torch.Tensor:
    """Rows scaled to unit L2 norm in float32; all-zero rows stay zero (never NaN).

    The row is first scaled by :func:`pow2_row_scale` (exact), so that its squared
    norm neither overflows nor underflows; dividing by the norm clamped to the
    smallest normal float then gives 0 / tiny = 0 for a zero row and changes
    nothing for any other (its scaled norm is at least 0.5).
    """
    x = x.to(torch.float32)
    x = x * pow2_row_scale(x)
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return x / norm.clamp_min(torch.finfo(torch.float32).tiny)


def dot_rows(queries: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """dots[s, c] = queries[s] . rows[s, c] for queries (S, D) and rows (S, C, D), summed along D."""
    return (rows * queries[:, None, :]).sum(-1)


def topk_low_id(ids: torch.Tensor, scores: torch.Tensor, k: int):
    """Top-k of each row by (score desc, id asc); -inf scores count as absent (id -1).

    Returns ``(ids, scores)`` of shape (S, k), padded with -1 / -inf when a row has
    fewer than k columns.
    """
    s_rows = ids.shape[0]
    key = torch.where(ids >= 0, ids, torch.full_like(ids, torch.iinfo(torch.int64).max))
    by_id = torch.argsort(key, dim=1, stable=True)
    ids, scores = ids.gather(1, by_id), scores.gather(1, by_id)
    order = torch.argsort(scores, dim=1, descending=True, stable=True)[:, :k]
    top_ids, top_scores = ids.gather(1, order), scores.gather(1, order)
    top_ids = torch.where(torch.isfinite(top_scores), top_ids, torch.full_like(top_ids, -1))
    if top_ids.shape[1] < k:
        pad = k - top_ids.shape[1]
        top_ids = torch.cat([top_ids, top_ids.new_full((s_rows, pad), -1)], 1)
        top_scores = torch.cat([top_scores, top_scores.new_full((s_rows, pad), float("-inf"))], 1)
    return top_ids, top_scores


# --------------------------------------------------------------------------
# Exact (segmented) cosine top-k
# --------------------------------------------------------------------------
def cosine_topk_reference(queries: torch.Tensor, keys: torch.Tensor, k: int, ranges: torch.Tensor):
    """(ids, scores) (Q, k) of the ``k`` best keys of each query by cosine, ties toward the lower
    index, query q scoring only ``keys[ranges[q, 0]:ranges[q, 1]]``.

    float32 queries (Q, D) of any norm, raw float32 keys (N, D), int64 ranges (Q, 2).
    """
    scores = cosine_scores(queries, keys, ranges)
    return topk_low_id(torch.arange(keys.shape[0], device=keys.device).expand_as(scores), scores, k)


def cosine_scores(queries: torch.Tensor, keys: torch.Tensor, ranges: torch.Tensor) -> torch.Tensor:
    """(Q, N) float32 cosine of every query with every key, ``-inf`` outside the query's range (the
    scores :func:`cosine_topk_reference` ranks); arguments as there."""
    queries = unit_rows(queries)
    (num_q, dim), num_k = queries.shape, keys.shape[0]
    scores = torch.empty((num_q, num_k), dtype=torch.float32, device=keys.device)
    budget = block_elements(keys.device, SCAN_BLOCK)
    block = max(1, budget // dim)  # keys normalised at once (unit_rows works row by row)
    chunk = max(1, budget // (num_q * dim))  # keys per (Q, chunk, D) product
    for lo in range(0, num_k, block):
        unit = unit_rows(keys[lo : lo + block])
        for at in range(0, unit.shape[0], chunk):
            part = unit[at : at + chunk]
            scores[:, lo + at : lo + at + part.shape[0]] = dot_rows(queries, part[None].expand(num_q, -1, -1))
    idx = torch.arange(num_k, device=keys.device)
    inside = (idx[None, :] >= ranges[:, :1]) & (idx[None, :] < ranges[:, 1:])
    return torch.where(inside, scores, torch.full_like(scores, float("-inf")))


def index_topk_reference(queries: torch.Tensor, keys: torch.Tensor, k: int, ranges: torch.Tensor,
                         alive: torch.Tensor | None):
    """(rows, scores) (Q, k) of the ``k`` best rows of a :class:`~streammem_kernels.CosineIndex`'s prepared
    keys for each query by cosine, ties toward the lower row, query q scoring only the rows
    ``ranges[q, 0] <= row < ranges[q, 1]`` whose ``alive`` flag is set (all rows when ``alive`` is None).

    float32 queries (Q, D) of any norm; float32 keys (N, D), unit rows (or zero rows) as the index stores
    them, *not* normalised again: a score is ``dot(q / |q|, key)``, so it equals
    :func:`cosine_topk_reference` on the same keys up to the rounding of their norms (a few ulps).
    """
    queries = unit_rows(queries)
    num_q, num_k = queries.shape[0], keys.shape[0]
    scores = torch.empty((num_q, num_k), dtype=torch.float32, device=keys.device)
    chunk = max(1, block_elements(keys.device, SCAN_BLOCK) // (num_q * keys.shape[1]))  # bounds (Q, chunk, D)
    for lo in range(0, num_k, chunk):
        scores[:, lo : lo + chunk] = dot_rows(queries, keys[None, lo : lo + chunk].expand(num_q, -1, -1))
    idx = torch.arange(num_k, device=keys.device)
    inside = (idx[None, :] >= ranges[:, :1]) & (idx[None, :] < ranges[:, 1:])
    if alive is not None:
        inside = inside & alive[None, :]
    scores = torch.where(inside, scores, torch.full_like(scores, float("-inf")))
    return topk_low_id(idx.expand_as(scores), scores, k)


# --------------------------------------------------------------------------
# Greedy and beam search of a CosineTree
# --------------------------------------------------------------------------
class SearchPlan(NamedTuple):
    """What one search does, fixed by host values: every backend takes
    ``impl(embeddings, child_ptr, child_idx, roots, level, utility, queries, plan)``.

    ``widths[i]`` is the beam at level ``height - i`` (beam search); ``fanout`` the tree's
    ``max_fanout`` (candidates per node, padded); ``level`` and ``utility`` are None for greedy
    search.  Queries are float32, contiguous and finite, of any norm (each backend normalises).
    """

    greedy: bool
    height: int
    fanout: int
    widths: tuple
    k: int
    min_score: float
    use_utility: bool
    from_every_root: bool


ScoreFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def score_candidates(queries: torch.Tensor, embeddings: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    """scores[s, c] = queries[s] . embeddings[cand[s, c]]; -inf where cand < 0."""
    s_rows, c = cand.shape
    out = torch.full((s_rows, c), float("-inf"), dtype=torch.float32, device=queries.device)
    chunk = max(1, block_elements(queries.device, SCAN_BLOCK) // max(1, c * embeddings.shape[1]))  # (chunk, C, D)
    for lo in range(0, s_rows if c else 0, chunk):
        ids = cand[lo : lo + chunk]
        dots = dot_rows(queries[lo : lo + chunk], embeddings[ids.clamp_min(0)])
        out[lo : lo + chunk] = torch.where(ids >= 0, dots, out[lo : lo + chunk])
    return out


def children_of(nodes: torch.Tensor, child_ptr: torch.Tensor, child_idx: torch.Tensor, fanout: int) -> torch.Tensor:
    """(S, B * fanout) children of nodes (S, B), each node's run padded with -1 to ``fanout``
    (-1 entries of ``nodes`` have none), in order."""
    s_rows = nodes.shape[0]
    if fanout == 0 or child_idx.numel() == 0:
        return torch.full((s_rows, 0), -1, dtype=torch.int64, device=nodes.device)
    flat = nodes.reshape(-1)
    safe = flat.clamp_min(0)
    start = child_ptr[safe]
    count = torch.where(flat >= 0, child_ptr[safe + 1] - start, torch.zeros_like(start))
    offs = torch.arange(fanout, device=nodes.device)
    valid = offs[None, :] < count[:, None]
    pos = (start[:, None] + offs[None, :]).clamp_max(child_idx.numel() - 1)
    kids = torch.where(valid, child_idx[pos], torch.full_like(pos, -1))
    return kids.reshape(s_rows, -1)


def pack_left(ids: torch.Tensor, width: int) -> torch.Tensor:
    """The first ``width`` columns after moving valid (>= 0) ids to the front of each row, in order."""
    order = torch.argsort((ids < 0).to(torch.int8), dim=1, stable=True)[:, :width]
    return ids.gather(1, order)


def greedy_levels(embeddings, child_ptr, child_idx, roots, queries, height: int, fanout: int, from_every_root: bool,
                  score_fn: ScoreFn = score_candidates):
    """Greedy descent (StreamChat's Algorithm 1) of unit queries, one level per step.

    Scores every root, takes the best (the first maximum: the lowest id), then only that node's
    children, down to a leaf.  Returns ``(path, path_scores, best_node, best_score)``: the path
    root first, padded with -1 / -inf to ``height + 1``, and the first best node on it (a running
    best from -inf, so all-negative similarities still return a node); with ``from_every_root``
    one descent per (query, root), with a root axis after the query axis.
    """
    num_q, num_r = queries.shape[0], roots.shape[0]
    dev = queries.device
    root_scores = score_fn(queries, embeddings, roots.expand(num_q, num_r).contiguous())
    if from_every_root:
        query_of = torch.arange(num_q, device=dev).repeat_interleave(num_r)
        cur = roots.repeat(num_q)
        cur_score = root_scores.reshape(-1)
    else:
        query_of = torch.arange(num_q, device=dev)
        best = torch.argmax(root_scores, dim=1)  # first maximum: the lowest root id
        cur = roots[best]
        cur_score = root_scores.gather(1, best[:, None])[:, 0]
    rows = cur.shape[0]
    path = torch.full((rows, height + 1), -1, dtype=torch.int64, device=dev)
    path_scores = torch.full((rows, height + 1), float("-inf"), dtype=torch.float32, device=dev)
    path[:, 0], path_scores[:, 0] = cur, cur_score
    row_queries = queries[query_of]
    for step in range(1, height + 1):  # height >= 1 implies fanout >= 1
        kids = children_of(cur[:, None], child_ptr, child_idx, fanout)
        active = kids[:, 0] >= 0  # a row below a leaf (or already past one) stays -1
        scores = score_fn(row_queries, embeddings, kids)
        best = torch.argmax(scores, dim=1)
        nxt = kids.gather(1, best[:, None])[:, 0]
        nxt_score = scores.gather(1, best[:, None])[:, 0]
        path[:, step] = torch.where(active, nxt, path[:, step])
        path_scores[:, step] = torch.where(active, nxt_score, path_scores[:, step])
        cur = torch.where(active, nxt, torch.full_like(nxt, -1))
    best_pos = torch.argmax(path_scores, dim=1)  # running best from -inf, strict '>': first maximum
    best_node = path.gather(1, best_pos[:, None])[:, 0]
    best_score = path_scores.gather(1, best_pos[:, None])[:, 0]
    if from_every_root:
        shape = (num_q, num_r)
        return (path.view(*shape, -1), path_scores.view(*shape, -1), best_node.view(shape), best_score.view(shape))
    return path, path_scores, best_node, best_score


def beam_levels(embeddings, child_ptr, child_idx, roots, level, utility, queries, widths, fanout: int, k: int,
                min_score: float, use_utility: bool, score_fn: ScoreFn = score_candidates):
    """Level-synchronous beam search of unit queries; returns ``(ids, scores)`` (Q, k).

    From the top level ``H`` down, the pool at level ``l`` is the roots of level ``l`` plus the
    level-``l`` children of the nodes kept above; the ``widths[H - l]`` best of the pool by cosine
    are kept and their children expanded.  The leaves reached are ranked by cosine (or cosine x
    utility), those below ``min_score`` dropped, the top ``k`` returned, padded with -1 / -inf.

    ``pending`` holds the nodes discovered and not yet expanded (-1: none): the roots, then the
    children of every node kept so far.  Each level adds at most ``width x fanout`` of them, and
    they are distinct nodes, so its width is bounded before the search:
    ``min(num_nodes, roots + fanout x sum of widths so far)``.
    """
    num_q, num_nodes = queries.shape[0], embeddings.shape[0]
    height = len(widths)
    pending = roots.expand(num_q, roots.shape[0])
    for step, width in enumerate(widths):
        lvl = height - step
        at_level = (pending >= 0) & (level[pending.clamp_min(0)] == lvl)
        pool = torch.where(at_level, pending, torch.full_like(pending, -1))
        kept, _ = topk_low_id(pool, score_fn(queries, embeddings, pool), min(width, pool.shape[1]))
        rest = torch.where(at_level, torch.full_like(pending, -1), pending)
        bound = min(num_nodes, pending.shape[1] + kept.shape[1] * fanout)
        pending = pack_left(torch.cat([rest, children_of(kept, child_ptr, child_idx, fanout)], 1), bound)
    cos = score_fn(queries, embeddings, pending)
    rank = cos * utility[pending.clamp_min(0)] if use_utility else cos
    rank = torch.where((pending >= 0) & (cos >= min_score), rank, torch.full_like(rank, float("-inf")))
    return topk_low_id(pending, rank, k)


def tree_search_reference(embeddings, child_ptr, child_idx, roots, level, utility, queries, plan: SearchPlan):
    """The search ``plan`` describes, on the arrays of a CosineTree snapshot: greedy
    (:func:`greedy_levels`) or beam (:func:`beam_levels`)."""
    unit = unit_rows(queries)
    if plan.greedy:
        return greedy_levels(embeddings, child_ptr, child_idx, roots, unit, plan.height, plan.fanout,
                             plan.from_every_root)
    return beam_levels(embeddings, child_ptr, child_idx, roots, level, utility, unit, plan.widths, plan.fanout,
                       plan.k, plan.min_score, plan.use_utility)
