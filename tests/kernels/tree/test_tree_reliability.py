"""Hostile inputs for the cosine tree and top-k: malformed saved trees, extreme
norms, ties among identical keys, absurd sizes and concurrent readers and writers."""
from __future__ import annotations

import threading

import pytest
import torch

from streammem_kernels import CosineTree, checkpoint, cosine_topk, tree_search
from tests.support.checkpoint_checks import (assert_damage_refused_or_identical, assert_plain_torch_file_refused,
                                             temporaries)
from tests.support.device_checks import cpu_backends
from tests.support.kill_points import kill_writer
from streammem_kernels.tree.search import TREE_SEARCH
from streammem_kernels.tree.topk import COSINE_TOPK


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
    path = tmp_path / "edited.ckpt"
    checkpoint.save(path, "CosineTree", state, version=3)  # a valid file around a hostile state
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
    ({"embeddings": _set("embeddings", (0, 0), float("nan"))}, "'embeddings' must be finite"),
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
    ({"format": "streammem.Other"}, "format"),
])
def test_load_rejects_malformed_states_with_a_value_error_naming_the_problem(tmp_path, edits, match):
    """Each hostile state, inside a file whose header and checksum are valid, is refused naming the
    file and the field; the same state handed to from_state_dict is refused naming the field."""
    path = _saved(tmp_path, **edits)
    with pytest.raises(ValueError, match=match) as info:
        CosineTree.load(path)
    assert str(path) in str(info.value) and "CosineTree checkpoint field" in str(info.value)
    state, _ = checkpoint.load(path, "CosineTree", versions=(3,))
    with pytest.raises(ValueError, match=match):
        CosineTree.from_state_dict(state)


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
    checkpoint.save(tmp_path / "missing.ckpt", "CosineTree", state, version=3)
    with pytest.raises(ValueError, match="'child_idx' is missing"):
        CosineTree.load(tmp_path / "missing.ckpt")
    checkpoint.save(tmp_path / "other.ckpt", "StreamMemory", _tree().state_dict())
    with pytest.raises(ValueError, match="holds a 'StreamMemory' state"):
        CosineTree.load(tmp_path / "other.ckpt")
    (tmp_path / "text.ckpt").write_text("not a tree " * 20)
    with pytest.raises(ValueError, match="text.ckpt.*no checkpoint header"):
        CosineTree.load(tmp_path / "text.ckpt")
    with pytest.raises(ValueError, match="absent.ckpt: no such checkpoint file"):
        CosineTree.load(tmp_path / "absent.ckpt")
    with pytest.raises(ValueError, match="must be a dict"):
        CosineTree.from_state_dict([1, 2, 3])


def test_a_tree_file_from_before_the_checkpoint_format_is_refused_naming_the_version(tmp_path):
    state = _tree().state_dict()
    state["checksum"] = 0  # what the CRC32 files held
    assert_plain_torch_file_refused(tmp_path / "old.pt", lambda: CosineTree.load(tmp_path / "old.pt"), state)


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
    """The SHA-256 covers every byte: flipping any single byte of a saved file either makes it
    unreadable or fails the checksum (never a tree with different contents)."""
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


def test_damaged_tree_files_are_refused_naming_the_file(tmp_path):
    tree = _tree(leaves=20, dim=8)
    tree.remove([3])
    path = tmp_path / "tree.ckpt"
    tree.save(path)
    ref = tree.state_dict()

    def same(back):
        state = back.state_dict()
        return all(torch.equal(state[k], ref[k]) for k in ref if isinstance(ref[k], torch.Tensor))

    assert assert_damage_refused_or_identical(path, lambda: CosineTree.load(path), same) > 40


