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

Launch configuration: one per input dtype (:data:`LINEAR_CONFIGS`), the same
on a GPU and under the interpreter, so the tests run the tiles a GPU runs.
float16/bfloat16 tiles go to the tensor cores as they are (products exact in
the float32 accumulator).  float32 inputs use IEEE-precision dots (not TF32) to
stay within 1e-5 of the reference; those are FMA loops, not tensor-core
instructions, whose operands are held in registers, so float32 takes smaller
tiles (zero spills, <= 128 registers, checked by ``streammem_kernels.runtime.aot``).
The one difference left to the interpreter: it computes bfloat16 dots wrongly,
so there (and only there) bfloat16 tiles are upcast to float32 before the dot
(:func:`streammem_kernels.runtime.launch.interpreted_bf16`).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..runtime.launch import interpreted_bf16, multiprocessors

# -FLT_MAX: a global read inside @triton.jit must be a constexpr.
_NEG_BIG: tl.constexpr = tl.constexpr(-3.4028234663852886e38)

KERNEL_CONTRACTS = {
    "_token_logprobs_kernel": {"hot": True, "exact": False},
    "_linear_token_logprobs_kernel": {"hot": True, "exact": False},
}


class LinearConfig(NamedTuple):
    """Tile shape and launch options of ``_linear_token_logprobs_kernel``."""

    block_t: int
    block_v: int
    block_h: int
    num_warps: int
    num_stages: int


# Keyed on (dtype, H % 16 == 0): Triton specialises H on divisibility by 16, and
# an unaligned H turns the tile loads into per-element predicated loads that
# cannot be pipelined through shared memory, so those launches take one stage
# and a smaller 16-bit tile.  Every entry compiles for sm_80 and sm_90 with zero
# spills, <= 128 registers and <= 48 KB of shared memory (sm_86/sm_89 cards
# included): `python -m streammem_kernels.runtime.aot check tests/gpu_readiness/triton_scenarios.py
# --only logprobs` prints the figures.
LINEAR_CONFIGS = {
    (torch.float16, True): LinearConfig(block_t=64, block_v=128, block_h=32, num_warps=8, num_stages=3),
    (torch.bfloat16, True): LinearConfig(block_t=64, block_v=128, block_h=32, num_warps=8, num_stages=3),
    (torch.float32, True): LinearConfig(block_t=64, block_v=64, block_h=16, num_warps=8, num_stages=3),
    (torch.float16, False): LinearConfig(block_t=64, block_v=64, block_h=16, num_warps=8, num_stages=1),
    (torch.bfloat16, False): LinearConfig(block_t=64, block_v=64, block_h=16, num_warps=8, num_stages=1),
    (torch.float32, False): LinearConfig(block_t=64, block_v=64, block_h=16, num_warps=8, num_stages=1),
}
TOKEN_BLOCK_V = 2048
TOKEN_WARPS = 8
# Programs per streaming multiprocessor a vocabulary split aims for.
_PROGRAMS_PER_SM = 4


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
                                  N, V, H, v_per_split, n_splits, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
                                  UPCAST: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr,
                                  BLOCK_H: tl.constexpr):
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
    hidden_rows = hidden_ptr + rows.to(tl.int64)[:, None] * H
    for v0 in range(v_start, v_end, BLOCK_V):
        cols = v0 + offs_v
        col_mask = cols < v_end
        weight_rows = weight_ptr + cols.to(tl.int64)[:, None] * H
        acc = tl.zeros((BLOCK_T, BLOCK_V), tl.float32)
        for h0 in range(0, H, BLOCK_H):
            hs = h0 + offs_h
            h_mask = hs < H
            a = tl.load(hidden_rows + hs[None, :], mask=row_mask[:, None] & h_mask[None, :], other=0.0)
            # (BLOCK_V, BLOCK_H) rows of the (V, H) head, contiguous along H; the dot takes its transpose.
            b = tl.load(weight_rows + hs[None, :], mask=col_mask[:, None] & h_mask[None, :], other=0.0)
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            if IEEE:
                acc = tl.dot(a, tl.trans(b), acc, input_precision="ieee")
            else:
                acc = tl.dot(a, tl.trans(b), acc)
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


def linear_config(dtype: torch.dtype, width: int) -> LinearConfig:
    """The tile configuration of ``linear_token_logprobs`` for ``dtype`` hidden states of width ``width``."""
    return LINEAR_CONFIGS[(dtype, width % 16 == 0)]


def _merge(part_max: torch.Tensor, part_sum: torch.Tensor, part_tgt: torch.Tensor) -> torch.Tensor:
    row_max = part_max.max(dim=1).values
    total = (part_sum * torch.exp(part_max - row_max[:, None])).sum(dim=1)
    return part_tgt.sum(dim=1) - row_max - torch.log(total)


def _splits(vocab: int, block_v: int, row_programs: int, device: torch.device) -> tuple[int, int]:
    """(n_splits, v_per_split): enough programs to fill the GPU's multiprocessors, whole tiles per split."""
    tiles = triton.cdiv(vocab, block_v)
    want = max(1, triton.cdiv(_PROGRAMS_PER_SM * multiprocessors(device), max(row_programs, 1)))
    n_splits = max(1, min(tiles, want))
    v_per_split = triton.cdiv(tiles, n_splits) * block_v
    return triton.cdiv(vocab, v_per_split), v_per_split


def _partials(n_rows: int, n_splits: int, device: torch.device):
    part_max = torch.empty((n_rows, n_splits), dtype=torch.float32, device=device)
    return part_max, torch.empty_like(part_max), torch.empty_like(part_max)


def token_logprobs_triton(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    n_rows, vocab = logits.shape
    n_splits, v_per_split = _splits(vocab, TOKEN_BLOCK_V, n_rows, logits.device)
    part_max, part_sum, part_tgt = _partials(n_rows, n_splits, logits.device)
    _token_logprobs_kernel[(n_rows, n_splits)](
        logits, logits.stride(0), targets, part_max, part_sum, part_tgt, vocab, v_per_split, n_splits,
        BLOCK_V=TOKEN_BLOCK_V, num_warps=TOKEN_WARPS, enable_fp_fusion=True,
    )
    return _merge(part_max, part_sum, part_tgt)


def linear_token_logprobs_triton(hidden: torch.Tensor, weight: torch.Tensor, bias, targets: torch.Tensor):
    hidden = hidden.contiguous()
    weight = weight.contiguous()
    n_rows, width = hidden.shape
    vocab = weight.shape[0]
    cfg = linear_config(hidden.dtype, width)
    n_blocks = triton.cdiv(n_rows, cfg.block_t)
    n_splits, v_per_split = _splits(vocab, cfg.block_v, n_blocks, hidden.device)
    part_max, part_sum, part_tgt = _partials(n_rows, n_splits, hidden.device)
    upcast = interpreted_bf16(hidden.dtype)
    bias_arg = bias.contiguous() if bias is not None else part_max  # never read without HAS_BIAS
    _linear_token_logprobs_kernel[(n_blocks, n_splits)](
        hidden, weight, bias_arg, targets, part_max, part_sum, part_tgt, n_rows, vocab, width, v_per_split,
        n_splits, HAS_BIAS=bias is not None, IEEE=hidden.dtype == torch.float32 or upcast, UPCAST=upcast,
        BLOCK_T=cfg.block_t, BLOCK_V=cfg.block_v, BLOCK_H=cfg.block_h, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, enable_fp_fusion=True,
    )
    return _merge(part_max, part_sum, part_tgt)
