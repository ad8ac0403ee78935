"""CosineTree removal: tombstones, pruning of emptied parents, compaction, persistence.

The reference for every search check is a tree built from scratch out of the
live nodes alone (same embeddings, same parent/child groups, in id order):
removal must leave a tree indistinguishable from it, up to the id map that
``compact()`` returns.
"""
from __future__ import annotations

import random

import pytest
import torch

from tests.support.device_checks import cpu_backends
from streammem_kernels import CosineTree, tree_search
from streammem_kernels.tree.search import TREE_SEARCH

BACKENDS = cpu_backends(TREE_SEARCH)


def _structure(tree: CosineTree):
    n = tree.num_nodes
    ptr = tree.child_ptr.tolist()
    kids = tree.child_idx.tolist()
    runs = [kids[ptr[i] : ptr[i + 1]] for i in range(n)]
    return tree.alive.tolist(), tree.parent.tolist(), tree.level.tolist(), runs


def check_invariants(tree: CosineTree) -> None:
    alive, parent, level, runs = _structure(tree)
    n = tree.num_nodes
    assert tree.num_live == sum(alive)
    seen_as_child = [0] * n
    for node in range(n):
        run = runs[node]
        if not alive[node]:
            assert run == [] and parent[node] == -1, f"dead node {node} still linked"
            continue
        assert run == sorted(run), f"children of {node} not chronological"
        for c in run:
            assert alive[c], f"dead id {c} is a child of {node}"
            assert parent[c] == node
            seen_as_child[c] += 1
        # Childless live nodes are leaves: emptied parents are pruned.
        assert level[node] == (1 + max(level[c] for c in run) if run else 0), f"level of {node}"
    for node in range(n):
        if alive[node]:
            assert seen_as_child[node] == (0 if parent[node] == -1 else 1)
            if parent[node] != -1:
                assert alive[parent[node]]
        else:
            assert seen_as_child[node] == 0
    roots = [i for i in range(n) if alive[i] and parent[i] == -1]
    assert tree.roots.tolist() == roots
    for lvl in range(max(level, default=0) + 2):
        assert tree.roots_at(lvl) == [r for r in roots if level[r] == lvl]
    assert tree.height == (max(level[r] for r in roots) if roots else -1)
    # The searches pad each level to max_fanout: it must be the longest live child run.
    assert tree.max_fanout == max((len(run) for run in runs), default=0)
    # Every live node is reachable from the roots, and nothing dead is.
    reached, stack = set(), list(roots)
    while stack:
        node = stack.pop()
        reached.add(node)
        stack.extend(runs[node])
    assert reached == {i for i in range(n) if alive[i]}


def fresh_copy(tree: CosineTree) -> tuple[CosineTree, dict[int, int]]:
    """A tree built from the live nodes alone, in id order; returns it and old -> new ids."""
    alive, parent, level, runs = _structure(tree)
    fresh = CosineTree(tree.dim)
    new_id: dict[int, int] = {}
    for node in range(tree.num_nodes):
        if not alive[node]:
            continue
        emb, pay = tree.embeddings[node], int(tree.payload[node])
        if runs[node]:
            new_id[node] = fresh.add_parent([new_id[c] for c in runs[node]], emb, payload=pay)
        else:
            new_id[node] = int(fresh.add_leaves(emb[None], payload=[pay])[0])
    fresh.set_utility(torch.tensor(list(new_id.values())), tree.utility[torch.tensor(list(new_id.keys()))])
    return fresh, new_id


def _map_ids(ids: torch.Tensor, new_id: dict[int, int]) -> torch.Tensor:
    return torch.tensor([new_id[i] if i >= 0 else -1 for i in ids.reshape(-1).tolist()]).reshape(ids.shape)


def _random_tree(seed: int, leaves: int = 40, dim: int = 8) -> CosineTree:
    gen = torch.Generator().manual_seed(seed)
    tree = CosineTree(dim, capacity=4)
    for start in range(0, leaves, 5):
        tree.add_leaves(torch.randn(5, dim, generator=gen), payload=torch.arange(start, start + 5))
        tree.grow(3)
    tree.set_utility(torch.arange(tree.num_nodes), torch.rand(tree.num_nodes, generator=gen) + 0.5)
    return tree


def _search_all(tree, queries, backend):
    out = {
        "greedy": tree_search(tree, queries, backend=backend),
        "every_root": tree_search(tree, queries, from_every_root=True, backend=backend),
        "beam2": tree_search(tree, queries, beam=2, k=4, backend=backend),
        "beam_tuple": tree_search(tree, queries, beam=(1, 3), k=3, min_score=-0.2, backend=backend),
        "beam_util": tree_search(tree, queries, beam=(2,), k=5, use_utility=True, backend=backend),
    }
    return out


