"""Backend selection shared by every op.

Each op has up to four implementations of one contract:

* ``torch``  -- the pure-PyTorch reference (the executable spec; any device);
* ``cpp``    -- a C++/OpenMP module ``streammem_kernels._cpu_<native>`` (CPU tensors);
* ``triton`` -- a Triton kernel (CUDA tensors, or CPU tensors when
  ``TRITON_INTERPRET=1`` runs it through the interpreter);
* ``cuda``   -- a CUDA C++ module ``streammem_kernels._cuda_<native>`` (CUDA tensors).

An :class:`Op` is named after the public op it dispatches (``cosine_topk``,
``tree_search``); ``native`` names the family of native modules its compiled
backends live in (``tree``: ``_cpu_tree`` holds the tree search and the exact
top-k), so several ops can share one module without sharing a name.

Like xformers' dispatch, each backend reports *reasons it cannot run* for a given
input; ``auto`` takes the first backend in the device's preference order that has
no reasons, and when an explicit request cannot be honoured the error lists the
reasons, the op and the shapes and dtypes of its inputs so the user learns why.
``STREAMMEM_BACKEND`` (read at call time, not import time) overrides ``auto``
only; an explicit ``backend=`` argument wins.

Dispatch is on every call's path, so it is cheap: :meth:`Op.select` remembers
what it resolved per (request, device, ``STREAMMEM_BACKEND``,
``TRITON_INTERPRET``) until :func:`load_native.cache_clear`, and
:meth:`Op.cpp_module` answers the public functions' fast paths ("does this
request run the C++ module on CPU tensors, whatever the input?") with two
dictionary reads.

When ``auto`` ends on the torch reference because a faster backend is not
installed (its native module was not built, Triton is missing), it says so once
per op and device with a :class:`BackendFallbackWarning`; an op whose only
candidate is the reference, an input a kernel does not support, or an explicit
choice stay silent.  :func:`backend_report` lists, per op and device, which
backends can run here and why the others cannot.

Inside ``torch.compile`` (``docs/compile.md``) the public functions compile as one graph each:
:meth:`Op.select` resolves the backend while Dynamo traces, reading the environment and the
import outcomes only through :func:`trace_constant` functions (called at trace time, outside the
graph), :meth:`Op.run_fast` steps aside, and :func:`call_op` puts the registered custom op in the
graph, whose fake implementation gives the shapes.
"""
from __future__ import annotations

import importlib
import itertools
import os
import threading
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Callable, Mapping

import torch

BACKENDS = ("torch", "cpp", "triton", "cuda")
_is_compiling = torch.compiler.is_compiling
AUTO_ORDER = {"cuda": ("cuda", "triton", "torch"), "cpu": ("cpp", "torch")}


class BackendFallbackWarning(RuntimeWarning):
    """``auto`` runs an op on the slow torch reference because a native backend is not installed."""


_FALLBACK_WARNED: set[tuple[str, str]] = set()  # (op, device type) already warned about


def _environ_reader():
    """``getenv(name)`` through ``os.environ``'s own dict where CPython keeps one (a plain dict read,
    ~0.1 us, where ``os.environ.get`` encodes the key first, ~1 us): every op reads
    ``STREAMMEM_BACKEND`` on every call.  ``os.environ`` writes (``monkeypatch.setenv``) update that dict."""
    data = getattr(os.environ, "_data", None)
    encode = getattr(os.environ, "encodekey", None)
    if isinstance(data, dict) and encode is not None and data and isinstance(next(iter(data)), bytes):
        def getenv(name: str, _data=data, _keys={}):
            key = _keys.get(name)
            if key is None:
                key = _keys[name] = encode(name)
            value = _data.get(key)
            return None if value is None else os.fsdecode(value)
        return getenv
    return os.environ.get


getenv = _environ_reader()


def trace_constant(fn):
    """Mark ``fn`` as ``torch.compiler.assume_constant_result`` does: Dynamo calls it while it traces,
    outside the graph, and keeps its result as a constant.  Set by hand because the public decorator
    imports torch._dynamo (seconds) and the package's import stays cheap; a test checks that the mark
    is the one torch's decorator sets.

    Dispatch reads everything it learns from the process through such functions (environment
    variables, which native modules and Triton import, the fallback warning), so a trace neither
    imports a module nor reads ``os.environ`` and the graph holds only tensor work.  A compiled
    function keeps the backend resolved when it was compiled (docs/compile.md).
    """
    fn._dynamo_marked_constant = True
    return fn


