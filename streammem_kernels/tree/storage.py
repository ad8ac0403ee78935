"""How a :class:`~streammem_kernels.CosineTree` holds its tables: their allocation (2 MB pages for
the tables a search reads at random), the writers of the half-precision and int8 scan copies, the consistent
snapshot a search reads (:class:`SearchArrays`) and the closure of a removal
(:func:`removal_closure`: which nodes a removal takes with it, which levels change).
"""
from __future__ import annotations

import ctypes
import functools
import mmap
import sys

import torch

from ..runtime import dispatch
from ..runtime.native import view


class SearchArrays:
    """A consistent snapshot of what a search reads of a tree: data pointers of the used prefixes,
    the sizes, and the tensors themselves (``tensors``: embeddings, child_ptr, child_idx, roots,
    level, utility, each the used prefix), which it keeps alive.

    Built under the tree's lock and never mutated structurally afterwards (writers that rewrite
    the CSR or the levels do so in fresh tensors, see :class:`~streammem_kernels.CosineTree`), so
    a search that holds one stays in bounds whatever other threads do to the tree.  ``native``
    holds what a search backend derives from the snapshot once (the C++ backend's views of its
    tensors), None until then.  ``scan_tensor`` is the used prefix of the tree's half-precision
    scan copy (None without one), ``scan`` its address (0 without one), ``scan_norm`` and
    ``scan_err`` upper bounds on the largest embedding norm and on the largest L2 distance of an
    embedding to its copy.
    """

    __slots__ = ("embeddings", "dim", "child_ptr", "child_idx", "roots", "num_roots", "level", "utility", "height",
                 "tensors", "fanout", "num_live", "native", "scan_tensor", "scan", "scan_norm", "scan_err")

    def __init__(self, tensors: tuple, dim: int, height: int, fanout: int, num_live: int,
                 scan: tuple | None = None):
        self.tensors = tensors
        emb, ptr, kids, roots, level, utility = tensors
        self.embeddings, self.dim, self.child_ptr, self.child_idx = emb.data_ptr(), dim, ptr.data_ptr(), kids.data_ptr()
        self.roots, self.num_roots, self.level, self.utility = roots.data_ptr(), roots.numel(), level.data_ptr(), \
            utility.data_ptr()
        self.height, self.fanout, self.num_live = height, fanout, num_live
        # The half-precision scan copy (CosineTree(half_scan=True)): its used prefix (kept alive), its
        # address (0 without one) and the bounds the C++ beam search derives its error bound from.
        self.scan_tensor, self.scan_norm, self.scan_err = scan if scan is not None else (None, 0.0, 0.0)
        self.scan = 0 if self.scan_tensor is None else self.scan_tensor.data_ptr()
        self.native = None


# Tables a search reads at random (embeddings, levels, CSR) from this size up ask Linux for
# 2 MB pages (transparent huge pages, "madvise" mode): a search at 10^6 leaves touches rows
# scattered over a 1.7 GB table, and with 4 KB pages nearly every row also costs a TLB miss.
HUGE_PAGE_MIN_BYTES = 4 << 20
_MADV_HUGEPAGE = 14  # <sys/mman.h>, Linux


