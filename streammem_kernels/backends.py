"""``backend_report()``: which backends of every op can run in this process, and why the others cannot.

It sits above the ops (it reads every op's ``Op`` tables) and below the package's face: it finds
the op folders by listing the package folder, so a new op needs no entry here.
"""
from __future__ import annotations

import importlib
import os
import pkgutil
import sys
from dataclasses import dataclass
from typing import Mapping

import torch

from .runtime.dispatch import AUTO_ORDER, BACKENDS, Op, common_reasons, eager_only

__all__ = ["BackendReport", "BackendStatus", "backend_report", "op_families"]

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def op_families() -> tuple[str, ...]:
    """The op folders of the package (``streammem_kernels/<family>/``), each named after its native
    modules (``_cpu_<family>``, ``_cuda_<family>``) and holding its public functions and Op tables.
    Found by listing the package folder, so a new op folder needs no entry anywhere else."""
    return tuple(sorted(info.name for info in pkgutil.iter_modules([_PACKAGE_DIR])
                        if info.ispkg and info.name != "runtime"))


# Backends that can apply to tensors of each device type (cpp never takes CUDA tensors, cuda never CPU ones).
DEVICE_BACKENDS = {"cpu": ("torch", "cpp", "triton"), "cuda": ("torch", "triton", "cuda")}


@dataclass(frozen=True)
class BackendStatus:
    """One backend of one op on one device type: can it run here, is it ``auto``'s choice, and why not."""

    op: str
    device: str
    backend: str
    available: bool
    auto: bool
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class BackendReport:
    """Per op and device type, the backends that can run in this process and why the others cannot.

    ``statuses`` is flat (one :class:`BackendStatus` per op, device and backend
    the op has); ``functions`` maps each op to its public functions;
    ``environment`` records what decided the answers (torch build, GPU,
    ``TRITON_INTERPRET``, ``STREAMMEM_BACKEND``).  ``str(report)`` is a readable
    summary, ``report.to_dict()`` a JSON-ready one.
    """

    statuses: tuple[BackendStatus, ...]
    functions: Mapping[str, tuple[str, ...]]
    environment: Mapping[str, str]

    def available(self, op: str, device: str = "cpu") -> list[str]:
        """Backends of ``op`` that can run on ``device`` tensors here, in ``BACKENDS`` order."""
        return [s.backend for s in self.statuses if s.op == op and s.device == device and s.available]

    def auto(self, op: str, device: str = "cpu") -> str | None:
        """The backend ``auto`` picks for ``op`` on ``device`` tensors (None: nothing can run there)."""
        return next((s.backend for s in self.statuses if s.op == op and s.device == device and s.auto), None)

    def to_dict(self) -> dict:
        ops: dict = {}
        for s in self.statuses:
            entry = ops.setdefault(s.op, {"functions": list(self.functions.get(s.op, ())), "devices": {}})
            device = entry["devices"].setdefault(s.device, {"auto": self.auto(s.op, s.device), "backends": {}})
            device["backends"][s.backend] = {"available": s.available, "reasons": list(s.reasons)}
        return {"environment": dict(self.environment), "ops": ops}

    def __str__(self) -> str:
        env = self.environment
        lines = [f"streammem-kernels {env['streammem_kernels']} backends (torch {env['torch']}; "
                 f"CUDA: {env['cuda']}; TRITON_INTERPRET={env['TRITON_INTERPRET']}; "
                 f"STREAMMEM_BACKEND={env['STREAMMEM_BACKEND']})"]
        for op, functions in self.functions.items():
            lines += ["", f"{op} ({', '.join(functions)})"]
            for device in DEVICE_BACKENDS:
                rows = [s for s in self.statuses if s.op == op and s.device == device]
                if not rows:
                    continue
                can = [s.backend for s in rows if s.available]
                lines.append(f"  {device:<4}  auto -> {self.auto(op, device) or 'nothing'}; "
                             f"can run: {', '.join(can) or 'none'}")
                width = max(len(s.backend) for s in rows)
                lines += [f"        {s.backend:<{width}}: " + "; ".join(s.reasons) for s in rows if not s.available]
        return "\n".join(lines)