def _grown_tree(step: int) -> CosineTree:
    """The tree of a writer's step: 300 leaves (a 50 KB file) whose first row encodes the step."""
    g = torch.Generator().manual_seed(1)
    rows = torch.randn(300, 32, generator=g)
    rows[0, :2] = torch.tensor([float(step % 1000), float(step // 1000)])
    tree = CosineTree(32)
    tree.add_leaves(rows)
    tree.grow(5)
    return tree


def _save_tree_step(path, step):
    _grown_tree(step).save(path)


def test_a_tree_writer_killed_at_random_points_leaves_the_old_or_the_new_tree(tmp_path):
    """CosineTree.save wrote in place (a kill during the write destroyed the previous file): killed
    24 times at random instants, every load afterwards gives the whole tree of one step, and the next
    save sweeps the temporaries the killed writers left."""
    path = tmp_path / "tree.ckpt"
    _save_tree_step(path, 0)

    def check():
        back = CosineTree.load(path)
        first = torch.nn.functional.normalize(back.embeddings[0], dim=0)
        expected = _grown_tree(0)  # the leaves of every step differ in row 0 only (and so do its parents)
        assert torch.equal(back.embeddings[1:300], expected.embeddings[1:300])
        assert torch.equal(back.parent, expected.parent) and torch.equal(back.child_idx, expected.child_idx)
        return tuple(first[:2].tolist())

    seen = kill_writer(__file__, "_save_tree_step", [str(path)], check, kills=24, max_delay=0.1)
    assert len(set(seen)) > 1
    _save_tree_step(path, 1)
    assert temporaries(tmp_path) == []


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


# --------------------------------------------------------------------------
# Norms that overflow or underflow float32 when squared
# --------------------------------------------------------------------------
TOPK_BACKENDS = cpu_backends(COSINE_TOPK)
TREE_BACKENDS = cpu_backends(TREE_SEARCH)


def _true_cosines(q, keys):
    q, keys = torch.as_tensor(q, dtype=torch.float64), torch.as_tensor(keys, dtype=torch.float64)
    qn = q / q.norm(dim=1, keepdim=True)
    kn = keys / keys.norm(dim=1, keepdim=True).clamp_min(1e-300)
    return qn @ kn.T


@pytest.mark.parametrize("backend", TOPK_BACKENDS)
def test_huge_key_ranks_first_with_its_true_cosine(backend):
    q, keys = [[1, 0.3, 0, 0]], [[3e19, 1e19, 0, 0], [0, 1, 0, 0]]
    out = cosine_topk(q, keys, 2, backend=backend)
    assert out.ids.tolist() == [[0, 1]]
    torch.testing.assert_close(out.scores.double(), _true_cosines(q, keys), atol=2e-6, rtol=0)


# Magnitudes whose squares overflow (>= 1.8e19), underflow to subnormals or zero (<= 1e-19), or
# reach the bottom of the normal range; the largest is near float32's maximum.  (Subnormal rows
# hold fewer significant bits than their unit-scale copies: see the integer-valued test below.)
SCALES = [3e19, 1e30, 1e38 / 64, 1e-20, 1e-30, 1e-38]


@pytest.mark.parametrize("backend", TOPK_BACKENDS)
@pytest.mark.parametrize("num_q", [1, 9])  # the fused scan and (cpp) the BLAS path
@pytest.mark.parametrize("scale", SCALES)
def test_cosine_topk_is_scale_invariant_for_huge_and_tiny_rows(backend, num_q, scale):
    g = torch.Generator().manual_seed(3)
    keys = torch.randn(37, 8, generator=g)
    queries = torch.randn(num_q, 8, generator=g)
    # Every third key and every query scaled: mixed magnitudes in one call.
    scaled_keys = keys.clone()
    scaled_keys[::3] *= scale
    ref = cosine_topk(queries, keys, 5, backend="torch")
    for q in (queries, queries * scale):
        out = cosine_topk(q, scaled_keys, 5, backend=backend)
        assert torch.equal(out.ids, ref.ids), (scale, backend)
        torch.testing.assert_close(out.scores, ref.scores, atol=1e-5, rtol=0)
    ranges = torch.tensor([[1, 30]] * num_q)
    out = cosine_topk(queries, scaled_keys, 5, ranges=ranges, backend=backend)
    assert torch.equal(out.ids, cosine_topk(queries, keys, 5, ranges=ranges, backend="torch").ids)


@pytest.mark.parametrize("backend", TOPK_BACKENDS)
def test_zero_rows_still_score_zero(backend):
    keys = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]])
    out = cosine_topk([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]], keys, 3, backend=backend)
    assert out.ids.tolist() == [[1, 0, 2], [0, 1, 2]]
    assert out.scores.tolist() == [[1.0, 0.0, -1.0], [0.0, 0.0, 0.0]]


@pytest.mark.parametrize("scale", SCALES + [2.0**-140])
def test_add_leaves_stores_huge_and_tiny_rows_normalised(scale):
    rows = torch.tensor([[3.0, 1.0, 0.0, 0.0], [0.0, 0.0, 2.0, -1.0]])
    tree = CosineTree(4)
    tree.add_leaves(rows * scale)
    tree.add_leaves(torch.zeros(1, 4))
    expect = rows.double() / rows.double().norm(dim=1, keepdim=True)
    torch.testing.assert_close(tree.embeddings[:2].double(), expect, atol=1e-6, rtol=0)
    assert torch.equal(tree.embeddings[2], torch.zeros(4))