@functools.cache
def _madvise():
    """libc's ``madvise``, or None where there is none (not Linux, no libc)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def allocate(shape: tuple, dtype: torch.dtype, fill, device: torch.device) -> torch.Tensor:
    """A new tensor filled with ``fill`` (None: uninitialised); large CPU ones are advised to huge
    pages before their first touch, which is what decides the page size.  The advice is a hint:
    refused (another OS, THP disabled), the tensor is the same, on 4 KB pages."""
    t = torch.empty(shape, dtype=dtype, device=device)
    nbytes = t.numel() * t.element_size()
    madvise = _madvise() if device.type == "cpu" and nbytes >= HUGE_PAGE_MIN_BYTES else None
    if madvise is not None:
        page = mmap.PAGESIZE
        lo, hi = (t.data_ptr() + page - 1) // page * page, (t.data_ptr() + nbytes) // page * page
        madvise(lo, hi - lo, _MADV_HUGEPAGE)
    if fill is not None:
        t.fill_(fill)
    return t


def half_copy_module(option: str = "half_scan"):
    """The C++ module whose ``half_copy`` / ``int8_copy`` write the scan copies; ValueError naming ``option``
    when it is not built (only its searches read the copies)."""
    module, reason = dispatch.load_native("cpu", "tree")
    if module is None:
        raise ValueError(f"{option}=True needs the C++ module streammem_kernels._cpu_tree, which the scan reading "
                         f"the copy runs in: {reason}")
    return module


def write_half_copy(src: torch.Tensor, dst: torch.Tensor) -> tuple[float, float]:
    """Write the float16 scan copy of the float32 rows ``src`` (n, D) into ``dst`` (n, D), both
    C-contiguous CPU tensors; returns upper bounds on the largest row norm and on the largest L2
    distance of a row to its copy (csrc/cpu/tree/half_scan.cpp)."""
    bounds = torch.empty(2, dtype=torch.float64)
    half_copy_module().half_copy(view(src), view(dst), view(bounds))
    norm, err = bounds.tolist()
    return norm, err


def write_int8_copy(src: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> tuple[float, float]:
    """Write the int8 scan copy of the float32 rows ``src`` (n, D): ``codes`` (n, D) int8 and ``scales`` (n,)
    float32 (a row ~ its scale x its codes), all C-contiguous CPU tensors; returns upper bounds on the
    largest row norm and on the largest L2 distance of a row to its copy (csrc/cpu/tree/int8_scan.cpp)."""
    bounds = torch.empty(2, dtype=torch.float64)
    half_copy_module().int8_copy(view(src), view(codes), view(scales), view(bounds))
    norm, err = bounds.tolist()
    return norm, err


def longest_run(child_ptr: torch.Tensor) -> int:
    """Longest CSR run (most children of a node); a host read, done once per mutation."""
    return int((child_ptr[1:] - child_ptr[:-1]).max()) if child_ptr.numel() > 1 else 0


def removal_closure(targets: list[int], ptr: list[int], kids: list[int], parent: list[int], level: list[int],
                    cascade: bool) -> tuple[list[int], dict[int, int]]:
    """What removing the live nodes ``targets`` takes with it, on the tree's CSR (``ptr``, ``kids``),
    ``parent`` and ``level`` as lists: ``(removed, new_level)``, every node removed in ascending
    order (``targets``, their live descendants when ``cascade``, each ancestor left without a live
    child) and the recomputed level of each surviving ancestor whose level may change.

    ValueError when a target has a live child outside ``targets`` and not ``cascade``.
    """
    dead = set(targets)
    # Descendants: CSR runs hold live children only, so a walk reaches live nodes only.
    stack = list(targets)
    while stack:
        node = stack.pop()
        for c in kids[ptr[node] : ptr[node + 1]]:
            if c in dead:
                continue
            if not cascade:
                raise ValueError(
                    f"ids must not hold a node with live children unless cascade=True; node {node} "
                    f"has live child {c}"
                )
            dead.add(c)
            stack.append(c)
    # Ancestors: a parent whose live children are all removed goes too;
    # the others get their level recomputed from the surviving children.
    touched = {parent[i] for i in dead if parent[i] >= 0 and parent[i] not in dead}
    new_level: dict[int, int] = {}
    while touched:
        # Deepest first, so a node's children are settled before it.
        node = min(touched, key=lambda i: level[i])
        touched.discard(node)
        live = [c for c in kids[ptr[node] : ptr[node + 1]] if c not in dead]
        if not live:
            dead.add(node)
        else:
            lvl = 1 + max(new_level.get(c, level[c]) for c in live)
            if lvl == level[node] and node not in new_level:
                continue
            new_level[node] = lvl
        if parent[node] >= 0 and parent[node] not in dead:
            touched.add(parent[node])
    return sorted(dead), new_level