def _assert_same_results(got: dict, want: dict, new_id: dict[int, int]) -> None:
    for name in want:
        for field_got, field_want, field in zip(got[name], want[name], got[name]._fields):
            if field_got.dtype == torch.int64:
                assert torch.equal(_map_ids(field_got, new_id), field_want), (name, field)
            else:
                torch.testing.assert_close(field_got, field_want, rtol=0, atol=1e-6, msg=f"{name}.{field}")


# --------------------------------------------------------------------------
# Invariants under random mixed operations
# --------------------------------------------------------------------------
def test_invariants_under_random_appends_removals_compactions():
    rng = random.Random(7)
    gen = torch.Generator().manual_seed(7)
    dim = 6
    tree = CosineTree(dim, capacity=2)
    tag_of = {}  # payload tag -> embedding row, to follow identities through compaction
    next_tag = 0
    counts = {"leaves": 0, "grow": 0, "parent": 0, "remove": 0, "cascade": 0, "compact": 0}
    for _ in range(2000):
        op = rng.random()
        if op < 0.35 or tree.num_live == 0:
            m = rng.randint(1, 3)
            rows = torch.randn(m, dim, generator=gen)
            tree.add_leaves(rows, payload=torch.arange(next_tag, next_tag + m))
            for j in range(m):
                tag_of[next_tag + j] = tree.embeddings[tree.num_nodes - m + j].clone()
            next_tag += m
            counts["leaves"] += 1
        elif op < 0.45:
            before = tree.num_nodes
            tree.grow(rng.randint(2, 4))
            for node in range(before, tree.num_nodes):
                tag_of[next_tag] = tree.embeddings[node].clone()
                tree._payload[node] = next_tag  # parents from grow() carry -1; tag them for the map check
                next_tag += 1
            counts["grow"] += 1
        elif op < 0.52:
            roots = tree.roots.tolist()
            chosen = rng.sample(roots, rng.randint(1, min(3, len(roots))))
            node = tree.add_parent(chosen, torch.randn(dim, generator=gen), payload=next_tag)
            tag_of[next_tag] = tree.embeddings[node].clone()
            next_tag += 1
            counts["parent"] += 1
        elif op < 0.9:
            live = tree.alive.nonzero()[:, 0].tolist()
            cascade = rng.random() < 0.2
            if cascade:
                targets = rng.sample(live, min(len(live), rng.randint(1, 2)))
            else:
                childless = [i for i in live if tree.children(i).numel() == 0]
                targets = rng.sample(childless, min(len(childless), rng.randint(1, 4)))
            removed = tree.remove(targets, cascade=cascade).tolist()
            assert set(targets) <= set(removed)
            assert all(not tree.alive[i] for i in removed)
            if not cascade:
                # Anything else removed is an ancestor left without a live child.
                assert all(int(tree.level[i]) > 0 for i in set(removed) - set(targets))
            counts["cascade" if cascade else "remove"] += 1
        else:
            old_pay = tree.payload.clone()
            old_alive = tree.alive.clone()
            old_roots = tree.roots.clone()
            mapping = tree.compact()
            assert mapping.shape == (old_pay.shape[0],)
            assert torch.equal(mapping >= 0, old_alive)
            live_old = old_alive.nonzero()[:, 0]
            assert torch.equal(mapping[live_old], torch.arange(live_old.numel()))
            assert torch.equal(tree.payload, old_pay[live_old])
            assert torch.equal(tree.roots, mapping[old_roots])
            assert tree.num_nodes == tree.num_live == live_old.numel()
            counts["compact"] += 1
        check_invariants(tree)
        for node, tag in enumerate(tree.payload.tolist()):
            assert torch.equal(tree.embeddings[node], tag_of[tag])
    assert min(counts.values()) > 20, counts


# --------------------------------------------------------------------------
# Search equals search over a freshly built tree with the same live content
# --------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_search_after_removal_equals_fresh_tree(backend):
    tree = _random_tree(1)
    level1 = [i for i in range(tree.num_nodes) if int(tree.level[i]) == 1]
    first_leaf = int(tree.children(level1[0])[0])
    tree.remove([first_leaf])  # one leaf out of a group
    emptied = level1[1]
    gone = tree.remove(tree.children(emptied).tolist()).tolist()  # a whole group: its parent goes too
    assert emptied in gone
    tree.remove([level1[-1]], cascade=True)  # a level-1 node with its leaves
    # A parent over a level-2 root and a leaf root: removing the level-2 subtree drops its level.
    mixed = tree.add_parent([tree.roots_at(2)[0], tree.roots_at(0)[0]], torch.randn(8))
    assert int(tree.level[mixed]) == 3
    check_invariants(tree)
    tree.remove([c for c in tree.children(mixed).tolist() if int(tree.level[c]) == 2], cascade=True)
    assert int(tree.level[mixed]) == 1
    check_invariants(tree)
    assert (~tree.alive).sum() > 5

    fresh, new_id = fresh_copy(tree)
    assert torch.equal(_map_ids(tree.roots, new_id), fresh.roots)
    live = tree.alive.nonzero()[:, 0]
    assert torch.equal(tree.level[live], fresh.level)
    queries = torch.randn(5, 8, generator=torch.Generator().manual_seed(3))
    want = _search_all(fresh, queries, "torch")
    got = _search_all(tree, queries, backend)
    _assert_same_results(got, want, new_id)
    # ... and after compaction, with the returned map.
    mapping = tree.compact().tolist()
    after = _search_all(tree, queries, backend)
    _assert_same_results(after, _search_all(fresh, queries, "torch"),
                         {new: new_id[old] for old, new in enumerate(mapping) if new >= 0})


