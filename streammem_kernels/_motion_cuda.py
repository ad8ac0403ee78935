"""CUDA backend of the motion magnitude (kernels: csrc/cuda/motion.cu; contract: motion.py).

The two stages of the Triton backend -- structure products, then per-pixel
fields of the window solve -- as CUDA kernels launched on torch's current
stream through the module's C ABI; the per-frame summary and the global mode
are the reference's own torch code.  Bit for bit with the reference (see the
.cu file), no host synchronisation (capturable in a CUDA graph).
"""
from __future__ import annotations

import torch

from . import _cuda
from ._dispatch import load_native


def _module():
    mod, why = load_native("cuda", "motion")
    if mod is None:
        raise RuntimeError(why)
    return mod


def structure_products_cuda(gray: torch.Tensor) -> torch.Tensor:
    """(P, 5, H-2, W-2) float32 products of contiguous (T, H, W) uint8/float32 CUDA frames."""
    mod = _module()
    gray = gray.contiguous()
    pairs, H, W = gray.shape[0] - 1, gray.shape[1], gray.shape[2]
    is_uint8 = gray.dtype == torch.uint8
    if not is_uint8:
        gray = gray.to(torch.float32)
    prods = torch.empty((pairs, 5, H - 2, W - 2), dtype=torch.float32, device=gray.device)
    with torch.cuda.device(gray.device):
        mod.call("streammem_motion_products", gray.data_ptr(), int(is_uint8), prods.data_ptr(), pairs, H, W,
                 1.0 / 255.0 if is_uint8 else 1.0, _cuda.stream_handle(gray.device))
    return prods


def flow_fields_cuda(prods: torch.Tensor, window: int, min_eig: float) -> torch.Tensor:
    """(P, 4, Ho, Wo) float32 fields |flow|, u, v, valid of (P, 5, Hg, Wg) products."""
    mod = _module()
    pairs, _, Hg, Wg = prods.shape
    fields = torch.empty((pairs, 4, Hg - window + 1, Wg - window + 1), dtype=torch.float32, device=prods.device)
    with torch.cuda.device(prods.device):
        mod.call("streammem_motion_fields", prods.data_ptr(), fields.data_ptr(), pairs, Hg, Wg, window,
                 float(min_eig), _cuda.stream_handle(prods.device))
    return fields


def lk_flow_cuda(gray: torch.Tensor, window: int, min_eig: float):
    """(flow_px (P,), mean_uv (P, 2)) float32, as every backend of ``motion.lk_flow``."""
    from .motion import global_flow, summarise_fields

    prods = structure_products_cuda(gray)
    if window == 0:
        return global_flow(prods, min_eig)
    return summarise_fields(flow_fields_cuda(prods, window, min_eig))
