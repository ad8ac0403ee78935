"""Loading and calling the CUDA C++ modules (``csrc/cuda/<op>.cu``).

Each module is a plain shared library ``streammem_kernels/_cuda_<op>*.so`` with
a C ABI (see csrc/cuda/common.cuh), built by setup.py with nvcc alone -- no
CUDA torch is needed at build time, so the whole module compiles and links on
machines without a GPU (and is checked there by tests/gpu_readiness/test_cuda_compile.py).
It is loaded here with ctypes, once, on first use.

Each op declares its exported functions in a ``PROTOTYPES`` table beside its CUDA
backend (``streammem_kernels/<op>/_cuda.py``); a call passes
device pointers (``tensor.data_ptr()``), sizes, and torch's current stream, and
a non-zero return code becomes a ``RuntimeError`` naming the op, the function
and CUDA's message.  Launchers never synchronise, so the ops stay capturable in
CUDA graphs.
"""
from __future__ import annotations

import ctypes
import glob
import importlib
import os

import torch

# The C types of the launchers' arguments, for the ops' PROTOTYPES tables.
P = ctypes.c_void_p
I64 = ctypes.c_int64
I32 = ctypes.c_int
F32 = ctypes.c_float
F64 = ctypes.c_double

# Exported by every module (csrc/cuda/common.cuh).
COMMON = {
    "streammem_cuda_error_string": (ctypes.c_char_p, (I32,)),
    "streammem_cuda_device_count": (I32, (ctypes.POINTER(ctypes.c_int),)),
}


def prototypes(op: str) -> dict[str, tuple]:
    """``{function: (restype, argtypes)}`` of ``_cuda_<op>``: the ``PROTOTYPES`` its op declares beside its
    CUDA backend (``streammem_kernels/<op>/_cuda.py``), and the functions every module exports."""
    return {**COMMON, **importlib.import_module(f"streammem_kernels.{op}._cuda").PROTOTYPES}


def library_path(op: str) -> str | None:
    """Path of the built module of ``op``, or None."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the package folder
    found = sorted(glob.glob(os.path.join(here, f"_cuda_{op}.so")) + glob.glob(os.path.join(here, f"_cuda_{op}.*.so")))
    return found[0] if found else None


class CudaModule:
    """A loaded ``_cuda_<op>`` library with typed functions."""

    def __init__(self, op: str, path: str):
        self.op = op
        self.path = path
        self._lib = ctypes.CDLL(path)
        for name, (restype, argtypes) in prototypes(op).items():
            fn = getattr(self._lib, name)  # AttributeError: a stale build lacks a symbol
            fn.restype = restype
            fn.argtypes = argtypes
            setattr(self, name, fn)

    def call(self, name: str, *args) -> None:
        """Call a launcher; raise ``RuntimeError`` on a non-zero cudaError_t."""
        code = getattr(self, name)(*args)
        if code != 0:
            message = self.streammem_cuda_error_string(code).decode(errors="replace")
            raise RuntimeError(f"{self.op}: CUDA kernel {name} failed: {message} (cudaError {code})")


def load(op: str):
    """(CudaModule, None) or (None, reason it is unavailable); memoised by ``_dispatch.load_native``."""
    path = library_path(op)
    if path is None:
        return None, (f"CUDA module streammem_kernels/_cuda_{op}.so is not built; it is built by setup.py when "
                      "nvcc is on PATH (or CUDA_HOME is set), e.g. `make build` or `pip install .` on a machine "
                      "with the CUDA toolkit")
    try:
        return CudaModule(op, path), None
    except (OSError, AttributeError) as exc:
        return None, f"CUDA module {path} cannot be loaded ({exc}); rebuild it with `make build`"


def stream_handle(device: torch.device) -> int:
    """cudaStream_t of torch's current stream on ``device`` (as an integer for ctypes)."""
    return torch.cuda.current_stream(device).cuda_stream