class TraceHandles:
    """String handles for the objects that :func:`trace_constant` functions read.

    Dynamo passes such a function constants only (torch 2.11 refuses an object: "UserDefinedObjectVariable
    (CosineTree) is not a constant"); an object's handle, read from one of its attributes while
    tracing, is one, and the function looks the object up here.  A string, not an int: Dynamo makes an
    int attribute that changes between calls dynamic (a symbol, no longer a constant), never a string.
    The table holds its objects weakly.  An object registers when it is made and again when it is
    copied or unpickled (its ``__setstate__``), so no two objects share a handle.
    """

    def __init__(self):
        self._objects: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._next = itertools.count()

    def register(self, obj) -> str:
        handle = str(next(self._next))
        self._objects[handle] = obj
        return handle

    def __getitem__(self, handle: str):
        return self._objects[handle]


def eager_only(reason: str):
    """A marker for a public function that torch.compile cannot trace into one graph (it returns Python
    objects read from the tensors): the function calls the returned marker first.  Eagerly the marker
    does nothing; while Dynamo traces, calling it is refused with ``reason`` (as
    ``torch.compiler.disable(recursive=False)`` refuses its function), so ``fullgraph=True`` raises
    naming the function and what to use instead, and without ``fullgraph`` the graph breaks there and
    the function runs eagerly.  The marks are set by hand for :func:`trace_constant`'s reason; a test
    checks that they are the ones torch's decorator sets.
    """
    def marker() -> None:
        return None

    marker._torchdynamo_disable = True
    marker._torchdynamo_disable_msg = reason
    return marker


@trace_constant
def read_env(name: str) -> str | None:
    """``getenv(name)``, a constant to torch.compile."""
    return getenv(name)


def triton_interpreting() -> bool:
    return (read_env("TRITON_INTERPRET") or "0") not in ("", "0")


def backend_override() -> str | None:
    """``STREAMMEM_BACKEND`` as given (None when unset or "auto")."""
    value = read_env("STREAMMEM_BACKEND")
    if value is None:
        return None
    value = value.strip().lower()
    return None if value in ("", "auto") else value


# Import outcomes, memoised in a plain dict rather than functools.cache: dispatch runs inside
# torch.compile traces, where Dynamo reads a dict as a constant but warns about (and traces
# through) an lru_cache wrapper on every compile.
_IMPORTS: dict[tuple[str, str], object] = {}


def load_native(kind: str, op: str):
    """Load ``streammem_kernels._<kind>_<op>`` once; return (module, reason).

    ``kind="cpu"``: the pybind11 module; ``kind="cuda"``: the C-ABI shared
    library through ctypes (streammem_kernels/runtime/cuda.py).
    """
    key = (kind, op)
    if key not in _IMPORTS:
        _IMPORTS[key] = _import_native(kind, op)
    return _IMPORTS[key]


# Every Op, whose resolutions (Op.select) and loaded C++ module (Op.cpp_module) are forgotten with
# the import outcomes they depend on.
_OPS: "weakref.WeakSet[Op]" = weakref.WeakSet()


def _forget_imports() -> None:
    _IMPORTS.clear()
    for op in list(_OPS):
        op._selected.clear()
        op._cpp = None


load_native.cache_clear = _forget_imports  # forget every import outcome (tests hide modules)


def _import_native(kind: str, op: str):
    if kind == "cuda":
        from . import cuda as native_cuda

        return native_cuda.load(op)
    name = f"streammem_kernels._{kind}_{op}"
    try:
        return importlib.import_module(name), None
    except ImportError as exc:
        hint = ("it is compiled when the package is installed from source with a C++ compiler; "
                "in a checkout run `make build` (or `python setup.py build_ext --inplace`)")
        return None, f"native module {name} is not available ({exc}); {hint}"


@trace_constant
def native_reason(kind: str, op: str) -> str | None:
    """Why ``streammem_kernels._<kind>_<op>`` cannot be loaded, or None (:func:`load_native`'s reason)."""
    return load_native(kind, op)[1]


@trace_constant
def _triton_import_reason():
    key = ("triton", "")
    if key not in _IMPORTS:
        try:
            import triton  # noqa: F401
            import triton.language  # noqa: F401

            _IMPORTS[key] = None
        except Exception as exc:  # ImportError, or a broken install
            _IMPORTS[key] = f"Triton is not importable ({exc}); pip install triton"
        if _IMPORTS[key] is None and triton_interpreting():
            from .interpreter import fix_interpreter_scalar_index

            fix_interpreter_scalar_index()
    return _IMPORTS[key]