def _family_modules(family: str) -> list:
    """The op folder's package and its public modules (``tree``: the package, store, search, topk)."""
    package = importlib.import_module(f"streammem_kernels.{family}")
    return [package] + [importlib.import_module(f"{package.__name__}.{info.name}")
                        for info in pkgutil.iter_modules(package.__path__) if not info.name.startswith("_")]


def _op_tables(family: str) -> list[Op]:
    """The Op tables of one family (every op whose backends live in ``_cpu_<family>`` / ``_cuda_<family>``)."""
    tables: list[Op] = []
    for module in _family_modules(family):
        tables += [v for v in vars(module).values() if isinstance(v, Op) and v.native == family and v not in tables]
    return tables


def _table_reasons(table: Op, backend: str, device: torch.device) -> list[str]:
    try:
        return table.reasons(backend, device)
    except TypeError:  # op-specific limits that need input facts (sizes, dtype): input-dependent, not listed
        return common_reasons(backend, table.native, device)


_BACKEND_REPORT_EAGER = eager_only(
    "backend_report describes this process (imports, environment, devices) as Python objects; call it "
    "outside torch.compile")


def backend_report() -> BackendReport:
    """Which backends of every op can run in this process, per device type, and why the others cannot.

    Reasons are the ones dispatch itself gives (module not built, no GPU,
    Triton missing or not interpreting); limits that depend on the input
    (dtype, sizes) are not listed, they are reported by the call that hits them.

    Returns
    -------
    BackendReport
        ``print(report)`` for a summary, ``report.available("motion", "cpu")``,
        ``report.auto("motion", "cpu")``, ``report.to_dict()`` for JSON.  Not for torch.compile: with
        ``fullgraph=True`` it raises, without it the graph breaks and it runs eagerly.
    """
    _BACKEND_REPORT_EAGER()
    # The package's face, loaded before anyone can call this: its __all__ says which names are public.
    package = sys.modules[__name__.rpartition(".")[0]]
    gpu = torch.cuda.is_available()
    override = os.environ.get("STREAMMEM_BACKEND", "auto").strip().lower()
    statuses: list[BackendStatus] = []
    functions: dict[str, tuple[str, ...]] = {}
    for op in op_families():
        tables = _op_tables(op)
        home = f"streammem_kernels.{op}"
        functions[op] = tuple(name for name in package.__all__
                              if (getattr(getattr(package, name), "__module__", None) or "").startswith(home))
        for device_type, candidates in DEVICE_BACKENDS.items():
            device = torch.device(device_type)
            rows = {}
            for backend in candidates:
                having = [t for t in tables if backend in t.impls]
                if not having:
                    continue
                reasons = [] if gpu or device_type != "cuda" else ["no CUDA device is available"]
                for table in having:
                    reasons += [r for r in _table_reasons(table, backend, device) if r not in reasons]
                rows[backend] = reasons
            if override in BACKENDS:  # what select() does with STREAMMEM_BACKEND: that backend or an error
                chosen = override if override in rows and not rows[override] else None
            else:
                chosen = next((b for b in AUTO_ORDER.get(device_type, ("torch",)) if b in rows and not rows[b]), None)
            statuses += [BackendStatus(op, device_type, b, not why, b == chosen, tuple(why))
                         for b, why in sorted(rows.items(), key=lambda kv: BACKENDS.index(kv[0]))]
    environment = {
        "streammem_kernels": getattr(package, "__version__", "?"),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if gpu else
        ("not available" if torch.version.cuda else "not available (CPU build of torch)"),
        "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "unset"),
        "STREAMMEM_BACKEND": os.environ.get("STREAMMEM_BACKEND", "unset"),
    }
    return BackendReport(tuple(statuses), functions, environment)
