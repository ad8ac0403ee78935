"""CUDA backend of the motion magnitude (kernels: csrc/cuda/motion.cu; contract: motion.py).

Allocates the scratch on the frames' device, launches the two-stage kernel on
torch's current stream through the module's C ABI, and finishes on the device
with the same float64 reduction of per-block partials as the Triton backend;
no host synchronisation, so it can be captured in a CUDA graph.
"""
from __future__ import annotations

import torch

from . import _cuda
from ._dispatch import load_native


def lk_flow_cuda(gray: torch.Tensor, window: int, min_eig: float):
    """(flow_px (P,), mean_uv (P, 2)) float32 for contiguous (P+1, H, W) uint8 or float32 CUDA frames."""
    from .motion import solve_lk

    mod, why = load_native("cuda", "motion")
    if mod is None:
        raise RuntimeError(why)
    gray = gray.contiguous()
    pairs, H, W = gray.shape[0] - 1, gray.shape[1], gray.shape[2]
    Hg, Wg = H - 2, W - 2
    is_uint8 = gray.dtype == torch.uint8
    if not is_uint8:
        gray = gray.to(torch.float32)
    blocks = mod.streammem_motion_partial_blocks(H, W, window)
    prods = torch.empty((pairs, 5, Hg, Wg), dtype=torch.float32, device=gray.device)
    partials = torch.empty((pairs, blocks, 4 if window else 5), dtype=torch.float32, device=gray.device)
    with torch.cuda.device(gray.device):
        mod.call("streammem_motion_lk_flow", gray.data_ptr(), int(is_uint8), prods.data_ptr(), partials.data_ptr(),
                 pairs, H, W, window, float(min_eig), 1.0 / 255.0 if is_uint8 else 1.0,
                 _cuda.stream_handle(gray.device))
    totals = partials.double().sum(dim=1)
    if window == 0:
        u, v, _ = solve_lk((totals / (Hg * Wg)).float(), min_eig)
        return torch.sqrt(u * u + v * v), torch.stack((u, v), dim=1)
    count = totals[:, 1].clamp_min(1.0)
    return (totals[:, 0] / count).float(), (totals[:, 2:4] / count[:, None]).float()