def common_reasons(backend: str, op: str, device: torch.device) -> list[str]:
    """Reasons shared by all ops for `backend` not running on `device`."""
    reasons: list[str] = []
    if backend == "torch":
        return reasons
    if backend == "cpp":
        if device.type != "cpu":
            reasons.append(f"the C++ backend runs on CPU tensors, got device {device}")
        why = native_reason("cpu", op)
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
        why = native_reason("cuda", op)
        if why:
            reasons.append(why)
    else:
        reasons.append(f"unknown backend {backend!r}")
    return reasons


def not_installed_reason(backend: str, op: str) -> str | None:
    """Why ``backend`` of ``op`` is absent from this install (module not built, Triton missing), or None."""
    if backend == "cpp":
        return native_reason("cpu", op)
    if backend == "cuda":
        return native_reason("cuda", op)
    if backend == "triton":
        return _triton_import_reason()
    return None


@trace_constant
def _warn_fallback(op: str, device: torch.device, missing: list[str]) -> None:
    key = (op, device.type)
    if key in _FALLBACK_WARNED:
        return
    _FALLBACK_WARNED.add(key)
    warnings.warn(
        f"streammem_kernels: {op} on {device.type} tensors runs on the torch reference (a slow fallback) because "
        + "; ".join(missing) + ". Set STREAMMEM_BACKEND=torch to choose the reference on purpose; "
        "streammem_kernels.backend_report() lists every backend.",
        BackendFallbackWarning,
        stacklevel=5,
    )


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
        if backend == "triton" and triton_interpreting():
            with _INTERPRETER_LOCK:
                return impls[backend](*args)
        return impls[backend](*args)


def describe_inputs(inputs: Mapping[str, object] | None) -> str:
    """``"queries (1, 384) float32 cpu, keys (1000, 384) float32 cpu"`` for an error message."""
    if not inputs:
        return ""
    parts = []
    for name, value in inputs.items():
        if isinstance(value, torch.Tensor):
            parts.append(f"{name} {tuple(value.shape)} {str(value.dtype).replace('torch.', '')} {value.device}")
        elif value is not None:
            parts.append(f"{name}={value!r}")
    return ", ".join(parts)


def _on(inputs: Mapping[str, object] | None) -> str:
    """`` (queries (1, 384) float32 cpu, ...)`` for an error message, or "" (described only when raising:
    under torch.compile, formatting a shape would fix it in the graph)."""
    on = describe_inputs(inputs)
    return f" ({on})" if on else ""


# The Triton interpreter is not thread-safe: a launch patches triton.language module-wide for its duration
# and keeps per-launch state in globals, so two threads launching at once corrupt each other (wrong results
# or errors).  Interpreted launches (CPU tensors, TRITON_INTERPRET=1) are therefore serialised here, the one
# place every op's backend call passes; compiled launches on CUDA tensors are thread-safe and never take it.
# Re-entrant: a backend may call call_op again (the streaming segmenter's step does).
_INTERPRETER_LOCK = threading.RLock()


