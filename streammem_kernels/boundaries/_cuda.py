"""CUDA backend of the streaming segmenter's push (kernel: csrc/cuda/boundaries.cu; spec: reference.py).

One launch per push for all B streams, the state updated in place, the closed events as (B, 2) start/end
tensors; no host synchronisation.
"""
from __future__ import annotations

import torch

from ..runtime import cuda as native_cuda
from ..runtime.cuda import F64, I32, I64, P
from ..runtime.dispatch import load_native

# The launchers of csrc/cuda/boundaries.cu: {function: (restype, argtypes)} (tests/gpu_readiness/test_cuda_compile.py checks that
# a build exports exactly these).
PROTOTYPES = {
    "streammem_boundaries_stream_step": (I32, (P, P, P, P, P, P, P, P, I64, I64, I64, I64, F64,
                                                F64, I32, I64, F64, I32, I32, I32, P)),
}


def stream_step_cuda(x, last_frame, window_sims, depth_scratch, frames_in_window, last_end, t: int, params,
                     *, has_last: bool):
    """Advance every stream by one frame ``x (B, D)`` float32; returns (start, end) (B, 2) int64."""
    mod, why = load_native("cuda", "boundaries")
    if mod is None:
        raise RuntimeError(why)
    B, D = x.shape
    x = x.contiguous()
    start = torch.empty((B, 2), dtype=torch.int64, device=x.device)
    end = torch.empty((B, 2), dtype=torch.int64, device=x.device)
    drift_mode = params.drift is not None
    with torch.cuda.device(x.device):
        mod.call("streammem_boundaries_stream_step", x.data_ptr(), last_frame.data_ptr(), window_sims.data_ptr(),
                 depth_scratch.data_ptr(), frames_in_window.data_ptr(), last_end.data_ptr(), start.data_ptr(),
                 end.data_ptr(), B, D, int(t), params.window, float(params.tau), float(params.min_depth),
                 params.peak_code, params.max_event or 0, float(params.drift) if drift_mode else 0.0,
                 int(drift_mode), int(params.flash), int(has_last), native_cuda.stream_handle(x.device))
    return start, end
