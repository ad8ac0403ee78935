"""CUDA backend of the motion op: the per-level stages of ``reference.pyramid_flow`` (``CUDA_STAGES``).

The stages of the Triton backend (pyramid reduce, guess, warp, structure products, the fields of the
window solve, the coarsest level's shift search) as the kernels of ``csrc/cuda/motion.cu``, launched
on torch's current stream through the library's C ABI (``PROTOTYPES``).  Bit for bit with the
reference (``docs/ops/motion.md``); no host synchronisation, so capturable in a CUDA graph.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from ..runtime import cuda as native_cuda
from ..runtime.cuda import F32, I32, I64, P
from ..runtime.dispatch import load_native
from .reference import GUESS_BOX, SEARCH_QUANT, shift_of_sads, to_unit_float

# The launchers of csrc/cuda/motion.cu: {function: (restype, argtypes)} (tests/gpu_readiness/test_cuda_compile.py checks that
# a build exports exactly these).
PROTOTYPES = {
    "streammem_motion_products": (I32, (P, P, I32, P, I64, I64, I64, F32, P)),
    "streammem_motion_fields": (I32, (P, P, P, I64, I64, I64, I64, F32, I64, I64, I64, P)),
    "streammem_motion_guess": (I32, (P, P, I64, I64, I64, I64, P)),
    "streammem_motion_warp": (I32, (P, I32, P, P, I64, I64, I64, I64, I64, I64, I64, P)),
    "streammem_motion_reduce": (I32, (P, I32, P, I64, I64, I64, F32, P)),
    "streammem_motion_search": (I32, (P, P, P, I64, I64, I64, I64, I64, F32, P)),
}


def _module():
    mod, why = load_native("cuda", "motion")
    if mod is None:
        raise RuntimeError(why)
    return mod


def _frames(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """Contiguous uint8 or float32 frames (other dtypes never reach the stages)."""
    x = x.contiguous()
    if x.dtype == torch.uint8:
        return x, True
    return x.to(torch.float32), False


def products_cuda(prev: torch.Tensor, cur: torch.Tensor) -> torch.Tensor:
    """(P, 5, H-2, W-2) float32 products of (P, H, W) uint8/float32 CUDA frame pairs."""
    mod = _module()
    prev, is_uint8 = _frames(prev)
    cur, _ = _frames(cur)
    pairs, H, W = prev.shape
    prods = torch.empty((pairs, 5, H - 2, W - 2), dtype=torch.float32, device=prev.device)
    with torch.cuda.device(prev.device):
        mod.call("streammem_motion_products", prev.data_ptr(), cur.data_ptr(), int(is_uint8), prods.data_ptr(), pairs,
                 H, W, 1.0 / 255.0 if is_uint8 else 1.0, native_cuda.stream_handle(prev.device))
    return prods


def structure_products_cuda(gray: torch.Tensor) -> torch.Tensor:
    """(T-1, 5, H-2, W-2) products of every consecutive pair of (T, H, W) CUDA frames."""
    return products_cuda(gray[:-1], gray[1:])


def flow_fields_cuda(prods: torch.Tensor, window: int, min_eig: float, guess: torch.Tensor | None = None,
                     level_hw=None, factor: int = 2) -> torch.Tensor:
    """(P, 4, Ho, Wo) float32 fields |flow|, u, v, valid of (P, 5, Hg, Wg) products (composed with the
    whole-pixel offsets of ``guess``, ``factor`` times coarser, when given)."""
    mod = _module()
    pairs, _, Hg, Wg = prods.shape
    fields = torch.empty((pairs, 4, Hg - window + 1, Wg - window + 1), dtype=torch.float32, device=prods.device)
    Hc, Wc = (1, 1) if guess is None else guess.shape[2:]
    with torch.cuda.device(prods.device):
        mod.call("streammem_motion_fields", prods.data_ptr(), fields.data_ptr(),
                 None if guess is None else guess.data_ptr(), pairs, Hg, Wg, window, float(min_eig), Hc, Wc,
                 factor if guess is not None else 2, native_cuda.stream_handle(prods.device))
    return fields


def guess_field_cuda(fields: torch.Tensor) -> torch.Tensor:
    """(P, 2, Ho, Wo) float32: ``reference.guess_field(fields)``."""
    mod = _module()
    pairs, _, Ho, Wo = fields.shape
    guess = torch.empty((pairs, 2, Ho, Wo), dtype=torch.float32, device=fields.device)
    with torch.cuda.device(fields.device):
        mod.call("streammem_motion_guess", fields.data_ptr(), guess.data_ptr(), pairs, Ho, Wo, GUESS_BOX,
                 native_cuda.stream_handle(fields.device))
    return guess


def warp_frames_cuda(cur: torch.Tensor, guess: torch.Tensor, border: int, factor: int) -> torch.Tensor:
    """(P, H, W) frames moved by the guess's whole-pixel offsets, in ``cur``'s dtype (uint8/float32)."""
    mod = _module()
    cur, is_uint8 = _frames(cur)
    pairs, H, W = cur.shape
    out = torch.empty_like(cur)
    with torch.cuda.device(cur.device):
        mod.call("streammem_motion_warp", cur.data_ptr(), int(is_uint8), guess.data_ptr(), out.data_ptr(), pairs, H,
                 W, guess.shape[2], guess.shape[3], border, factor, native_cuda.stream_handle(cur.device))
    return out


def reduce_level_cuda(frames: torch.Tensor) -> torch.Tensor:
    """(T, (H+1)//2, (W+1)//2) float32: ``reference.reduce_level(frames)``."""
    mod = _module()
    frames, is_uint8 = _frames(frames)
    T, H, W = frames.shape
    out = torch.empty((T, (H + 1) // 2, (W + 1) // 2), dtype=torch.float32, device=frames.device)
    with torch.cuda.device(frames.device):
        mod.call("streammem_motion_reduce", frames.data_ptr(), int(is_uint8), out.data_ptr(), T, H, W,
                 1.0 / 255.0 if is_uint8 else 1.0, native_cuda.stream_handle(frames.device))
    return out


def search_shift_cuda(prev: torch.Tensor, cur: torch.Tensor, radius) -> torch.Tensor:
    """(P, 2, 1, 1) float32: ``reference.search_shift(prev, cur, radius)`` (integer sums of absolute
    differences on the device, the reference's choice of the shift)."""
    mod = _module()
    prev, cur = to_unit_float(prev).contiguous(), to_unit_float(cur).contiguous()
    pairs, H, W = prev.shape
    ry, rx = radius
    sads = torch.empty((pairs, (2 * ry + 1) * (2 * rx + 1)), dtype=torch.int64, device=prev.device)
    with torch.cuda.device(prev.device):
        mod.call("streammem_motion_search", prev.data_ptr(), cur.data_ptr(), sads.data_ptr(), pairs, H, W, ry, rx,
                 SEARCH_QUANT, native_cuda.stream_handle(prev.device))
    return shift_of_sads(sads, radius)


CUDA_STAGES = SimpleNamespace(
    products=products_cuda,
    fields=flow_fields_cuda,
    guess=guess_field_cuda,
    warp=warp_frames_cuda,
    reduce=reduce_level_cuda,
    search=search_shift_cuda,
)
