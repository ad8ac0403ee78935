"""Backend selection shared by every op.

Each op has up to four implementations of one contract:

* ``torch``  -- the pure-PyTorch reference (the executable spec; any device);
* ``cpp``    -- a C++/OpenMP module ``streammem_kernels._cpu_<op>`` (CPU tensors);
* ``triton`` -- a Triton kernel (CUDA tensors, or CPU tensors when
  ``TRITON_INTERPRET=1`` runs it through the interpreter);
* ``cuda``   -- a CUDA C++ module ``streammem_kernels._cuda_<op>`` (CUDA tensors).

Like xformers' dispatch, each backend reports *reasons it cannot run* for a given
input; ``auto`` takes the first backend in the device's preference order that has
no reasons, and when an explicit request cannot be honoured the error lists the
reasons so the user learns why.  ``STREAMMEM_BACKEND`` (read at call time, not
import time) overrides ``auto`` only; an explicit ``backend=`` argument wins.
"""
from __future__ import annotations

import functools
import importlib
import os
from dataclasses import dataclass, field
from typing import Callable, Mapping

import torch

BACKENDS = ("torch", "cpp", "triton", "cuda")
_AUTO_ORDER = {"cuda": ("cuda", "triton", "torch"), "cpu": ("cpp", "torch")}


def triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def load_native(kind: str, op: str):
    """Load ``streammem_kernels._<kind>_<op>`` once; return (module, reason).

    ``kind="cpu"``: the pybind11 module; ``kind="cuda"``: the C-ABI shared
    library through ctypes (streammem_kernels/_cuda.py).
    """
    if kind == "cuda":
        from . import _cuda

        return _cuda.load(op)
    name = f"streammem_kernels._{kind}_{op}"
    try:
        return importlib.import_module(name), None
    except ImportError as exc:
        hint = "run `make build` (or `python setup.py build_ext --inplace`)"
        return None, f"native module {name} is not available ({exc}); {hint}"


@functools.cache
def _triton_import_reason():
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install
        return f"Triton is not importable ({exc}); pip install triton"
    return None


def common_reasons(backend: str, op: str, device: torch.device) -> list[str]:
    """Reasons shared by all ops for `backend` not running on `device`."""
    reasons: list[str] = []
    if backend == "torch":
        return reasons
    if backend == "cpp":
        if device.type != "cpu":
            reasons.append(f"the C++ backend runs on CPU tensors, got device {device}")
        _, why = load_native("cpu", op)
        if why:
            reasons.append(why)
    elif backend == "triton":
        why = _triton_import_reason()
        if why:
            reasons.append(why)
        if device.type == "cuda":
            if not torch.cuda.is_available():
                reasons.append("no CUDA device is available")
        elif device.type == "cpu":
            if not triton_interpreting():
                reasons.append(
                    "Triton needs CUDA tensors; set TRITON_INTERPRET=1 (before importing triton) "
                    "to run it on CPU through the interpreter"
                )
        else:
            reasons.append(f"Triton does not support device {device}")
    elif backend == "cuda":
        if device.type != "cuda":
            reasons.append(f"the CUDA backend needs CUDA tensors, got device {device}")
        elif not torch.cuda.is_available():
            reasons.append("no CUDA device is available")
        _, why = load_native("cuda", op)
        if why:
            reasons.append(why)
    else:
        reasons.append(f"unknown backend {backend!r}")
    return reasons


def call_op(custom_op, impls: Mapping[str, Callable], backend: str, *args):
    """Run a resolved backend: through the registered custom op while
    torch.compile traces (so the graph holds one opaque node with a fake
    implementation), directly otherwise: the custom-op dispatcher costs tens of
    microseconds per call, which dominates on small inputs, and its first call in
    a process imports torch._dynamo (2-3 s on 2 cores).  Every public op goes
    through here."""
    if torch.compiler.is_compiling():
        return custom_op(*args, backend)
    # Same contract as the custom op, which has no autograd formula: outputs never require grad.
    with torch.no_grad():
        return impls[backend](*args)


@dataclass
class Op:
    """The backends of one op.

    ``impls`` maps backend names to callables sharing one signature.  Backends an
    op does not have are simply absent.  ``extra_reasons`` optionally maps a
    backend to ``fn(**info) -> list[str]`` for op-specific limits (dtype, sizes).
    ``tolerances`` declares, next to the backends (xformers' ``ERROR_ATOL`` /
    ``ERROR_RTOL``), each backend's ``(atol, rtol)`` against the reference
    computed in float32/float64, per input dtype; the tests compare with these.
    """

    name: str
    impls: Mapping[str, Callable]
    extra_reasons: Mapping[str, Callable[..., list[str]]] = field(default_factory=dict)
    tolerances: Mapping[str, Mapping[torch.dtype, tuple[float, float]]] = field(default_factory=dict)

    def tolerance(self, backend: str, dtype: torch.dtype) -> tuple[float, float]:
        """(atol, rtol) of ``backend`` on inputs of ``dtype`` against the reference."""
        try:
            return self.tolerances[backend][dtype]
        except KeyError:
            raise KeyError(f"{self.name}: no tolerance declared for backend {backend!r} and {dtype}") from None

    def reasons(self, backend: str, device: torch.device, **info) -> list[str]:
        if backend not in self.impls:
            return [f"op {self.name!r} has no {backend} backend"]
        reasons = common_reasons(backend, self.name, device)
        if backend in self.extra_reasons:
            reasons += self.extra_reasons[backend](device=device, **info)
        return reasons

    def select(self, backend: str, device: torch.device, **info) -> str:
        """Resolve ``backend`` ("auto" or a name) to a backend that can run."""
        if backend is None:
            backend = "auto"
        if not isinstance(backend, str) or backend not in ("auto",) + BACKENDS:
            raise ValueError(f"backend must be one of {('auto',) + BACKENDS}, got {backend!r}")
        source = "backend="
        if backend == "auto":
            override = os.environ.get("STREAMMEM_BACKEND", "auto").strip().lower() or "auto"
            if override != "auto":
                if override not in BACKENDS:
                    raise ValueError(
                        f"STREAMMEM_BACKEND must be one of {('auto',) + BACKENDS}, got {override!r}"
                    )
                backend, source = override, "STREAMMEM_BACKEND="
        if backend != "auto":
            why = self.reasons(backend, device, **info)
            if why:
                raise RuntimeError(
                    f"{self.name}: {source}{backend!r} cannot run on this input: " + "; ".join(why)
                )
            return backend
        order = _AUTO_ORDER.get(device.type, ("torch",))
        report = []
        for candidate in order:
            why = self.reasons(candidate, device, **info)
            if not why:
                return candidate
            report.append(f"{candidate}: " + "; ".join(why))
        raise RuntimeError(f"{self.name}: no backend can run on device {device}: " + " | ".join(report))

    def available(self, device: torch.device, **info) -> list[str]:
        """Backends that can run on `device` now (used by tests and benchmarks)."""
        return [b for b in BACKENDS if b in self.impls and not self.reasons(b, device, **info)]
