"""The file format of :meth:`CosineTree.save <streammem_kernels.CosineTree.save>` and
:meth:`~streammem_kernels.CosineTree.load`: the saved arrays, their checksum and the validation of a
loaded state, which every malformed file fails with a ``ValueError`` naming what is wrong.
"""
from __future__ import annotations

import zlib

import numpy as np
import torch

from .reference import MAX_DIM, MAX_NODES, MAX_TABLE

FORMAT = "streammem.CosineTree"
# Version 2 adds the tombstone mask "alive"; version 1 files (no removals) still load.
# Version 3 adds a CRC32 of the arrays ("checksum"); files without one are validated structurally.
FORMAT_VERSION = 3


# Saved arrays: name -> (dtype, shape as a function of (n, n_edges, dim)).
SAVED_ARRAYS = {
    "embeddings": (torch.float32, lambda n, e, d: (n, d)),
    "level": (torch.int64, lambda n, e, d: (n,)),
    "parent": (torch.int64, lambda n, e, d: (n,)),
    "child_ptr": (torch.int64, lambda n, e, d: (n + 1,)),
    "child_idx": (torch.int64, lambda n, e, d: (e,)),
    "utility": (torch.float32, lambda n, e, d: (n,)),
    "payload": (torch.int64, lambda n, e, d: (n,)),
    "alive": (torch.bool, lambda n, e, d: (n,)),
}
# |norm - 1| of a saved unit row: float32 normalisation leaves a few ulps; 1e-4 also accepts
# rows saved from float64 stores, and rejects any corrupted exponent or sign-flipped component
# of weight.
UNIT_TOLERANCE = 1e-4


def checksum(state: dict) -> int:
    """CRC32 of the dimension, then each saved array's shape and bytes (in SAVED_ARRAYS order)."""
    crc = zlib.crc32(str(int(state["dim"])).encode())
    for name in SAVED_ARRAYS:
        t = state[name].contiguous()
        crc = zlib.crc32(repr((name, tuple(t.shape))).encode(), crc)
        if t.numel():
            crc = zlib.crc32(t.numpy().reshape(-1).view(np.uint8), crc)
    return crc


