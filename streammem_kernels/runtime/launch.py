"""Launch configuration of the Triton kernels: one per target, chosen here.

The kernels run on two targets: a CUDA GPU, and the Triton interpreter on CPU
tensors (the test suite).  They use the *same* block sizes on both wherever the
interpreter can afford it, so the tests exercise the configuration a GPU runs.
What legitimately differs is asked here, in one place:

* :func:`gpu_launch` -- whether a launch should be configured for a GPU: on
  CUDA tensors, and under the interpreter while the ahead-of-time compile check
  (``streammem_kernels.runtime.aot``) records launches to replay them for sm_80/sm_90;
* :func:`multiprocessors` -- streaming multiprocessors to fill (work splitting);
* :func:`interpreted_bf16` -- the interpreter computes bfloat16 arithmetic
  wrongly, so bfloat16 tiles are upcast to float32 there (and only there);
* :func:`block_elements` -- how many elements a torch backend's blocked
  temporaries hold: cache-sized on a CPU, large on a GPU (one launch per block).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools

import torch

from .dispatch import triton_interpreting

# Elements of a torch backend's temporaries at once on a GPU (64 MB of float32): each block costs a few
# kernel launches there, so the CPU's cache-sized blocks would cost thousands of launches per call.
GPU_BLOCK_ELEMENTS = 1 << 24

# Streaming multiprocessors of an H100 SXM: the work split a launch recorded for
# the compile check (or an interpreted launch in GPU configuration) assumes.
NOMINAL_MULTIPROCESSORS = 132

_RECORDING = contextvars.ContextVar("streammem_recording_gpu_launches", default=False)


@contextlib.contextmanager
def recording_gpu_launches():
    """Inside the block, interpreted launches take their GPU configuration (used by the compile check)."""
    token = _RECORDING.set(True)
    try:
        yield
    finally:
        _RECORDING.reset(token)


def gpu_launch(device: torch.device) -> bool:
    """True when a launch on ``device`` is configured for a GPU."""
    return device.type == "cuda" or _RECORDING.get()


@functools.cache
def _cuda_multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def multiprocessors(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (host-side metadata, no synchronisation)."""
    if device.type == "cuda":
        return _cuda_multiprocessors(device.index if device.index is not None else torch.cuda.current_device())
    return NOMINAL_MULTIPROCESSORS


def interpreted_bf16(dtype: torch.dtype) -> bool:
    """True when bfloat16 tiles must be upcast because the interpreter runs them (not while recording)."""
    return dtype == torch.bfloat16 and triton_interpreting() and not _RECORDING.get()




def block_elements(device: torch.device, cpu_elements: int) -> int:
    """Elements of a blocked temporary at once on ``device``: ``cpu_elements`` (sized for the CPU's
    cache) on a CPU, at least :data:`GPU_BLOCK_ELEMENTS` elsewhere.  The torch backends give the same
    results whatever the block."""
    return cpu_elements if device.type == "cpu" else max(cpu_elements, GPU_BLOCK_ELEMENTS)