@pytest.mark.parametrize("backend", BACKENDS)
def test_search_never_returns_removed_nodes(backend):
    tree = _random_tree(2, leaves=30)
    leaves = (tree.level == 0).nonzero()[:, 0].tolist()
    removed = set(tree.remove(sorted(set(leaves[::2] + leaves[-4:]))).tolist())
    assert any(int(tree.level[i]) > 0 for i in removed)  # some emptied parent went too
    queries = tree.embeddings[list(removed)][:6]  # queries pointing right at removed nodes
    res = _search_all(tree, queries, backend)
    for name, r in res.items():
        ids = (r.path if name in ("greedy", "every_root") else r.ids).reshape(-1).tolist()
        assert not removed & set(ids), name


def test_removing_a_child_keeps_siblings_under_their_parent():
    tree = CosineTree(3)
    tree.add_leaves(torch.eye(3))
    p = tree.add_parent([0, 1, 2], torch.ones(3))
    tree.remove(1)
    assert tree.roots.tolist() == [p]
    assert tree.children(p).tolist() == [0, 2]
    assert tree.parent.tolist()[:3] == [p, -1, p]
    assert tree.remove([0, 2]).tolist() == [0, 2, p]  # the emptied parent goes with its last children
    assert tree.num_live == 0 and tree.height == -1
    with pytest.raises(ValueError, match="tree must not be empty"):
        tree_search(tree, torch.ones(1, 3))
    assert tree.compact().tolist() == [-1, -1, -1, -1]
    tree.add_leaves(torch.ones(2, 3))  # usable again after everything was removed
    check_invariants(tree)


def test_level_recomputed_when_the_deepest_child_goes():
    tree = CosineTree(2)
    tree.add_leaves(torch.randn(3, 2))
    mid = tree.add_parent([0, 1], torch.randn(2))
    top = tree.add_parent([mid, 2], torch.randn(2))
    assert int(tree.level[top]) == 2
    tree.remove([0, 1])  # mid is emptied and removed; top keeps leaf 2
    assert not bool(tree.alive[mid])
    assert int(tree.level[top]) == 1 and tree.roots_at(1) == [top] and tree.height == 1
    check_invariants(tree)


# --------------------------------------------------------------------------
# Persistence, embeddings update, bad input
# --------------------------------------------------------------------------
def test_save_load_round_trips_tombstones(tmp_path):
    tree = _random_tree(4, leaves=20)
    tree.remove([1, 2, 7])
    tree.save(tmp_path / "t.pt")
    back = CosineTree.load(tmp_path / "t.pt")
    for name in ("alive", "parent", "level", "child_ptr", "child_idx", "embeddings", "utility", "payload", "roots"):
        assert torch.equal(getattr(back, name), getattr(tree, name)), name
    assert back.num_live == tree.num_live
    check_invariants(back)
    q = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
    ident = {i: i for i in range(tree.num_nodes)}
    _assert_same_results(_search_all(back, q, "torch"), _search_all(tree, q, "torch"), ident)
    assert torch.equal(back.compact(), tree.compact())


def test_load_version1_file_without_tombstones(tmp_path):
    tree = _random_tree(5, leaves=10)
    state = tree.state_dict()
    state["version"] = 1
    del state["alive"]
    back = CosineTree.from_state_dict(state)
    assert bool(back.alive.all()) and torch.equal(back.roots, tree.roots)


def test_load_rejects_dead_ids_in_child_runs(tmp_path):
    tree = _random_tree(6, leaves=10)
    state = tree.state_dict()
    state["alive"][int(state["child_idx"][0])] = False
    with pytest.raises(ValueError, match="inconsistent"):
        CosineTree.from_state_dict(state)


