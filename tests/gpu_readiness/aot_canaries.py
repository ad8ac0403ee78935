"""Kernels the compile check must reject (tests/gpu_readiness/test_triton_compile.py::test_harness_catches_*).

Imported by the compile phase, in a process without TRITON_INTERPRET.
"""
import triton
import triton.language as tl

_PLAIN_GLOBAL = -3.0e38  # not a tl.constexpr: the interpreter accepts it, a real compile does not


@triton.jit
def _global_float_kernel(out_ptr):
    tl.store(out_ptr, tl.full((), _PLAIN_GLOBAL, tl.float32))


@triton.jit
def _approx_sqrt_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=1.0)
    tl.store(out_ptr + offs, tl.sqrt(x) / (x + 1.0), mask=offs < n)
