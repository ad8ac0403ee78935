"""Shared checks of the checkpoint tests: damaged files (flipped bits, truncations) of any object that
saves state are refused with a ValueError naming the file, or load as the original; and the files a
save leaves in its folder (no temporaries)."""
from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from streammem_kernels.checkpoint import HEADER_BYTES


def damaged_versions(blob: bytes, *, flips: int = 32, cuts: int = 12, seed: int = 0):
    """(what, bytes) pairs: single-bit flips at random positions (every header field included) and
    truncations at random lengths (empty, inside the header, just after it, one byte short)."""
    rng = random.Random(seed)
    positions = sorted(set(rng.sample(range(len(blob)), min(flips, len(blob)))) | set(range(0, HEADER_BYTES, 9)))
    for pos in positions:
        damaged = bytearray(blob)
        bit = rng.randrange(8)
        damaged[pos] ^= 1 << bit
        yield f"bit {bit} of byte {pos} flipped", bytes(damaged)
    lengths = {0, 1, HEADER_BYTES - 1, HEADER_BYTES, HEADER_BYTES + 1, len(blob) - 1}
    lengths |= set(rng.sample(range(len(blob)), min(cuts, len(blob))))
    for cut in sorted(lengths):
        yield f"truncated to {cut} bytes", blob[:cut]
    yield "one byte appended", blob + b"\0"


def assert_damage_refused_or_identical(path, load, same, **kwargs) -> int:
    """Damage the checkpoint file ``path`` in every way of :func:`damaged_versions`; after each,
    ``load()`` must raise ValueError naming the file, or return an object that ``same(obj)`` accepts
    (identical to the original).  The original is restored at the end; returns how many were refused."""
    path = Path(path)
    blob = path.read_bytes()
    refused = 0
    try:
        for what, data in damaged_versions(blob, **kwargs):
            path.write_bytes(data)
            try:
                obj = load()
            except ValueError as exc:
                assert path.name in str(exc), f"{what}: the error does not name {path.name}: {exc}"
                refused += 1
                continue
            assert same(obj), f"{what}: loaded a state different from the one saved"
    finally:
        path.write_bytes(blob)
    return refused


def temporaries(folder) -> list[str]:
    """Hidden temporaries a writer left in ``folder``."""
    return sorted(n for n in os.listdir(folder) if n.startswith(".") and n.endswith(".tmp"))


def assert_plain_torch_file_refused(path, load, state=None):
    """A plain ``torch.save`` file where the checkpoint was (a checkpoint from before the format) is
    refused with one ValueError naming the format version."""
    import torch

    torch.save({"format": "old"} if state is None else state, path)
    with pytest.raises(ValueError, match="predates checkpoint format 1"):
        load()


def same_state(a, b) -> bool:
    """Two states (nested dicts, lists, tensors, numbers, strings) hold the same values, tensors bit
    for bit (dtype and shape included)."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a, b))
    if isinstance(a, dict) or isinstance(b, dict):
        return isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys() and all(
            same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def edit_field(path: str, change):
    """A state editor: the field at dotted ``path`` replaced by ``change`` (or ``change(old)`` when callable)."""
    def edit(state):
        node = state
        parts = path.split(".")
        for part in parts[:-1]:
            node = node[part]
        node[parts[-1]] = change(node[parts[-1]]) if callable(change) else change
        return state
    return edit


def with_first(t, value):
    """A copy of tensor ``t`` whose first element is ``value``."""
    t = t.clone()
    t[0] = value
    return t

