"""The saved state of a :class:`~streammem_kernels.CosineTree`: what :meth:`CosineTree.save
<streammem_kernels.CosineTree.save>` writes (through :mod:`streammem_kernels.checkpoint`, the one
checkpoint format: a header, a SHA-256 of the payload, an atomic replace) and the validation of a
loaded state, which every malformed state fails with a ``ValueError`` naming the path and the field.
"""
from __future__ import annotations

import torch

from .. import checkpoint
from .reference import MAX_DIM, MAX_NODES, MAX_TABLE

FORMAT = "streammem.CosineTree"
# Version 2 added the tombstone mask "alive"; version 3 is version 2 in a file of the one checkpoint
# format (the checksum moved from a CRC32 field of the state to the file's header).  State dicts of
# versions 1 and 2 (a tree nested in an older in-memory state) still load; files before the checkpoint
# format do not (checkpoint.load refuses them, naming the format version).
FORMAT_VERSION = 3
KIND = "CosineTree"


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


def validate_state(state, path=None) -> dict:
    """The arrays of a tree state, checked (a ``ValueError`` naming ``path`` and the field otherwise).

    ``state`` is a dict from :meth:`CosineTree.state_dict` or a :class:`~streammem_kernels.checkpoint.StateReader`
    of one (a tree nested in another object's checkpoint).  Checks: the layout version, every array's
    dtype, contiguity and shape, the size bounds, finite unit-norm (or zero) embeddings, finite utility,
    CSR offsets rising from 0 to the edge count, ids in range, parents after their children (so no
    cycle), child runs that match ``parent`` exactly and hold live nodes in ascending order, removed
    nodes without links, and levels ``1 + max(level of children)`` (0 for leaves).
    """
    reader = checkpoint.reader_for(state, KIND, path)
    if reader.has("format"):
        reader.require(reader.get("format") == FORMAT, "format",
                       f"must be {FORMAT!r}, got {reader.get('format')!r:.60}")
    version = reader.int("version", low=1, high=FORMAT_VERSION) if reader.has("version") else FORMAT_VERSION
    dim = reader.int("dim", low=1, high=MAX_DIM)
    arrays = {}
    for name, (dtype, _) in SAVED_ARRAYS.items():
        if name == "alive" and version == 1 and not reader.has("alive"):
            continue
        t = reader.tensor(name, dtype=dtype)
        reader.require(t.is_contiguous() and not any(st == 0 and sz > 1 for st, sz in zip(t.stride(), t.shape)),
                       name, "must be contiguous (no stride-0 or strided views)")
        arrays[name] = t
    emb = arrays["embeddings"]
    reader.require(emb.dim() == 2, "embeddings", f"must be (num_nodes, dim), got shape {tuple(emb.shape)}")
    n = emb.shape[0]
    if "alive" not in arrays:  # version 1: no removals yet
        arrays["alive"] = torch.ones(n, dtype=torch.bool)
    kids_raw = arrays["child_idx"]
    n_edges = kids_raw.shape[0] if kids_raw.dim() == 1 else -1
    for name, (_, shape) in SAVED_ARRAYS.items():
        want = shape(n, max(n_edges, 0), dim)
        reader.require(tuple(arrays[name].shape) == want, name,
                       f"has shape {tuple(arrays[name].shape)}, expected {want} for {n} nodes, {n_edges} edges and "
                       f"dim {dim} (mismatched lengths)")
    reader.require(n <= MAX_NODES and n * dim <= MAX_TABLE, "embeddings",
                   f"holds {n} nodes of dim {dim}, beyond the bounds (<= {MAX_NODES} nodes, <= {MAX_TABLE} floats)")
    reader.tensor("embeddings", finite=True)
    norms = torch.linalg.vector_norm(emb, dim=1)
    reader.require(bool(((norms == 0) | ((norms - 1).abs() <= UNIT_TOLERANCE)).all()), "embeddings",
                   "must hold unit-norm rows (or zero rows)")
    reader.tensor("utility", finite=True)
    ptr, kids, parent, level, alive = (arrays[k] for k in ("child_ptr", "child_idx", "parent", "level", "alive"))
    reader.require(int(ptr[0]) == 0 and int(ptr[-1]) == n_edges and bool((ptr[1:] >= ptr[:-1]).all()), "child_ptr",
                   "is inconsistent: it must rise from 0 to the number of edges")
    reader.require(bool(((kids >= 0) & (kids < n)).all()), "child_idx",
                   "is inconsistent: it must hold node ids in [0, num_nodes)")
    reader.require(bool(((parent >= -1) & (parent < n)).all()), "parent",
                   "is inconsistent: it must hold -1 or node ids in [0, num_nodes)")
    ids = torch.arange(n)
    reader.require(bool(((parent == -1) | (parent > ids)).all()), "parent",
                   "is inconsistent: every parent must come after its children (a cycle or a forward link)")
    reader.require(bool(((level >= 0) & (level < max(n, 1))).all()), "level", "must lie in [0, num_nodes)")
    # Kernels follow child_idx from live roots: a dead id there would be searched.
    reader.require(bool(alive[kids].all()), "child_idx", "is inconsistent: child runs must hold live nodes only")
    runs = ptr[1:] - ptr[:-1]
    owner = torch.repeat_interleave(ids, runs)
    reader.require(bool((parent[kids] == owner).all()), "child_idx", "is inconsistent: child runs and parent disagree")
    reader.require(int(((parent >= 0) & alive).sum()) == n_edges, "parent",
                   "is inconsistent: a node with a parent is missing from its parent's child run")
    same_run = owner[1:] == owner[:-1]
    reader.require(bool((~same_run | (kids[1:] > kids[:-1])).all()), "child_idx",
                   "is inconsistent: child runs must be ascending (chronological)")
    dead = ~alive
    reader.require(bool((parent[dead] == -1).all()) and bool((runs[dead] == 0).all()), "alive",
                   "is inconsistent: removed nodes must have no parent and no children")
    expect = torch.zeros(n, dtype=torch.int64)
    if n_edges:
        expect.scatter_reduce_(0, owner, level[kids] + 1, reduce="amax", include_self=True)
    reader.require(bool((level[alive] == expect[alive]).all()), "level",
                   "is inconsistent: a node's level must be 1 + the largest level of its children (0 for leaves)")
    return {"dim": dim, **arrays}


def save_state(path, state: dict) -> None:
    """Write a tree's ``state_dict()`` to ``path`` in the one checkpoint format (atomically)."""
    checkpoint.save(path, KIND, state, version=FORMAT_VERSION)


def read_state(path) -> dict:
    """The validated arrays of a file :meth:`CosineTree.save` wrote (see :meth:`CosineTree.load`)."""
    state, _ = checkpoint.load(path, KIND, versions=(FORMAT_VERSION,))
    return validate_state(checkpoint.StateReader(path, KIND, state))