def validate_state(state: dict, path) -> None:
    """ValueError naming the first problem of a loaded state (see :meth:`CosineTree.load`)."""
    def bad(what: str) -> ValueError:
        return ValueError(f"path holds an invalid CosineTree ({what}): {path}")

    dim = state.get("dim")
    if type(dim) is not int or not 1 <= dim <= MAX_DIM:
        raise bad(f"dim must be an int in [1, {MAX_DIM}], got {dim!r}")
    for name, (dtype, _) in SAVED_ARRAYS.items():
        t = state.get(name)
        if not isinstance(t, torch.Tensor):
            raise bad(f"'{name}' missing or not a tensor")
        if t.dtype != dtype or t.layout != torch.strided or t.device.type != "cpu":
            raise bad(f"'{name}' must be a dense {dtype} tensor, got {t.dtype} {t.layout}")
        if not t.is_contiguous() or any(st == 0 and sz > 1 for st, sz in zip(t.stride(), t.shape)):
            raise bad(f"'{name}' must be contiguous (no stride-0 or strided views)")
    emb = state["embeddings"]
    if emb.dim() != 2:
        raise bad(f"'embeddings' must be (num_nodes, dim), got shape {tuple(emb.shape)}")
    n, n_edges = emb.shape[0], state["child_idx"].shape[0] if state["child_idx"].dim() == 1 else -1
    for name, (_, shape) in SAVED_ARRAYS.items():
        if tuple(state[name].shape) != shape(n, max(n_edges, 0), dim):
            raise bad(f"shape of '{name}' is {tuple(state[name].shape)}, expected {shape(n, max(n_edges, 0), dim)} "
                      f"for {n} nodes, {n_edges} edges and dim {dim} (mismatched lengths)")
    if n > MAX_NODES or n * dim > MAX_TABLE:
        raise bad(f"{n} nodes of dim {dim} exceed the bounds (<= {MAX_NODES} nodes, <= {MAX_TABLE} floats)")
    if "checksum" in state:
        if type(state["checksum"]) is not int or state["checksum"] != checksum(state):
            raise bad("checksum mismatch: the file was modified or corrupted after it was saved")
    if not bool(torch.isfinite(emb).all()):
        raise bad("non-finite embeddings")
    norms = torch.linalg.vector_norm(emb, dim=1)
    if not bool(((norms == 0) | ((norms - 1).abs() <= UNIT_TOLERANCE)).all()):
        raise bad("embeddings must be unit-norm rows (or zero rows)")
    if not bool(torch.isfinite(state["utility"]).all()):
        raise bad("non-finite utility")
    ptr, kids, parent, level, alive = (state[k] for k in ("child_ptr", "child_idx", "parent", "level", "alive"))
    if int(ptr[0]) != 0 or int(ptr[-1]) != n_edges or not bool((ptr[1:] >= ptr[:-1]).all()):
        raise bad("inconsistent arrays: child_ptr must rise from 0 to the number of edges")
    if not bool(((kids >= 0) & (kids < n)).all()):
        raise bad("inconsistent arrays: child_idx must hold node ids in [0, num_nodes)")
    if not bool(((parent >= -1) & (parent < n)).all()):
        raise bad("inconsistent arrays: parent must hold -1 or node ids in [0, num_nodes)")
    ids = torch.arange(n)
    if not bool(((parent == -1) | (parent > ids)).all()):
        raise bad("inconsistent arrays: every parent must come after its children (a cycle or a forward link)")
    if not bool(((level >= 0) & (level < max(n, 1))).all()):
        raise bad("levels must lie in [0, num_nodes)")
    # Kernels follow child_idx from live roots: a dead id there would be searched.
    if not bool(alive[kids].all()):
        raise bad("inconsistent arrays: child runs must hold live nodes only")
    runs = ptr[1:] - ptr[:-1]
    owner = torch.repeat_interleave(ids, runs)
    if not bool((parent[kids] == owner).all()):
        raise bad("inconsistent arrays: child runs and parent disagree")
    if int(((parent >= 0) & alive).sum()) != n_edges:
        raise bad("inconsistent arrays: a node with a parent is missing from its parent's child run")
    same_run = owner[1:] == owner[:-1]
    if not bool((~same_run | (kids[1:] > kids[:-1])).all()):
        raise bad("inconsistent arrays: child runs must be ascending (chronological)")
    dead = ~alive
    if not bool((parent[dead] == -1).all()) or not bool((runs[dead] == 0).all()):
        raise bad("inconsistent arrays: removed nodes must have no parent and no children")
    expect = torch.zeros(n, dtype=torch.int64)
    if n_edges:
        expect.scatter_reduce_(0, owner, level[kids] + 1, reduce="amax", include_self=True)
    if not bool((level[alive] == expect[alive]).all()):
        raise bad("inconsistent levels: a node's level must be 1 + the largest level of its children (0 for leaves)")


def read_state(path) -> dict:
    """The validated state of a file :meth:`CosineTree.save` wrote (see :meth:`CosineTree.load`)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        raise
    except Exception as exc:  # truncated/corrupt archive, hostile pickle, absurd sizes
        raise ValueError(f"path does not hold a readable saved CosineTree ({type(exc).__name__}: "
                         f"{str(exc)[:200]}): {path}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"path does not hold a saved CosineTree: {path}")
    version = state.get("version")
    if type(version) is not int or version not in (1, 2, FORMAT_VERSION):
        raise ValueError(f"path holds an unsupported CosineTree format version {version!r}: {path}")
    if "alive" not in state and version == 1:
        emb = state.get("embeddings")
        n = emb.shape[0] if isinstance(emb, torch.Tensor) and emb.dim() >= 1 else 0
        state["alive"] = torch.ones(n, dtype=torch.bool)
    validate_state(state, path)
    return state