def test_set_embeddings_normalises_and_changes_search():
    tree = CosineTree(2)
    tree.add_leaves(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    tree.set_embeddings([1], torch.tensor([[3.0, 0.1]]))
    torch.testing.assert_close(tree.embeddings[1].norm(), torch.tensor(1.0))
    assert tree_search(tree, torch.tensor([[0.0, 1.0]])).best_node.tolist() == [1]
    with pytest.raises(ValueError, match="emb must hold one row per id"):
        tree.set_embeddings([0, 1], torch.ones(1, 2))
    tree.remove(0)
    with pytest.raises(ValueError, match="ids must be live"):
        tree.set_embeddings([0], torch.ones(1, 2))


def test_bad_input():
    tree = _random_tree(8, leaves=10)
    n = tree.num_nodes
    with pytest.raises(ValueError, match=r"ids must be node ids in \[0, "):
        tree.remove([n])
    with pytest.raises(ValueError, match=r"ids must be node ids in \[0, "):
        tree.remove([-1])
    with pytest.raises(ValueError, match="ids must be distinct"):
        tree.remove([0, 0])
    with pytest.raises(ValueError, match="ids"):
        tree.remove(torch.tensor([0.5]))
    with pytest.raises(ValueError, match="cascade must be a bool"):
        tree.remove([0], cascade=1)
    parent = int(tree.parent[0])
    with pytest.raises(ValueError, match="live children unless cascade=True"):
        tree.remove([parent])
    before = _structure(tree)
    tree.remove([0])
    with pytest.raises(ValueError, match="ids must be live node ids; already removed"):
        tree.remove([0])
    with pytest.raises(ValueError, match="child_ids must be live nodes"):
        tree.add_parent([0], torch.ones(8))
    assert before[0][1:] == _structure(tree)[0][1:]  # failed calls changed nothing
    assert tree.remove([]).numel() == 0


# --------------------------------------------------------------------------
# BoundedMemory: the in-place index (remove + compact) equals a full rebuild
# --------------------------------------------------------------------------
def _index_by_node(ltm):
    """The memory's tree index described in node ids (independent of row numbering)."""
    tree, node_of = ltm.tree, ltm._node_of_row
    assert tree.num_nodes == tree.num_live == len(node_of) == len(ltm.nodes)
    desc = {}
    for row, node in enumerate(node_of):
        parent = int(tree.parent[row])
        desc[node] = (
            None if parent < 0 else node_of[parent],
            [node_of[c] for c in tree.children(row).tolist()],
            int(tree.level[row]),
            tree.embeddings[row].clone(),
            float(tree.utility[row]),
        )
    return desc


def test_bounded_memory_index_equals_rebuild():
    import copy

    import numpy as np
    from streammem.components.bounded import BoundedMemory
    from streammem.models.encoders import COLOUR_NAMES, HashingTextEncoder, PixelEncoder
    from streammem.components.memory import FrameRecord, LongTermMemory
    from streammem.io.synthetic import SyntheticVideo

    colours = list(COLOUR_NAMES)
    video = SyntheticVideo([colours[(i // 2) % len(colours)] for i in range(40)], 3, size=(16, 16))
    frames = np.stack([f for _, f in video])
    enc = PixelEncoder().encode(frames)
    records = [FrameRecord(i, i / video.fps, enc.features[i], enc.labels[i]) for i in range(len(frames))]
    ltm = LongTermMemory(HashingTextEncoder(), chunk=3, group=3, centres=2)
    bm = BoundedMemory(ltm, budget=70, theta_concept=None, theta_sim=0.5, tau=2.0)
    queries = torch.randn(6, ltm._embed("x").shape[0], generator=torch.Generator().manual_seed(0))
    rounds = 0
    for r in records:
        if ltm.add(r) and bm.enforce(r.timestamp) is not None:
            rounds += 1
            rebuilt = copy.deepcopy(ltm)
            rebuilt.rebuild_index()
            rebuilt.tree.set_utility(torch.arange(rebuilt.tree.num_nodes), torch.tensor(
                [bm.utility(rebuilt.nodes[i]) for i in rebuilt._node_of_row]))
            got, want = _index_by_node(ltm), _index_by_node(rebuilt)
            assert got.keys() == want.keys()
            for node in want:
                assert got[node][:3] == want[node][:3], node
                torch.testing.assert_close(got[node][3], want[node][3], rtol=0, atol=0)
                assert got[node][4] == want[node][4]
            def to_node(ids, mem):
                return [[mem._node_of_row[i] if i >= 0 else -1 for i in row] for row in ids.tolist()]

            assert to_node(tree_search(ltm.tree, queries).path, ltm) == \
                to_node(tree_search(rebuilt.tree, queries).path, rebuilt)
            assert to_node(tree_search(ltm.tree, queries, beam=2, k=3).ids, ltm) == \
                to_node(tree_search(rebuilt.tree, queries, beam=2, k=3).ids, rebuilt)
    assert rounds >= 3 and bm.stats.merged > 0 and bm.stats.removed_leaves > 0 and bm.stats.removed_parents > 0