@dataclass(eq=False)
class Op:
    """The backends of one public op.

    ``name`` is the op (what the user called, and what errors and warnings
    name); ``native`` the family of compiled modules its ``cpp`` / ``cuda``
    backends load (``streammem_kernels._cpu_<native>``, ``_cuda_<native>``;
    default: ``name``).  ``impls`` maps backend names to callables sharing one
    signature.  Backends an op does not have are simply absent.
    ``extra_reasons`` optionally maps a backend to ``fn(**info) -> list[str]``
    for op-specific limits (dtype, sizes).  ``tolerances`` declares, next to
    the backends (xformers' ``ERROR_ATOL`` / ``ERROR_RTOL``), each backend's
    ``(atol, rtol)`` against the reference computed in float32/float64, per
    input dtype; the tests compare with these.
    """

    name: str
    impls: Mapping[str, Callable]
    extra_reasons: Mapping[str, Callable[..., list[str]]] = field(default_factory=dict)
    tolerances: Mapping[str, Mapping[torch.dtype, tuple[float, float]]] = field(default_factory=dict)
    native: str | None = None
    fast: Callable | None = None

    def __post_init__(self):
        if self.native is None:
            self.native = self.name
        self._selected: dict = {}
        self._cpp = None
        _OPS.add(self)  # the loaded _cpu_<native> module, once cpp_module has found it

    def tolerance(self, backend: str, dtype: torch.dtype) -> tuple[float, float]:
        """(atol, rtol) of ``backend`` on inputs of ``dtype`` against the reference."""
        try:
            return self.tolerances[backend][dtype]
        except KeyError:
            raise KeyError(f"{self.name}: no tolerance declared for backend {backend!r} and {dtype}") from None

    def reasons(self, backend: str, device: torch.device, **info) -> list[str]:
        if backend not in self.impls:
            return [f"op {self.name!r} has no {backend} backend"]
        reasons = common_reasons(backend, self.native, device)
        if backend in self.extra_reasons:
            reasons += self.extra_reasons[backend](device=device, **info)
        return reasons

    def cpp_module(self, backend: str):
        """The loaded ``_cpu_<native>`` module when ``backend`` resolves to ``cpp`` on CPU tensors
        (``auto`` without a ``STREAMMEM_BACKEND`` override, or ``cpp``), else None.

        The public functions' fast paths ask this after checking that their input is
        within the C++ backend's limits (``extra_reasons``); anything else (an
        override, another backend, a module that is not built) goes through
        :meth:`select`, which explains itself.
        """
        # Asked on every single-item call: the unset variable and the loaded module are the quick case.
        if backend == "auto":
            if getenv("STREAMMEM_BACKEND") is not None and backend_override() is not None:
                return None
        elif backend != "cpp":
            return None
        module = self._cpp
        if module is None:
            if "cpp" not in self.impls:
                return None
            module = self._cpp = load_native("cpu", self.native)[0]  # an import outcome never changes
        return module

    def run_fast(self, backend: str, *args):
        """The op's declared latency path on ``args``, or None (not declared, not the C++ backend, traced
        by torch.compile, or an input it does not take)."""
        if self.fast is None or _is_compiling():
            return None
        module = self.cpp_module(backend)
        if module is None:
            return None
        return self.fast(module, *args)

    def select(self, backend: str, device: torch.device, *, inputs: Mapping[str, object] | None = None,
               **info) -> str:
        """Resolve ``backend`` ("auto" or a name) to a backend that can run.

        ``inputs`` (name -> tensor) only serves the error message: when nothing can run,
        it names the op and the shapes, dtypes and devices of its inputs.
        """
        if _is_compiling():  # traced: resolved afresh (reading only trace constants), remembered by the graph
            return self._resolve(backend, device, inputs, info)[0]
        key = None
        if not info:
            key = (backend, device, getenv("STREAMMEM_BACKEND"), getenv("TRITON_INTERPRET"))
            hit = self._selected.get(key)
            if hit is not None:
                return hit
        name, cacheable = self._resolve(backend, device, inputs, info)
        if key is not None and cacheable:
            self._selected[key] = name
        return name

    def _resolve(self, backend, device, inputs, info) -> tuple[str, bool]:
        if backend is None:
            backend = "auto"
        if not isinstance(backend, str) or backend not in ("auto",) + BACKENDS:
            raise ValueError(f"backend must be one of {('auto',) + BACKENDS}, got {backend!r}")
        source = "backend="
        if backend == "auto":
            override = (read_env("STREAMMEM_BACKEND") or "auto").strip().lower() or "auto"
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
                    f"{self.name}: {source}{backend!r} cannot run on this input{_on(inputs)}: " + "; ".join(why)
                )
            return backend, True
        order = AUTO_ORDER.get(device.type, ("torch",))
        report, not_installed = [], []
        for candidate in order:
            why = self.reasons(candidate, device, **info)
            if not why:
                if candidate == "torch" and not_installed:
                    _warn_fallback(self.name, device, not_installed)
                    return candidate, False  # not remembered: the warning is said once per op and device
                return candidate, True
            report.append(f"{candidate}: " + "; ".join(why))
            # Only an uninstalled backend that would otherwise have run makes the fallback worth a warning.
            missing = not_installed_reason(candidate, self.native) if candidate in self.impls else None
            if missing is not None and why == [missing]:
                not_installed.append(missing)
        raise RuntimeError(f"{self.name}: no backend can run on device {device}{_on(inputs)}: " + " | ".join(report))

    def available(self, device: torch.device, **info) -> list[str]:
        """Backends that can run on `device` now (used by tests and benchmarks)."""
        return [b for b in BACKENDS if b in self.impls and not self.reasons(b, device, **info)]
