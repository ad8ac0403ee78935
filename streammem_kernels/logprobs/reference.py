"""The torch reference of the logprobs op: the plain ``*_reference`` functions are the spec the tests
compare every backend with (they materialise everything); ``*_torch`` are the torch backend, the same
math chunked so that memory stays bounded.  Imports nothing of the op.
"""
from __future__ import annotations

from typing import Optional

import torch


# Working-set budget of the chunked torch backend (float32 elements per chunk):
# 2**22 floats = 16 MiB, a few such temporaries at once.
TORCH_CHUNK_ELEMS = 1 << 22


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The accumulation (and result) dtype: float64 for float64 input, float32 for every other."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def token_logprobs_reference(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits.float(), -1).gather(-1, targets)`` (materialises (T, V))."""
    x = logits.to(compute_dtype(logits.dtype))
    return torch.log_softmax(x, dim=-1).gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)


def linear_token_logprobs_reference(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                                    bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Plain logits -> log_softmax -> gather in float32 (float64 for float64 input)."""
    cdt = compute_dtype(hidden.dtype)
    logits = hidden.to(cdt) @ weight.to(cdt).T
    if bias is not None:
        logits = logits + bias.to(cdt)
    return token_logprobs_reference(logits, targets)


def divergence_point_reference(logprobs: torch.Tensor, delta: int = 20, alpha: float = 0.85, beta: float = 1.0,
                               lengths: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Vectorised Eq. 9-10 over (B, L) float64 log-probs; see the module docstring."""
    lp = logprobs.to(torch.float64)
    batch, max_len = lp.shape
    if lengths is None:
        lengths = torch.full((batch,), max_len, dtype=torch.int64, device=lp.device)
    lengths = lengths.to(torch.int64)
    out = lengths.clone()
    if max_len <= delta + 1:
        return out
    # windows[:, s] = lp[s .. s+delta-1], so mu_j is the mean of windows[:, j-delta].
    windows = lp.unfold(1, delta, 1)
    j = torch.arange(delta + 1, max_len, device=lp.device)
    mu = windows[:, j - delta].sum(-1) / delta
    drop = mu - lp[:, j]
    threshold = torch.clamp(alpha * mu.abs(), min=beta)
    hit = (drop > threshold) & (j[None, :] < lengths[:, None])
    any_hit = hit.any(dim=1)
    first = j[hit.to(torch.int8).argmax(dim=1)]
    return torch.where(any_hit, first, out)


# --------------------------------------------------------------------------
# Backend: torch (chunked so memory stays bounded; same math as the reference)
# --------------------------------------------------------------------------
# The torch backend: the references' math in bounded memory.
def token_logprobs_torch(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    cdt = compute_dtype(logits.dtype)
    n_rows, vocab = logits.shape
    out = torch.empty(n_rows, dtype=cdt, device=logits.device)
    step = max(1, TORCH_CHUNK_ELEMS // vocab)
    for r0 in range(0, n_rows, step):
        x = logits[r0:r0 + step].to(cdt)
        row_max = x.amax(dim=1, keepdim=True)  # not max(dim=1): its argmax pass took 3 of 9 ms at 64 x 32K
        target_logit = x.gather(1, targets[r0:r0 + step, None])
        # (target - max) first: exact for |logits| ~ 1e4, where logsumexp would round.
        lse_shifted = torch.log(torch.exp(x - row_max).sum(dim=1, keepdim=True))
        out[r0:r0 + step] = ((target_logit - row_max) - lse_shifted).squeeze(1)
    return out


def linear_token_logprobs_torch(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                                 targets: torch.Tensor) -> torch.Tensor:
    cdt = compute_dtype(hidden.dtype)
    n_rows = hidden.shape[0]
    vocab = weight.shape[0]
    h = hidden.to(cdt)
    # Online log-sum-exp over vocabulary chunks: only (N, chunk) logits live at a time.
    running_max = torch.full((n_rows,), float("-inf"), dtype=cdt, device=hidden.device)
    running_sum = torch.zeros(n_rows, dtype=cdt, device=hidden.device)
    target_logit = torch.zeros(n_rows, dtype=cdt, device=hidden.device)
    step = max(256, TORCH_CHUNK_ELEMS // max(n_rows, 1))
    for v0 in range(0, vocab, step):
        chunk_bias = None if bias is None else bias[v0:v0 + step].to(cdt)
        logits = torch.nn.functional.linear(h, weight[v0:v0 + step].to(cdt), chunk_bias)
        tile_max = logits.amax(dim=1)
        new_max = torch.maximum(running_max, tile_max)
        # exp(-inf - finite) = 0 on the first chunk; an all -inf row yields NaN -> ValueError.
        running_sum = running_sum * torch.exp(running_max - new_max) + torch.exp(logits - new_max[:, None]).sum(1)
        running_max = new_max
        local = targets - v0
        in_tile = (local >= 0) & (local < logits.shape[1])
        picked = logits.gather(1, local.clamp(0, logits.shape[1] - 1)[:, None]).squeeze(1)
        target_logit = torch.where(in_tile, picked, target_logit)
    return target_logit - running_max - torch.log(running_sum)


def divergence_point_torch(logprobs, lengths, delta, alpha, beta):
    return divergence_point_reference(logprobs, delta, alpha, beta, lengths)
