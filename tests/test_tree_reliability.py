"""Hostile inputs for the cosine tree and top-k (issue 17): malformed saved trees, extreme
norms, ties among identical keys, absurd sizes and concurrent readers and writers."""
from __future__ import annotations

import threading

import pytest
import torch

from conftest import cpu_backends
from streammem_kernels.tree import COSINE_TOPK, TREE_SEARCH, CosineTree, cosine_topk, tree_search


def _tree(seed: int = 0, leaves: int = 12, dim: int = 6) -> CosineTree:
    g = torch.Generator().manual_seed(seed)
    tree = CosineTree(dim)
    tree.add_leaves(torch.randn(leaves, dim, generator=g))
    tree.grow(3)
    return tree


# --------------------------------------------------------------------------
# CosineTree.load: validate before trusting
# --------------------------------------------------------------------------
def _saved(tmp_path, tree=None, **edits):
    """Path of a state of ``tree`` saved with ``edits`` applied (state[key] = value or fn(state))."""
    tree = tree or _tree()
    state = tree.state_dict()
    for key, value in edits.items():
        state[key] = value(state) if callable(value) else value
    path = tmp_path / "edited.pt"
    torch.save(state, path)
    return path


def _set(key, index, value):
    def edit(state):
        t = state[key].clone()
        t[index] = value
        return t

    return edit


def _three_node_cycle(state):
    # Leaves 0, 1, 2 claiming parents [1, 0, 0]: a cycle 0 -> 1 -> 0.
    return torch.tensor([1, 0, 0])


@pytest.mark.parametrize("edits, match", [
    ({"parent": _set("parent", 0, 13)}, "parent"),  # forward link
    ({"level": _set("level", 12, 10**6)}, "level"),
    ({"level": _set("level", 12, 10**9)}, "level"),
    ({"level": _set("level", 0, -1)}, "level"),
    ({"child_idx": _set("child_idx", 0, 10**6)}, "child_idx"),
    ({"child_idx": _set("child_idx", 0, 1)}, "inconsistent"),  # duplicate child in a run
    ({"child_ptr": _set("child_ptr", 3, 10**9)}, "child_ptr"),
    ({"embeddings": _set("embeddings", (0, 0), float("nan"))}, "non-finite"),
    ({"embeddings": _set("embeddings", 0, 3.0)}, "unit-norm"),
    ({"embeddings": lambda s: s["embeddings"][:1].expand(s["embeddings"].shape[0], -1)}, "stride-0"),
    ({"embeddings": lambda s: s["embeddings"].t().contiguous().t()}, "contiguous"),
    ({"embeddings": lambda s: s["embeddings"].double()}, "float32"),
    ({"utility": _set("utility", 0, float("inf"))}, "utility"),
    ({"payload": lambda s: s["payload"][:-1]}, "payload"),
    ({"alive": lambda s: s["alive"].to(torch.int64)}, "alive"),
    ({"dim": 10**12}, "dim"),
    ({"dim": "6"}, "dim"),
    ({"version": 99}, "version"),
    ({"checksum": 12345}, "checksum"),
])
def test_load_rejects_malformed_states_with_a_value_error_naming_the_problem(tmp_path, edits, match):
    with pytest.raises(ValueError, match=match):
        CosineTree.load(_saved(tmp_path, **edits))


def test_load_rejects_a_parent_cycle_and_never_hangs_in_remove(tmp_path):
    tree = CosineTree(4)
    tree.add_leaves(torch.eye(4)[:3])
    path = _saved(tmp_path, tree, parent=torch.tensor([1, 0, 0]))
    with pytest.raises(ValueError, match="parent"):
        CosineTree.load(path)


@pytest.mark.parametrize("root_level", [10**6, 10**9])
def test_load_rejects_a_root_level_beyond_the_node_count(tmp_path, root_level):
    tree = _tree()
    root = int(tree.roots[-1])
    with pytest.raises(ValueError, match="level"):
        CosineTree.load(_saved(tmp_path, tree, level=_set("level", root, root_level)))


def test_load_rejects_missing_keys_and_non_states(tmp_path):
    state = _tree().state_dict()
    del state["child_idx"]
    torch.save(state, tmp_path / "missing.pt")
    with pytest.raises(ValueError, match="child_idx"):
        CosineTree.load(tmp_path / "missing.pt")
    torch.save([1, 2, 3], tmp_path / "list.pt")
    with pytest.raises(ValueError, match="saved CosineTree"):
        CosineTree.load(tmp_path / "list.pt")
    (tmp_path / "text.pt").write_text("not a tree")
    with pytest.raises(ValueError, match="readable"):
        CosineTree.load(tmp_path / "text.pt")
    with pytest.raises(FileNotFoundError):
        CosineTree.load(tmp_path / "absent.pt")


def _corrupt_and_load(path, mutate):
    data = bytearray(path.read_bytes())
    mutate(data)
    path.write_bytes(bytes(data))
    return CosineTree.load(path)


def _file_cases():
    def overwrite_ff(data):  # a run of 0xFF in the middle of the arrays
        mid = len(data) // 2
        data[mid : mid + 64] = b"\xff" * 64

    def flip_bytes(data):
        for pos in range(len(data) // 3, 2 * len(data) // 3, 97):
            data[pos] ^= 0x5A

    def truncate(data):
        del data[len(data) // 2 :]

    def empty(data):
        del data[:]

    return [overwrite_ff, flip_bytes, truncate, empty]


@pytest.mark.parametrize("mutate", _file_cases(), ids=lambda f: f.__name__)
def test_load_rejects_corrupted_files(tmp_path, mutate):
    tree = _tree(leaves=40, dim=16)
    path = tmp_path / "tree.pt"
    tree.save(path)
    assert CosineTree.load(path).num_nodes == tree.num_nodes
    with pytest.raises(ValueError):
        _corrupt_and_load(path, mutate)


def test_every_single_byte_flip_of_the_arrays_is_rejected_or_harmless(tmp_path):
    """The CRC covers every array byte: flipping any single byte of a saved file either makes
    it unreadable or fails the checksum (never a tree with different contents)."""
    tree = _tree(leaves=5, dim=4)
    path = tmp_path / "tree.pt"
    tree.save(path)
    clean = path.read_bytes()
    changed = 0
    for pos in range(0, len(clean), max(1, len(clean) // 300)):
        data = bytearray(clean)
        data[pos] ^= 0xFF
        path.write_bytes(bytes(data))
        try:
            back = CosineTree.load(path)
        except ValueError:
            changed += 1
            continue
        state, ref = back.state_dict(), tree.state_dict()
        assert all(torch.equal(state[key], ref[key]) for key in ref if isinstance(ref[key], torch.Tensor))
    assert changed > 0


def test_loaded_tree_is_usable_after_validation(tmp_path):
    tree = _tree(leaves=30)
    tree.remove([0, 1])
    path = tmp_path / "t.pt"
    tree.save(path)
    back = CosineTree.load(path)
    assert torch.equal(back.roots, tree.roots)
    back.remove(int(back.roots[0]), cascade=True)
    q = torch.randn(2, 6)
    tree_search(back, q, beam=2, k=3)
