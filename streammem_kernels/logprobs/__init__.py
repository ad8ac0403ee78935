"""Gathered token log-probabilities and the caption divergence point.

StreamRAG's Knowledge Extraction Accelerator (sec. 3.3) re-scores the previous
event's caption under the new event's prompt and keeps the caption up to the
first sharp drop in token log-probability.  Three kernels serve it:

* ``token_logprobs(logits, targets)`` -- ``log p(target)`` per position from
  given logits, through an online log-sum-exp over vocabulary tiles, so no
  ``(T, V)`` log-softmax is ever materialised;
* ``linear_token_logprobs(hidden, weight, targets, bias)`` -- the same from the
  last hidden states and the LM head, without materialising the ``(T, V)``
  logits either: the vocabulary is walked in tiles, each tile's logits come
  from one matmul, and a running max / running sum of exponentials plus a
  gather of the target logit are all that survive a tile (as in
  cut-cross-entropy);
* ``divergence_point(logprobs, delta, alpha, beta, lengths)`` -- the paper's
  Eq. 9-10, batched.

Numerics shared by every backend: logits (and, for the linear form, the
products ``hidden @ weight.T``) are accumulated in float32 whatever the input
dtype (float16/bfloat16 are upcast on load); the result is float32, or float64
for float64 input (torch backend only).  ``-inf`` logits are allowed (masked
vocabulary entries); NaN or ``+inf`` anywhere in a row makes that row's result
NaN inside the kernels, and the public functions turn that into a
``ValueError`` instead of returning NaN silently.

On CUDA tensors nothing here synchronises with the host: the value checks
(targets in range, finite inputs, NaN results, lengths) are device-side
assertions (``streammem_kernels.runtime.validate.check_values``) that surface at the next
synchronisation as a "device-side assert triggered" error with the same
message, so every function can be captured in a CUDA graph.  On CPU tensors
they raise ``ValueError`` at once.

Divergence-point convention (0-indexed).  Caption tokens ``c[0..L-1]``;
``lp[j] = log p(c[j] | prefix, c[0..j-1])``.  For ``j`` from ``delta+1`` to
``L-1``, ``mu_j = mean(lp[j-delta .. j-1])``; the divergence point ``o`` is the
first ``j`` with ``mu_j - lp[j] > max(alpha * |mu_j|, beta)``; the kept prefix
is ``c[0..o-1]``.  When no ``j`` qualifies (including ``L <= delta + 1``),
``o = L``.  Means and comparisons are evaluated in float64.

Backends: ``torch`` (row-chunked / vocabulary-chunked PyTorch; the plain
``*_reference`` functions below are the spec the tests compare against),
``cpp`` (OpenMP over rows or vocabulary tiles, a packed AVX2 micro-kernel for
the linear form), ``triton`` (one program per row / per (row block, vocabulary
split) with ``tl.dot`` tiles).  ``divergence_point`` is O(L) per caption and has
``torch`` and ``cpp`` backends only: it returns a tensor (no host round trip),
and on a GPU its torch backend is a handful of small kernels on (B, L) with no
synchronisation, far from the log-prob passes that dominate (a Triton kernel
would save launches, not time that shows).

Per-call fast paths (one caption, one short sequence): with ``backend="auto"``
(no ``STREAMMEM_BACKEND`` override) or ``"cpp"``, C-contiguous CPU tensors
without autograd of the kernel dtypes (float32/float16/bfloat16 logits and
int64 targets; float32/float64 log-probs, int64 lengths) and plain Python
parameters go straight to one native call that also makes the value checks
above, with the same ``ValueError`` messages and bit-identical results; every
other input takes the general path.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..runtime.dispatch import Op, call_op, load_native
from ..runtime.native import NativeChecks, view
from ..runtime.validate import (as_tensor, check_dtype, check_finite, check_float, check_int, check_nonempty,
                                check_rank, check_values, host_checks, sized_message)
from .reference import (compute_dtype, divergence_point_reference, divergence_point_torch,
                        linear_token_logprobs_reference, linear_token_logprobs_torch, token_logprobs_reference,
                        token_logprobs_torch)

__all__ = [
    "token_logprobs",
    "linear_token_logprobs",
    "divergence_point",
    "token_logprobs_reference",
    "linear_token_logprobs_reference",
    "divergence_point_reference",
]

_LOGIT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_KERNEL_DTYPE_SET = frozenset(_KERNEL_DTYPES)
_TARGET_DTYPES = (torch.int64, torch.int32, torch.int16, torch.uint8)


# --------------------------------------------------------------------------
# Public functions: contract, validation, preparation
# --------------------------------------------------------------------------
def token_logprobs(logits, targets, *, backend: str = "auto") -> torch.Tensor:
    """Log-probability of each target token under ``softmax(logits)``.

    Parameters
    ----------
    logits : (T, V) or (B, T, V) tensor or array, float32/float16/bfloat16
        (float64 on the torch backend).  Any strides; rows are read in place
        when the vocabulary dimension is contiguous.  Not modified.
    targets : (T,) or (B, T) integer tensor or array
        Token ids in ``[0, V)``; shape ``logits.shape[:-1]``.
    backend : {"auto", "torch", "cpp", "triton"}

    Returns
    -------
    (T,) or (B, T) float32 tensor (float64 for float64 logits):
    ``log_softmax(logits.float(), -1).gather(-1, targets)``, computed with an
    online log-sum-exp, with O(T) extra memory on the cpp/triton backends.
    """
    fast = TOKEN_LOGPROBS.run_fast(backend, logits, targets)
    if fast is not None:
        return fast
    logits = as_tensor(logits, "logits")
    targets = as_tensor(targets, "targets")
    check_rank(logits, "logits", (2, 3), "(T, V) or (B, T, V)")
    check_dtype(logits, "logits", _LOGIT_DTYPES)
    check_nonempty(logits, "logits")
    vocab = logits.shape[-1]
    rows2d = _as_rows(logits)
    flat_targets = _check_targets(targets, logits.shape[:-1], vocab, logits.device, "logits.shape[:-1]")
    name = TOKEN_LOGPROBS.select(backend, logits.device, dtype=logits.dtype)
    out = call_op(torch.ops.streammem.token_logprobs, TOKEN_LOGPROBS.impls, name, rows2d, flat_targets)
    _raise_on_nan(out, "logits")
    return out.reshape(logits.shape[:-1])


def linear_token_logprobs(hidden, weight, targets, bias=None, *, backend: str = "auto") -> torch.Tensor:
    """Log-probability of each target token under ``softmax(hidden @ weight.T + bias)``.

    Parameters
    ----------
    hidden : (T, H) or (B, T, H) tensor or array, float32/float16/bfloat16
        (float64 on the torch backend): last hidden states.  Not modified.
    weight : (V, H) tensor or array, same dtype as ``hidden``: the LM head.
    targets : (T,) or (B, T) integer tensor or array, ids in ``[0, V)``.
    bias : (V,) tensor or array, optional, same dtype as ``hidden``.
    backend : {"auto", "torch", "cpp", "triton"}

    Returns
    -------
    (T,) or (B, T) float32 tensor (float64 for float64 input):
    ``log_softmax(hidden.float() @ weight.float().T + bias, -1).gather(targets)``.
    No backend materialises the ``(T, V)`` logits; the torch backend holds one
    ``(T, V_chunk)`` float32 tile at a time, cpp/triton only O(T) state.

    """
    hidden = as_tensor(hidden, "hidden")
    weight = as_tensor(weight, "weight")
    targets = as_tensor(targets, "targets")
    check_rank(hidden, "hidden", (2, 3), "(T, H) or (B, T, H)")
    check_dtype(hidden, "hidden", _LOGIT_DTYPES)
    check_nonempty(hidden, "hidden")
    check_rank(weight, "weight", (2,), "(V, H)")
    check_nonempty(weight, "weight")
    if weight.dtype != hidden.dtype:
        raise ValueError(f"weight must have the dtype of hidden ({hidden.dtype}), got {weight.dtype}")
    if weight.shape[1] != hidden.shape[-1]:
        raise ValueError(
            f"weight must have shape (V, H) with H = hidden.shape[-1] = {hidden.shape[-1]}, got {tuple(weight.shape)}"
        )
    if weight.device != hidden.device:
        raise ValueError(f"weight must be on the device of hidden ({hidden.device}), got {weight.device}")
    vocab = weight.shape[0]
    if bias is not None:
        bias = as_tensor(bias, "bias")
        if bias.shape != (vocab,):
            raise ValueError(f"bias must have shape (V,) = ({vocab},), got {tuple(bias.shape)}")
        if bias.dtype != hidden.dtype or bias.device != hidden.device:
            raise ValueError(f"bias must have the dtype and device of hidden ({hidden.dtype}, {hidden.device})")
        check_finite(bias, "bias")
    check_finite(hidden, "hidden")
    rows2d = hidden.reshape(-1, hidden.shape[-1])
    flat_targets = _check_targets(targets, hidden.shape[:-1], vocab, hidden.device, "hidden.shape[:-1]")
    name = LINEAR_TOKEN_LOGPROBS.select(backend, hidden.device, dtype=hidden.dtype)
    out = call_op(torch.ops.streammem.linear_token_logprobs, LINEAR_TOKEN_LOGPROBS.impls, name, rows2d, weight, bias,
                  flat_targets)
    if out.numel() and host_checks(out) and bool(torch.isnan(out).any()):
        raise ValueError(_linear_nan_message(out, weight))
    _raise_on_nan(out, "hidden @ weight.T (hidden and weight)")  # device-side (CUDA, torch.compile)
    return out.reshape(hidden.shape[:-1])


def divergence_point(logprobs, *, delta: int = 20, alpha: float = 0.85, beta: float = 1.0, lengths=None,
                     backend: str = "auto") -> torch.Tensor:
    """First position whose log-probability drops sharply below its moving average (Eq. 9-10).

    Parameters
    ----------
    logprobs : (L,) or (B, L) floating tensor or array
        ``lp[j] = log p(c[j] | prefix, c[0..j-1])`` of each caption token
        (batched captions right-padded to a common L).  Must be finite within
        each caption's length.
    delta : int >= 1
        Moving-average window (the paper's delta = 20).
    alpha : float in (0, 1)
        Relative drop threshold (0.85).
    beta : float > 0
        Absolute drop threshold in nats (1.0).
    lengths : (B,) integer tensor or array, optional
        Caption lengths in ``[0, L]``; default: every caption has length L.
        Only valid for 2-D ``logprobs``.
    backend : {"auto", "torch", "cpp"}

    Returns
    -------
    int64 tensor, 0-d for (L,) input, (B,) for (B, L): the divergence point o
    (the number of caption tokens to keep), ``o = length`` when no position
    qualifies.  See the module docstring for the exact convention.
    """
    fast = DIVERGENCE_POINT.run_fast(backend, logprobs, delta, alpha, beta, lengths)
    if fast is not None:
        return fast
    logprobs = as_tensor(logprobs, "logprobs")
    check_rank(logprobs, "logprobs", (1, 2), "(L,) or (B, L)")
    check_dtype(logprobs, "logprobs", _LOGIT_DTYPES)
    delta = check_int(delta, "delta", minimum=1)
    alpha = check_float(alpha, "alpha", low=0.0, high=1.0, low_open=True, high_open=True)
    beta = check_float(beta, "beta", low=0.0, low_open=True)
    single = logprobs.dim() == 1
    lp2d = logprobs.reshape(1, -1) if single else logprobs
    batch, max_len = lp2d.shape
    # A window longer than the captions averages the same positions as one of length L: clamped, so any int
    # gives the answer of the largest meaningful one (and never overflows the native int64 argument).
    delta = min(delta, max(max_len, 1))
    if lengths is None:
        lens = torch.full((batch,), max_len, dtype=torch.int64, device=lp2d.device)
    else:
        if single:
            raise ValueError("lengths is only accepted with batched (B, L) logprobs")
        lens = as_tensor(lengths, "lengths")
        check_dtype(lens, "lengths", _TARGET_DTYPES)
        if lens.shape != (batch,):
            raise ValueError(f"lengths must have shape (B,) = ({batch},), got {tuple(lens.shape)}")
        lens = lens.to(device=lp2d.device, dtype=torch.int64)
        if lens.numel():
            low, high = torch.aminmax(lens)
            check_values((low >= 0) & (high <= max_len), sized_message(_LENGTHS_RANGE, L=max_len))
    if lp2d.numel():
        # Padding past a caption's length may hold anything; no boolean-mask indexing (a host sync).
        valid = torch.arange(max_len, device=lp2d.device)[None, :] < lens[:, None]
        check_values((torch.isfinite(lp2d) | ~valid).all(), _LOGPROBS_FINITE)
    lp64 = lp2d.to(torch.float64).contiguous()
    name = DIVERGENCE_POINT.select(backend, lp64.device)
    out = call_op(torch.ops.streammem.divergence_point, DIVERGENCE_POINT.impls, name, lp64, lens.contiguous(), delta,
                  alpha, beta)
    return out[0] if single else out


_TENSOR, _STRIDED, _F32, _F64, _I64 = torch.Tensor, torch.strided, torch.float32, torch.float64, torch.int64
_INF = float("inf")
# The latency paths allocate their results through numpy (about 0.7 us against 1.4 for torch.empty
# with a shape tuple and a dtype); the tensors own that memory like any other.
_from_numpy, _np_empty, _NP_F32, _NP_I64 = torch.from_numpy, np.empty, np.float32, np.int64


def _plain_cpu(t: torch.Tensor) -> bool:
    """A C-contiguous CPU tensor without autograd: what the latency paths hand to the C++ entries as
    it is (anything else takes the general path)."""
    return t.is_cpu and not t.requires_grad and t.layout is _STRIDED and t.is_contiguous()


def _as_rows(logits: torch.Tensor) -> torch.Tensor:
    """(N, V) view of the logits rows; copies only when the vocabulary dim is strided."""
    rows = logits.reshape(-1, logits.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    return rows


def _check_targets(targets: torch.Tensor, expected_shape, vocab: int, device, shape_doc: str) -> torch.Tensor:
    check_dtype(targets, "targets", _TARGET_DTYPES)
    if tuple(targets.shape) != tuple(expected_shape):
        raise ValueError(f"targets must have shape {shape_doc} = {tuple(expected_shape)}, got {tuple(targets.shape)}")
    flat = targets.reshape(-1).to(device=device, dtype=torch.int64).contiguous()
    if flat.numel():
        low, high = torch.aminmax(flat)
        if host_checks(flat):  # a host check, with the offending range
            low, high = int(low), int(high)
            if low < 0 or high >= vocab:
                raise ValueError(_targets_message(vocab, flat))
        else:  # a device-side assertion (CUDA, torch.compile): no synchronisation
            check_values((low >= 0) & (high < vocab), sized_message(_TARGETS_RANGE, vocab=vocab))
    return flat


# The value checks, each message written once: the general path raises them from Python, the C++
# entries report them by number (their NativeChecks below).
_TARGETS_RANGE = "targets must be token ids in [0, V) = [0, {vocab})"
_NAN_WHY = "(a NaN or +inf logit, or a row that is all -inf)"
_LENGTHS_RANGE = "lengths must lie in [0, L] = [0, {L}]"
_LOGPROBS_FINITE = "logprobs (within lengths) must be finite, found NaN or Inf"


def _targets_message(vocab: int, targets: torch.Tensor) -> str:
    low, high = torch.aminmax(targets)
    return f"{_TARGETS_RANGE.format(vocab=vocab)}, got values in [{int(low)}, {int(high)}]"


def _nan_rows_message(source: str, out: torch.Tensor) -> str:
    rows = torch.nonzero(torch.isnan(out.reshape(-1))).flatten()[:5].tolist()
    return f"{source} must be finite: rows {rows} produced NaN {_NAN_WHY}"


def _linear_nan_message(out: torch.Tensor, weight: torch.Tensor) -> str:
    """Why rows of ``linear_token_logprobs`` came out NaN: a non-finite ``weight``, or finite inputs whose
    logits overflow (huge ``hidden`` or ``weight``); ``hidden`` and ``bias`` were checked finite before."""
    if not bool(torch.isfinite(weight).all()):
        return _nan_rows_message("weight", out)
    rows = torch.nonzero(torch.isnan(out.reshape(-1))).flatten()[:5].tolist()
    return (f"hidden @ weight.T must stay finite: rows {rows} of hidden give logits beyond the float range "
            f"(|hidden| x |weight| too large); scale hidden or weight down")


def _raise_on_nan(out: torch.Tensor, source: str) -> None:
    # A NaN or +inf anywhere in a row poisons that row's running sum, so checking
    # the O(T) output replaces an O(T*V) scan (and its (T, V) boolean mask).
    if not out.numel():
        return
    if host_checks(out):
        if bool(torch.isnan(out).any()):
            raise ValueError(_nan_rows_message(source, out))
    else:  # a device-side assertion (CUDA, torch.compile): no synchronisation
        check_values(~torch.isnan(out).any(), f"{source} must be finite: some row produced NaN {_NAN_WHY}")


# --------------------------------------------------------------------------
# Custom ops (work under torch.compile; opcheck-tested)
# --------------------------------------------------------------------------
@torch.library.custom_op("streammem::token_logprobs", mutates_args=())
def _token_logprobs_op(logits: torch.Tensor, targets: torch.Tensor, backend: str) -> torch.Tensor:
    """``torch.ops.streammem.token_logprobs`` (its schema: docs/compile.md).

    Core op: logits (N, V) with unit vocabulary stride, targets (N,) int64 in range."""
    return TOKEN_LOGPROBS.impls[backend](logits, targets)


@_token_logprobs_op.register_fake
def _(logits, targets, backend):
    return logits.new_empty((logits.shape[0],), dtype=compute_dtype(logits.dtype))


@torch.library.custom_op("streammem::linear_token_logprobs", mutates_args=())
def _linear_token_logprobs_op(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                              targets: torch.Tensor, backend: str) -> torch.Tensor:
    """``torch.ops.streammem.linear_token_logprobs`` (its schema: docs/compile.md).

    Core op: hidden (N, H), weight (V, H), bias (V,) or None, targets (N,) int64 in range."""
    return LINEAR_TOKEN_LOGPROBS.impls[backend](hidden, weight, bias, targets)


@_linear_token_logprobs_op.register_fake
def _(hidden, weight, bias, targets, backend):
    return hidden.new_empty((hidden.shape[0],), dtype=compute_dtype(hidden.dtype))


@torch.library.custom_op("streammem::divergence_point", mutates_args=())
def _divergence_point_op(logprobs: torch.Tensor, lengths: torch.Tensor, delta: int, alpha: float, beta: float,
                         backend: str) -> torch.Tensor:
    """``torch.ops.streammem.divergence_point`` (its schema: docs/compile.md).

    Core op: contiguous (B, L) float64 log-probs, (B,) int64 lengths -> (B,) int64."""
    return DIVERGENCE_POINT.impls[backend](logprobs, lengths, delta, alpha, beta)


@_divergence_point_op.register_fake
def _(logprobs, lengths, delta, alpha, beta, backend):
    return logprobs.new_empty((logprobs.shape[0],), dtype=torch.int64)


# --------------------------------------------------------------------------
# Backend: C++ (csrc/cpu/logprobs.cpp), and the latency paths the Op tables declare
# --------------------------------------------------------------------------
_TOKEN_CHECKS = NativeChecks(lambda vocab, targets, out, source: _targets_message(vocab, targets),
                             lambda vocab, targets, out, source: _nan_rows_message(source, out))
_LINEAR_CHECKS = NativeChecks(lambda out, weight: _linear_nan_message(out, weight))
_DIVERGENCE_CHECKS = NativeChecks(_LENGTHS_RANGE, _LOGPROBS_FINITE)


def _token_logprobs_cpp(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    mod, _ = load_native("cpu", "logprobs")
    out = torch.empty(logits.shape[0], dtype=torch.float32)
    _TOKEN_CHECKS.raise_for(mod.token_logprobs(view(logits), view(targets), view(out)), vocab=logits.shape[1],
                            targets=targets, out=out, source="logits")
    return out


def _token_logprobs_fast(mod, logits, targets):
    """token_logprobs on C-contiguous CPU tensors of the kernel dtypes with int64 targets: one native call,
    which also makes the value checks."""
    if not (type(logits) is _TENSOR and type(targets) is _TENSOR and targets.dtype is _I64
            and logits.dtype in _KERNEL_DTYPE_SET and _plain_cpu(logits) and _plain_cpu(targets)):
        return None
    shape = logits.shape
    if not (2 <= len(shape) <= 3 and targets.shape == shape[:-1] and logits.numel()):
        return None
    out = _from_numpy(_np_empty(shape[:-1], _NP_F32))
    _TOKEN_CHECKS.raise_for(mod.token_logprobs(view(logits), view(targets), view(out)), vocab=shape[-1],
                            targets=targets, out=out, source="logits")
    return out


def _linear_token_logprobs_cpp(hidden, weight, bias, targets):
    mod, _ = load_native("cpu", "logprobs")
    out = torch.empty(hidden.shape[0], dtype=torch.float32)
    bias_view = None if bias is None else view(bias.contiguous())
    status = mod.linear_token_logprobs(view(hidden.contiguous()), view(weight.contiguous()), bias_view, view(targets),
                                       view(out))
    _LINEAR_CHECKS.raise_for(status, out=out, weight=weight)
    return out


def _divergence_point_cpp(logprobs, lengths, delta, alpha, beta):
    mod, _ = load_native("cpu", "logprobs")
    out = torch.empty(logprobs.shape[0], dtype=torch.int64)
    _DIVERGENCE_CHECKS.raise_for(mod.divergence_point(view(logprobs), view(lengths), int(delta), float(alpha),
                                                      float(beta), view(out)), L=logprobs.shape[1])
    return out


def _divergence_point_fast(mod, logprobs, delta, alpha, beta, lengths):
    """divergence_point on a C-contiguous float32/float64 CPU tensor, plain Python parameters within their
    ranges and int64 lengths (or none): one native call, which also makes the value checks."""
    if not (type(logprobs) is _TENSOR and type(delta) is int and delta >= 1 and type(alpha) is float
            and 0.0 < alpha < 1.0 and type(beta) is float and 0.0 < beta < _INF):
        return None
    dtype, shape = logprobs.dtype, logprobs.shape
    nd = len(shape)
    if not ((dtype is _F64 or dtype is _F32) and (nd == 1 or nd == 2) and logprobs.numel() and _plain_cpu(logprobs)):
        return None
    batch, max_len = (1, shape[0]) if nd == 1 else shape
    if not (lengths is None or (nd == 2 and type(lengths) is _TENSOR and lengths.dtype is _I64
                                and lengths.shape == (batch,) and _plain_cpu(lengths))):
        return None
    out = _from_numpy(_np_empty(() if nd == 1 else batch, _NP_I64))
    status = mod.divergence_point(view(logprobs), None if lengths is None else view(lengths), min(delta, max_len),
                                  alpha, beta, view(out))
    _DIVERGENCE_CHECKS.raise_for(status, L=max_len)
    return out


# --------------------------------------------------------------------------
# Backend: Triton (streammem_kernels/logprobs/_triton.py)
# --------------------------------------------------------------------------
def _token_logprobs_triton(logits, targets):
    from ._triton import token_logprobs_triton

    return token_logprobs_triton(logits, targets)


def _linear_token_logprobs_triton(hidden, weight, bias, targets):
    from ._triton import linear_token_logprobs_triton

    return linear_token_logprobs_triton(hidden, weight, bias, targets)


def _kernel_dtype_reasons(device, dtype=None, **_):
    if dtype is not None and dtype not in _KERNEL_DTYPES:
        return [f"dtype {dtype} is not supported (float32, float16, bfloat16 only); use backend='torch'"]
    return []


# (atol, rtol) of each backend against the float32 reference computed from the
# same (rounded) inputs; float64 against the float64 reference.  Inputs are
# upcast exactly (and 16-bit products are exact in the float32 accumulator,
# tensor cores included), so the only error is float32 summation order and the
# polynomial exp of the kernels; the linear form adds an H-term dot per logit.
_TOKEN_TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-5, 1e-5), torch.bfloat16: (2e-5, 1e-5)}
_LINEAR_TOL = {torch.float32: (3e-5, 1e-5), torch.float16: (6e-5, 1e-5), torch.bfloat16: (6e-5, 1e-5)}
_FLOAT64_TOL = {torch.float64: (1e-12, 1e-12)}

TOKEN_LOGPROBS = Op(
    "logprobs",
    {"torch": token_logprobs_torch, "cpp": _token_logprobs_cpp, "triton": _token_logprobs_triton},
    extra_reasons={"cpp": _kernel_dtype_reasons, "triton": _kernel_dtype_reasons},
    tolerances={"torch": {**_TOKEN_TOL, **_FLOAT64_TOL}, "cpp": _TOKEN_TOL, "triton": _TOKEN_TOL},
    fast=_token_logprobs_fast,
)
LINEAR_TOKEN_LOGPROBS = Op(
    "logprobs",
    {"torch": linear_token_logprobs_torch, "cpp": _linear_token_logprobs_cpp,
     "triton": _linear_token_logprobs_triton},
    extra_reasons={"cpp": _kernel_dtype_reasons, "triton": _kernel_dtype_reasons},
    tolerances={"torch": {**_LINEAR_TOL, **_FLOAT64_TOL}, "cpp": _LINEAR_TOL, "triton": _LINEAR_TOL},
)
# Integer results: every backend must match exactly.
DIVERGENCE_POINT = Op("logprobs", {"torch": divergence_point_torch, "cpp": _divergence_point_cpp},
                      tolerances={b: {dt: (0, 0) for dt in _LOGIT_DTYPES} for b in ("torch", "cpp")},
                      fast=_divergence_point_fast)
