"""Triton kernels for gathered token log-probabilities (see logprobs.py for the contract).

* ``token_logprobs``: one program per (row, vocabulary split); each walks its
  vocabulary range in BLOCK_V tiles with an online max / sum of exponentials
  and picks the target logit when its tile passes by.
* ``linear_token_logprobs``: one program per (block of BLOCK_T hidden rows,
  vocabulary split); each tile of BLOCK_V logits is a ``tl.dot`` over H in
  BLOCK_H steps (float32 accumulation), folded into the same online state.
  The logits never leave registers.

Both write partial (max, sum, target) states of shape (N, splits); a tiny
torch merge combines the splits.  Splitting the vocabulary keeps the GPU busy
when there are few rows (a short caption is T ~ 100 rows, V ~ 150k columns).
The running max starts at -FLT_MAX rather than -inf so that a tile of -inf
logits gives exp(-inf) = 0 instead of exp(-inf - -inf) = NaN.
Float32 inputs use IEEE-precision dots (not TF32) to stay within 1e-5 of the
reference; float16/bfloat16 tiles go to the tensor cores as they are.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import triton_interpreting

_NEG_BIG = -3.4028234663852886e38


@triton.jit
def _token_logprobs_kernel(logits_ptr, row_stride, targets_ptr, max_ptr, sum_ptr, tgt_ptr, V, v_per_split,
                           n_splits, BLOCK_V: tl.constexpr):
    row = tl.program_id(0)
    split = tl.program_id(1)
    target = tl.load(targets_ptr + row)
    v_start = split * v_per_split
    v_end = tl.minimum(v_start + v_per_split, V)
    offs = tl.arange(0, BLOCK_V)
    running_max = tl.full((), _NEG_BIG, tl.float32)
    running_sum = tl.zeros((), tl.float32)
    target_logit = tl.zeros((), tl.float32)
    row_ptr = logits_ptr + row.to(tl.int64) * row_stride
    for v0 in range(v_start, v_end, BLOCK_V):
        cols = v0 + offs
        mask = cols < v_end
        x = tl.load(row_ptr + cols, mask=mask, other=float("-inf")).to(tl.float32)
        new_max = tl.maximum(running_max, tl.max(x, axis=0))
        running_sum = running_sum * tl.exp(running_max - new_max) + tl.sum(tl.exp(x - new_max), axis=0)
        running_max = new_max
        target_logit += tl.sum(tl.where(cols == target, x, 0.0), axis=0)
    out = row * n_splits + split
    tl.store(max_ptr + out, running_max)
    tl.store(sum_ptr + out, running_sum)
    tl.store(tgt_ptr + out, target_logit)


@triton.jit
def _linear_token_logprobs_kernel(hidden_ptr, weight_ptr, bias_ptr, targets_ptr, max_ptr, sum_ptr, tgt_ptr,
                                  N, V, H, v_per_split, n_splits, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
                                  BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr):
    block = tl.program_id(0)
    split = tl.program_id(1)
    rows = block * BLOCK_T + tl.arange(0, BLOCK_T)
    row_mask = rows < N
    targets = tl.load(targets_ptr + rows, mask=row_mask, other=-1)
    v_start = split * v_per_split
    v_end = tl.minimum(v_start + v_per_split, V)
    offs_v = tl.arange(0, BLOCK_V)
    offs_h = tl.arange(0, BLOCK_H)
    running_max = tl.full((BLOCK_T,), _NEG_BIG, tl.float32)
    running_sum = tl.zeros((BLOCK_T,), tl.float32)
    target_logit = tl.zeros((BLOCK_T,), tl.float32)
    rows64 = rows.to(tl.int64)
    for v0 in range(v_start, v_end, BLOCK_V):
        cols = v0 + offs_v
        col_mask = cols < v_end
        cols64 = cols.to(tl.int64)
        acc = tl.zeros((BLOCK_T, BLOCK_V), tl.float32)
        for h0 in range(0, H, BLOCK_H):
            hs = h0 + offs_h
            h_mask = hs < H
            a = tl.load(hidden_ptr + rows64[:, None] * H + hs[None, :], mask=row_mask[:, None] & h_mask[None, :],
                        other=0.0)
            # Weight tile loaded transposed, (BLOCK_H, BLOCK_V), straight from the (V, H) layout.
            b = tl.load(weight_ptr + cols64[None, :] * H + hs[:, None], mask=h_mask[:, None] & col_mask[None, :],
                        other=0.0)
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            if IEEE:
                acc = tl.dot(a, b, acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
        logits = tl.where(col_mask[None, :], acc, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(logits, axis=1))
        running_sum = running_sum * tl.exp(running_max - new_max) + tl.sum(tl.exp(logits - new_max[:, None]), axis=1)
        running_max = new_max
        target_logit += tl.sum(tl.where(cols[None, :] == targets[:, None], logits, 0.0), axis=1)
    out = rows * n_splits + split
    tl.store(max_ptr + out, running_max, mask=row_mask)
    tl.store(sum_ptr + out, running_sum, mask=row_mask)
    tl.store(tgt_ptr + out, target_logit, mask=row_mask)


def _merge(part_max: torch.Tensor, part_sum: torch.Tensor, part_tgt: torch.Tensor) -> torch.Tensor:
    row_max = part_max.max(dim=1).values
    total = (part_sum * torch.exp(part_max - row_max[:, None])).sum(dim=1)
    return part_tgt.sum(dim=1) - row_max - torch.log(total)


def _splits(vocab: int, block_v: int, programs_per_split: int) -> tuple[int, int]:
    """(n_splits, v_per_split): enough programs to fill a GPU, whole tiles per split."""
    tiles = triton.cdiv(vocab, block_v)
    if triton_interpreting():
        want = 2  # exercise the merge; the interpreter runs programs one by one
    else:
        sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        want = max(1, triton.cdiv(4 * sms, max(programs_per_split, 1)))
    n_splits = max(1, min(tiles, want))
    v_per_split = triton.cdiv(tiles, n_splits) * block_v
    return triton.cdiv(vocab, v_per_split), v_per_split


def token_logprobs_triton(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    n_rows, vocab = logits.shape
    block_v = 128 if triton_interpreting() else 2048
    n_splits, v_per_split = _splits(vocab, block_v, n_rows)
    shape = (n_rows, n_splits)
    part_max = torch.empty(shape, dtype=torch.float32, device=logits.device)
    part_sum = torch.empty_like(part_max)
    part_tgt = torch.empty_like(part_max)
    _token_logprobs_kernel[(n_rows, n_splits)](
        logits, logits.stride(0), targets, part_max, part_sum, part_tgt, vocab, v_per_split, n_splits,
        BLOCK_V=block_v, num_warps=1 if triton_interpreting() else 8,
    )
    return _merge(part_max, part_sum, part_tgt)


def linear_token_logprobs_triton(hidden: torch.Tensor, weight: torch.Tensor, bias, targets: torch.Tensor):
    hidden = hidden.contiguous()
    weight = weight.contiguous()
    n_rows, width = hidden.shape
    vocab = weight.shape[0]
    if triton_interpreting():
        block_t, block_v, block_h, warps, stages = 16, 32, 32, 1, 1
    else:
        block_t, block_v, block_h, warps, stages = 64, 128, 64, 8, 3
    n_blocks = triton.cdiv(n_rows, block_t)
    n_splits, v_per_split = _splits(vocab, block_v, n_blocks)
    shape = (n_rows, n_splits)
    part_max = torch.empty(shape, dtype=torch.float32, device=hidden.device)
    part_sum = torch.empty_like(part_max)
    part_tgt = torch.empty_like(part_max)
    # The interpreter computes bfloat16 dots wrongly; it gets float32 tiles instead.
    upcast = triton_interpreting() and hidden.dtype == torch.bfloat16
    bias_arg = bias.contiguous() if bias is not None else part_max  # never read without HAS_BIAS
    _linear_token_logprobs_kernel[(n_blocks, n_splits)](
        hidden, weight, bias_arg, targets, part_max, part_sum, part_tgt, n_rows, vocab, width, v_per_split,
        n_splits, HAS_BIAS=bias is not None, IEEE=hidden.dtype == torch.float32 or upcast, UPCAST=upcast,
        BLOCK_T=block_t, BLOCK_V=block_v, BLOCK_H=block_h, num_warps=warps, num_stages=stages,
    )
    return _merge(part_max, part_sum, part_tgt)
