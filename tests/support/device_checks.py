"""Shared machinery of the GPU-readiness tests (the GPU path verified without a GPU).

* ``DEVICES`` -- the FlashInfer-style ``device`` parametrisation: "cpu" always,
  "cuda" skipped cleanly where no GPU is usable.  On a GPU machine
  (``bench/gpu.sh`` sets ``STREAMMEM_REQUIRE_GPU=1``) a CUDA case that cannot
  run fails instead of skipping.
* ``cpu_backends(op)`` -- the backends to compare with the reference on CPU tensors
  (the C++ one required under ``STREAMMEM_REQUIRE_CPP=1``).
* ``device_backends(op, device)`` -- the backends to compare with the fp32
  reference on that device (on CUDA: triton and cuda where the op has them,
  torch always).
* ``no_host_sync()`` -- a ``TorchFunctionMode`` that raises ``HostSync`` on every
  tensor-to-host conversion (``item``, ``tolist``, ``bool``/``int``/``float``/
  ``__index__`` of a tensor, ``numpy``, ``cpu``, ``nonzero``, boolean-mask
  indexing, ``unique``, ``masked_select``...): each of these stalls a CUDA stream and
  breaks CUDA-graph capture.  Interpreted Triton launches run outside the mode
  (the interpreter itself copies to host, a GPU launch does not).
  ``guard_backend(monkeypatch, op, "triton")`` wraps one backend of an ``Op``
  in it, so a test runs an op's GPU code path on CPU tensors through the
  interpreter and proves it free of host synchronisation.
* ``capture_in_cuda_graph(fn)`` -- runs ``fn`` once eagerly, then captures it in
  a ``torch.cuda.CUDAGraph`` with ``torch.cuda.set_sync_debug_mode("error")``
  and replays it; returns (eager, replayed) outputs for comparison.
"""
from __future__ import annotations

import contextlib
import functools
import os

import pytest
import torch
from torch.overrides import TorchFunctionMode

GPU_REQUIRED = os.environ.get("STREAMMEM_REQUIRE_GPU") == "1"
HAS_CUDA = torch.cuda.is_available()

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA and not GPU_REQUIRED, reason="no CUDA device")),
]


def device_backends(op, device: str) -> list[str]:
    """Backends of ``op`` to test on ``device`` ("cpu" or "cuda")."""
    if device == "cpu":
        return cpu_backends(op)
    if not HAS_CUDA:
        raise RuntimeError("STREAMMEM_REQUIRE_GPU=1 but torch.cuda.is_available() is False")
    names = []
    for b in ("torch", "triton", "cuda"):
        if b not in op.impls:
            continue
        reasons = op.reasons(b, torch.device("cuda"))
        if not reasons:
            names.append(b)
        elif GPU_REQUIRED and b == "triton":
            raise RuntimeError(f"{op.name}: the Triton backend cannot run on this GPU: " + "; ".join(reasons))
    return names


class HostSync(AssertionError):
    """A GPU code path asked for a tensor's value on the host."""


_SYNCING = {
    torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__, torch.Tensor.__float__,
    torch.Tensor.__index__, torch.Tensor.numpy, torch.Tensor.cpu, torch.Tensor.nonzero, torch.nonzero,
    torch.Tensor.unique, torch.unique, torch.unique_consecutive, torch.masked_select, torch.Tensor.masked_select,
    torch.Tensor.__array__, torch.Tensor.__complex__, torch.argwhere, torch.Tensor.argwhere,
}


class _NoHostSync(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SYNCING:
            raise HostSync(f"host synchronisation: {getattr(func, '__qualname__', func)}")
        if func is torch.Tensor.__getitem__ and _has_bool_tensor_index(args[1] if len(args) > 1 else None):
            raise HostSync("host synchronisation: boolean-mask indexing (its result size is data-dependent)")
        if func in (torch.repeat_interleave, torch.Tensor.repeat_interleave) and "output_size" not in kwargs \
                and len(args) > 1 and isinstance(args[1], torch.Tensor):
            raise HostSync("host synchronisation: repeat_interleave with tensor repeats and no output_size")
        if func in (torch.Tensor.to, torch.Tensor.copy_) and _to_host(func, args, kwargs):
            raise HostSync("host synchronisation: copy to the host")
        return func(*args, **kwargs)


def _has_bool_tensor_index(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


def _to_host(func, args, kwargs) -> bool:
    if func is torch.Tensor.to:
        target = kwargs.get("device", args[1] if len(args) > 1 else None)
        return isinstance(target, (str, torch.device)) and torch.device(target).type == "cpu" \
            and args[0].device.type != "cpu"
    return False


@contextlib.contextmanager
def no_host_sync():
    """Raise ``HostSync`` on any tensor-to-host conversion inside the block (interpreted launches excepted)."""
    from triton.runtime.interpreter import InterpretedFunction

    original = InterpretedFunction.run

    def run(self, *args, **kwargs):
        with torch._C.DisableTorchFunction():  # the interpreter's own host copies are not the op's
            return original(self, *args, **kwargs)

    InterpretedFunction.run = run
    try:
        with _NoHostSync():
            yield
    finally:
        InterpretedFunction.run = original


def guard_backend(monkeypatch, op, backend: str) -> None:
    """Run ``op``'s ``backend`` implementation inside ``no_host_sync()`` for the rest of the test."""
    impl = op.impls[backend]

    @functools.wraps(impl)
    def guarded(*args, **kwargs):
        with no_host_sync():
            return impl(*args, **kwargs)

    monkeypatch.setitem(op.impls, backend, guarded)


def capture_in_cuda_graph(fn, warmup: int = 2):
    """(eager output, output of a CUDA-graph replay) of ``fn()``; raises if ``fn`` syncs with the host."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):  # compiles Triton kernels, fills caches: outside the capture
            eager = fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph):
            captured = fn()
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    graph.replay()
    torch.cuda.synchronize()
    return eager, captured


def cpu_backends(op) -> list[str]:
    """Backends of `op` to compare against the reference on CPU tensors."""
    names = ["torch"]
    if "cpp" in op.impls:
        reasons = op.reasons("cpp", torch.device("cpu"))
        if not reasons:
            names.append("cpp")
        elif os.environ.get("STREAMMEM_REQUIRE_CPP") == "1":
            raise RuntimeError("C++ backend required but unavailable: " + "; ".join(reasons))
    if "triton" in op.impls and not op.reasons("triton", torch.device("cpu")):
        names.append("triton")
    return names