@pytest.mark.parametrize("backend", TOPK_BACKENDS)
def test_subnormal_rows_score_like_their_exact_unit_scale_copies(backend):
    tiny = 2.0**-140  # integer rows times it are exact subnormals
    keys = torch.tensor([[3.0, 1.0, 0.0], [0.0, 5.0, -2.0], [-1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    queries = torch.tensor([[1.0, 2.0, 0.0], [0.0, -1.0, 3.0]])
    ref = cosine_topk(queries, keys, 4, backend="torch")
    out = cosine_topk(queries * tiny, keys * tiny, 4, backend=backend)
    assert torch.equal(out.ids, ref.ids)
    torch.testing.assert_close(out.scores, ref.scores, atol=1e-6, rtol=0)


@pytest.mark.parametrize("backend", TREE_BACKENDS)
@pytest.mark.parametrize("scale", [3e19, 1e-30, 2.0**-120])
def test_tree_search_with_huge_and_tiny_queries_equals_unit_queries(backend, scale):
    tree = _tree(seed=4, leaves=40, dim=6)
    q = torch.randn(3, 6, generator=torch.Generator().manual_seed(5))
    ref = tree_search(tree, q, beam=2, k=4, backend="torch")
    out = tree_search(tree, q * scale, beam=2, k=4, backend=backend)
    assert torch.equal(out.ids, ref.ids)
    torch.testing.assert_close(out.scores, ref.scores, atol=1e-5, rtol=0)
    ref_g = tree_search(tree, q, backend="torch")
    out_g = tree_search(tree, q * scale, backend=backend)
    assert torch.equal(out_g.path, ref_g.path)


# --------------------------------------------------------------------------
# Ties: lowest index first among equal scores, on every backend
# --------------------------------------------------------------------------
@pytest.mark.parametrize("backend", TOPK_BACKENDS)
@pytest.mark.parametrize("dim", [4, 7, 384])
@pytest.mark.parametrize("num_q", [1, 9])
def test_identical_keys_tie_toward_the_lowest_index(backend, dim, num_q):
    g = torch.Generator().manual_seed(dim)
    v = torch.randn(1, dim, generator=g)
    keys = torch.randn(700, dim, generator=g)
    keys[100:150] = v  # 50 identical keys after 100 others; more after the first slice of keys
    keys[600:650] = v
    queries = v.repeat(num_q, 1) + 0.01 * torch.randn(num_q, dim, generator=g)
    out = cosine_topk(queries, keys, 8, backend=backend)
    assert out.ids.tolist() == [list(range(100, 108))] * num_q
    assert bool((out.scores == out.scores[:, :1]).all())
    # Restricted to a range starting inside the run, and power-of-two multiples of the key.
    ranges = torch.tensor([[120, 700]] * num_q)
    assert cosine_topk(queries, keys, 4, ranges=ranges, backend=backend).ids.tolist() == [[120, 121, 122, 123]] * num_q
    keys[100:150] *= 2.0 ** torch.arange(-20, 30, dtype=torch.float32)[:, None]
    assert cosine_topk(queries, keys, 8, backend=backend).ids.tolist() == [list(range(100, 108))] * num_q


@pytest.mark.parametrize("backend", TREE_BACKENDS)
@pytest.mark.parametrize("num_q", [1, 9])
def test_tree_search_ties_among_identical_leaves_toward_the_lowest_id(backend, num_q):
    v = torch.randn(1, 8, generator=torch.Generator().manual_seed(1))
    tree = CosineTree(8)
    tree.add_leaves(v.repeat(50, 1))
    q = v.repeat(num_q, 1)
    flat = tree_search(tree, q, backend=backend)  # every leaf is a root
    assert flat.path[:, 0].tolist() == [0] * num_q
    assert tree_search(tree, q, beam=3, k=4, backend=backend).ids.tolist() == [[0, 1, 2, 3]] * num_q
    tree.grow(4)
    out = tree_search(tree, q, beam=(100,), k=6, backend=backend)
    assert out.ids.tolist() == [[0, 1, 2, 3, 4, 5]] * num_q


# --------------------------------------------------------------------------
# Absurd sizes: a ValueError naming the argument, before anything is allocated
# --------------------------------------------------------------------------
def _small_tree():
    tree = CosineTree(4)
    tree.add_leaves(torch.randn(10, 4, generator=torch.Generator().manual_seed(0)))
    tree.grow(3)
    return tree


@pytest.mark.parametrize("call, match", [
    (lambda t, q: CosineTree(dim=10**12), "dim"),
    (lambda t, q: CosineTree(384, capacity=10**9), "capacity"),
    (lambda t, q: CosineTree(4, capacity=2**70), "capacity"),
    (lambda t, q: cosine_topk(q, torch.randn(5, 4), 10**9), "k"),
    (lambda t, q: cosine_topk(q, torch.randn(5, 4), 2**63), "k"),
    (lambda t, q: cosine_topk(q.double(), torch.randn(5, 4), 10**9), "k"),
    (lambda t, q: cosine_topk(q, torch.randn(5, 4), 10**9, backend="torch"), "k"),
    (lambda t, q: tree_search(t, q, beam=2, k=10**9), "k"),
    (lambda t, q: tree_search(t, q, beam=2, k=2**63), "k"),
    (lambda t, q: tree_search(t, q, beam=2**40, k=3), "beam"),
    (lambda t, q: tree_search(t, q, beam=(2, 2**64)), r"beam\[1\]"),
    (lambda t, q: tree_search(t, q.repeat(2**14, 1), from_every_root=True) if t.add_leaves(torch.randn(2**14, 4))
     is not None else None, "from_every_root"),
])
def test_absurd_sizes_raise_value_error_naming_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call(_small_tree(), torch.randn(2, 4))


def test_large_but_harmless_sizes_still_work():
    tree = _small_tree()
    q = torch.randn(2, 4)
    assert tree_search(tree, q, beam=2**31 - 1, k=3).ids.shape == (2, 3)
    out = cosine_topk(q, torch.randn(5, 4), 1000)  # k above N: padded
    assert out.ids.shape == (2, 1000) and bool((out.ids[:, 5:] == -1).all())


# --------------------------------------------------------------------------
# Thread safety: searches see a consistent snapshot while writers are serialised
# --------------------------------------------------------------------------
def _run_threads(targets, seconds: float):
    stop = threading.Event()
    errors: list[BaseException] = []

    def wrap(fn):
        def run():
            try:
                while not stop.is_set():
                    fn()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                stop.set()
        return run

    threads = [threading.Thread(target=wrap(fn), daemon=True) for fn in targets]
    for t in threads:
        t.start()
    stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_concurrent_searches_and_writers(backend):
    dim = 8
    g = torch.Generator().manual_seed(7)
    tree = CosineTree(dim, capacity=4)  # small: appends reallocate while searches run
    tree.add_leaves(torch.randn(64, dim, generator=g))
    tree.grow(4)
    pool = torch.randn(4096, dim, generator=g)
    counter = iter(range(10**9))
    seen_max = [0]

    def writer_add():
        i = next(counter) % 4000
        tree.add_leaves(pool[i : i + 8])
        tree.grow(4)

    def writer_remove():
        roots = tree.roots
        if roots.numel() > 4:
            tree.remove(int(roots[0]), cascade=True)
        if next(counter) % 50 == 0:
            tree.compact()

    def reader():
        q = pool[next(counter) % 4096][None]
        n_before = tree.num_nodes
        greedy = tree_search(tree, q, backend=backend)
        beam = tree_search(tree, q.repeat(3, 1), beam=(3, 5), k=4, backend=backend)
        for ids in (greedy.path, beam.ids):
            assert int(ids.min()) >= -1
        seen_max[0] = max(seen_max[0], int(beam.ids.max()) - max(n_before, tree.num_nodes))
        assert torch.isfinite(greedy.path_scores[greedy.path >= 0]).all()
        tree.roots.tolist(), tree.height, tree.roots_at(0), repr(tree)

    _run_threads([writer_add, writer_remove, reader, reader], seconds=1.5)
    # After the writers stop, the tree is consistent and searchable.
    state = tree.state_dict()
    path = tree.num_nodes
    assert path == state["embeddings"].shape[0]
    assert tree_search(tree, pool[:2], beam=2, k=3).ids.shape == (2, 3)


def test_search_snapshot_stays_valid_after_remove_and_compact():
    tree = _tree(seed=2, leaves=30)
    snap = tree.search_arrays()
    ptr, kids = snap.tensors[1].clone(), snap.tensors[2].clone()
    tree.remove(int(tree.roots[0]), cascade=True)
    tree.compact()
    tree.add_leaves(torch.randn(100, 6))  # reallocates
    assert torch.equal(snap.tensors[1], ptr) and torch.equal(snap.tensors[2], kids)
    assert tree.search_arrays() is not snap


@pytest.mark.parametrize("call", [
    lambda t: t.remove([2**63]),
    lambda t: t.set_utility([2**63], 1.0),
    lambda t: t.remove(2**70),
    lambda t: t.add_leaves(torch.randn(2, 4), payload=[2**70, 1]),
    lambda t: t.children(2**70),
    lambda t: t.add_parent([2**40], torch.randn(4)),
])
def test_ints_beyond_int64_are_value_errors(call):
    with pytest.raises(ValueError):
        call(_small_tree())
