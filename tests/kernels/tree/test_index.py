"""CosineIndex: every backend against the reference and against cosine_topk on the same keys, ground
truth (a float64 brute force, faiss's IndexFlatIP), ids, removal, ranges, the float16 scan copy,
the checkpoint file, bad input and concurrency (the int8 scan copy: test_index_int8_scan.py)."""
import threading

import numpy as np
import pytest
import torch

from tests.support.device_checks import DEVICES, cpu_backends, device_backends
from streammem_kernels import CosineIndex, cosine_topk
from streammem_kernels.checkpoint import load as load_checkpoint
from streammem_kernels.checkpoint import save as save_checkpoint
from streammem_kernels.tree.index import INDEX_TOPK, _index_topk_blas, _index_topk_cpp
from streammem_kernels.tree.reference import index_topk_reference, unit_rows

INDEX_BACKENDS = cpu_backends(INDEX_TOPK)
HAS_CPP = "cpp" in INDEX_BACKENDS


def needs_cpp():
    if not HAS_CPP:
        pytest.skip("C++ backend not built")


def sample(num_k, dim, num_q, *, seed=0, zero_every=11):
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(num_k + 1, dim, generator=g)[1:]  # sliced rows
    if zero_every:
        keys[::zero_every] = 0  # zero keys score 0
    queries = torch.randn(num_q, dim, generator=g)
    return keys, queries


def mapped(result, ids):
    """cosine_topk's positions mapped to the index's ids (-1 kept)."""
    return torch.where(result.ids >= 0, ids[result.ids.clamp_min(0)], result.ids)


def brute_force(queries, keys, k, allowed=None):
    """(ids, scores) by float64 cosine, ties toward the lower index; -1 / -inf padding."""
    q = queries.double()
    q = q / q.norm(dim=1, keepdim=True).clamp_min(1e-300)
    v = keys.double()
    v = v / v.norm(dim=1, keepdim=True).clamp_min(1e-300)
    scores = q @ v.T
    if allowed is not None:
        scores[:, ~allowed] = float("-inf")
    ids = np.full((q.shape[0], k), -1)
    out = np.full((q.shape[0], k), float("-inf"))
    for row in range(q.shape[0]):
        order = sorted(range(keys.shape[0]), key=lambda j: (-float(scores[row, j]), j))
        order = [j for j in order if scores[row, j] > float("-inf")][:k]
        ids[row, : len(order)] = order
        out[row, : len(order)] = scores[row, order].numpy()
    return torch.from_numpy(ids), torch.from_numpy(out)


# --------------------------------------------------------------------------
# Every backend: the reference, cosine_topk on the same keys, the brute force
# --------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_k,dim,num_q,k", [(1, 1, 1, 1), (7, 3, 5, 9), (300, 65, 3, 12), (300, 65, 19, 5),
                                               (700, 1, 2, 4)])
def test_search_equals_reference_and_cosine_topk_on_the_same_keys(device, num_k, dim, num_q, k):
    keys, queries = sample(num_k, dim, num_q, seed=num_k + dim)
    index = CosineIndex(dim, device=device, capacity=3)  # grows while adding
    index.add(keys[: num_k // 2].to(device))
    index.add(keys[num_k // 2:].to(device))
    assert len(index) == num_k and torch.equal(index.ids.cpu(), torch.arange(num_k))
    q = queries.to(device)
    ranges = torch.tensor([[0, num_k]] * num_q, device=device)
    want_ids, want_scores = index_topk_reference(q.float(), index.keys, k, ranges, None)
    for backend in device_backends(INDEX_TOPK, device):
        got = index.search(q, k, backend=backend)
        same = cosine_topk(q, index.keys, k, backend=backend)
        atol, _ = INDEX_TOPK.tolerance(backend, torch.float32)
        assert torch.equal(got.ids, same.ids), backend
        if backend == "torch":  # the reference does not normalise the stored rows again
            torch.testing.assert_close(got.scores, same.scores, atol=2e-5, rtol=0)
        else:  # cosine_topk on the stored rows, bit for bit: the same kernels and norms
            assert torch.equal(got.scores, same.scores), backend
        assert torch.equal(got.ids.cpu(), want_ids.cpu()), backend
        torch.testing.assert_close(got.scores.cpu(), want_scores.cpu(), atol=atol, rtol=0)
    # Ground truth (float64): the ids at D > 1 (no near ties on random data); at D = 1 every score is +-1 or 0.
    if dim > 1:
        ids, scores = brute_force(queries, keys, k)
        assert torch.equal(index.search(q, k).ids.cpu(), ids)
        torch.testing.assert_close(index.search(q, k).scores.cpu().double(), scores, atol=2e-5, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_every_input_dtype_is_normalised_in_float32_like_cosine_topk(dtype):
    keys, queries = sample(200, 24, 4, seed=3)
    keys, queries = keys.to(dtype), queries.to(dtype)
    index = CosineIndex(24)
    index.add(keys)
    assert index.keys.dtype == torch.float32
    got = index.search(queries, 6)
    raw = cosine_topk(queries, keys, 6)  # the raw keys: normalised by the kernel instead
    assert torch.equal(got.ids, raw.ids)
    torch.testing.assert_close(got.scores, raw.scores, atol=2e-5, rtol=0)


def test_matches_faiss_index_flat_ip_on_normalised_vectors():
    faiss = pytest.importorskip("faiss")
    keys, queries = sample(3000, 48, 40, seed=5, zero_every=0)
    index = CosineIndex(48)
    index.add(keys)
    flat = faiss.IndexFlatIP(48)
    unit = keys.numpy() / np.linalg.norm(keys.numpy(), axis=1, keepdims=True)
    flat.add(unit.astype(np.float32))
    qn = queries.numpy() / np.linalg.norm(queries.numpy(), axis=1, keepdims=True)
    scores, ids = flat.search(qn.astype(np.float32), 10)
    for q in (queries[:1], queries[:5], queries):  # the one-pass scan and the BLAS path
        got = index.search(q, 10)
        assert torch.equal(got.ids, torch.from_numpy(ids[: q.shape[0]]))
        np.testing.assert_allclose(got.scores.numpy(), scores[: q.shape[0]], atol=2e-5)


def test_ties_go_to_the_earlier_added_key_and_zero_vectors_score_zero():
    g = torch.Generator().manual_seed(1)
    keys = torch.randn(50, 16, generator=g)
    keys[30] = keys[4] * 8  # the same direction (a power of two: the same unit row), added later
    keys[40] = 0
    index = CosineIndex(16)
    index.add(keys, ids=torch.arange(50) * 10 + 3)
    for backend in INDEX_BACKENDS:
        got = index.search(torch.stack([keys[4], -keys[4], torch.zeros(16)]), 3, backend=backend)
        assert got.ids[0, :2].tolist() == [43, 303], backend  # ids of rows 4 then 30
        assert got.scores[0, 0] == got.scores[0, 1]
        zero_row = got.ids[2].tolist()  # a zero query scores 0 everywhere: the first three keys
        assert zero_row == [3, 13, 23] and got.scores[2].eq(0).all()
    assert float(index.search(torch.ones(1, 16), 50).scores[0][index.search(torch.ones(1, 16), 50).ids[0] == 403]) == 0


# --------------------------------------------------------------------------
# Ids, removal, compaction, ranges
# --------------------------------------------------------------------------
def test_explicit_ids_map_results_and_removal_keeps_the_rest_exact():
    keys, queries = sample(400, 32, 12, seed=7)
    labels = torch.randperm(10_000, generator=torch.Generator().manual_seed(0))[:400]  # not ascending
    index = CosineIndex(32)
    assert torch.equal(index.add(keys, ids=labels), labels)
    doomed = labels[torch.arange(0, 400, 9)]
    assert index.remove(doomed) == doomed.numel() and len(index) == 400 - doomed.numel()
    keep = torch.ones(400, dtype=torch.bool)
    keep[torch.arange(0, 400, 9)] = False
    for backend in INDEX_BACKENDS:
        for q in (queries[:2], queries):  # one-pass scan and BLAS path, both skipping the tombstones
            got = index.search(q, 7, backend=backend)
            want = cosine_topk(q, unit_rows(keys)[keep], 7, backend=backend)
            assert torch.equal(got.ids, mapped(want, labels[keep])), backend
    assert torch.equal(index.ids, labels[keep]) and torch.equal(index.reconstruct(labels[keep][:3]),
                                                                index.keys[:3])
    before = index.search(queries, 7)
    index.compact()
    after = index.search(queries, 7)
    assert torch.equal(before.ids, after.ids) and torch.equal(before.scores, after.scores)
    index.add(keys[1:2], ids=doomed[:1])  # a removed id can come back (keys[1] is held under labels[1] too)
    assert index.search(keys[1:2], 2).ids[0].tolist() == [int(labels[1]), int(doomed[0])]


def test_tombstones_are_compacted_once_they_are_a_fifth_of_the_storage():
    index = CosineIndex(8)
    index.add(torch.randn(100, 8))
    index.remove(torch.arange(0, 19))
    assert index._n == 100 and len(index) == 81
    index.remove([50])
    assert index._n == 80 == len(index) and index.ids[:3].tolist() == [19, 20, 21]
    assert index.add(torch.randn(2, 8)).tolist() == [100, 101]  # default ids continue past every id ever added


def test_an_add_that_removed_rows_make_room_for_compacts_instead_of_growing():
    keys, queries = sample(100, 8, 3, seed=4)
    index = CosineIndex(8, capacity=100)
    index.add(keys)
    index.remove(torch.arange(0, 100, 10))  # a tenth: kept as tombstones
    before = index.search(queries, 5)
    assert index._n == 100 and index.add(keys[:6], ids=torch.arange(200, 206)).tolist() == list(range(200, 206))
    assert index._keys.shape[0] == 100 and index._n == len(index) == 96  # compacted, the same storage
    kept = torch.ones(100, dtype=torch.bool)
    kept[::10] = False
    assert torch.equal(index.ids, torch.cat([torch.arange(100)[kept], torch.arange(200, 206)]))
    after = index.search(queries, 5)
    assert torch.equal(after.ids, mapped(cosine_topk(queries, index.keys, 5), index.ids))
    assert (after.scores >= before.scores - 1e-6).all()  # more keys: never a worse k-th best


@pytest.mark.parametrize("backend", INDEX_BACKENDS)
def test_ranges_select_ids_like_cosine_topk_ranges_select_positions(backend):
    keys, queries = sample(500, 16, 5, seed=9)
    index = CosineIndex(16)
    index.add(keys)
    ranges = torch.tensor([[0, 500], [20, 60], [499, 10**6], [7, 7], [100, 400]])
    got = index.search(queries, 6, ranges=ranges, backend=backend)
    want = cosine_topk(queries, index.keys, 6, ranges=ranges.clamp_max(500), backend=backend)
    assert torch.equal(got.ids, want.ids)
    torch.testing.assert_close(got.scores, want.scores, atol=2e-5 if backend == "torch" else 0, rtol=0)
    index.remove(torch.arange(20, 40))  # ranges still name ids; the removed ones are skipped
    got = index.search(queries, 6, ranges=ranges, backend=backend)
    assert bool(((got.ids < 20) | (got.ids >= 40)).all())
    assert bool((((got.ids >= 20) & (got.ids < 60)) | (got.ids == -1))[1].all())


@pytest.mark.parametrize("copy", [None, "half_scan", "int8_scan"])
@pytest.mark.parametrize("num_k,dim,num_q,k", [(1, 1, 1, 1), (2, 5, 1, 3), (13, 7, 3, 4), (257, 33, 2, 9),
                                               (611, 65, 17, 6)])
def test_ids_removes_and_ranges_equal_cosine_topk_on_the_live_keys(copy, num_k, dim, num_q, k):
    """Every feature at once on odd sizes: ascending ids with gaps, removals (tombstones and
    compaction), ranges over ids, without a scan copy, with the float16 one and with the int8 one."""
    if copy:
        needs_cpp()
    half_scan = copy is not None
    keys, queries = sample(num_k, dim, num_q, seed=num_k * dim)
    labels = torch.arange(num_k) * 3 + 1  # ascending, with gaps
    index = CosineIndex(dim, capacity=1, **({copy: True} if copy else {}))
    index.add(keys, ids=labels)
    doomed = torch.arange(0, num_k, 4)[: max(0, num_k - 1)]  # leaves one key at least
    index.remove(labels[doomed])
    live = torch.ones(num_k, dtype=torch.bool)
    live[doomed] = False
    lo = torch.randint(0, 3 * num_k + 2, (num_q,), generator=torch.Generator().manual_seed(num_k))
    ranges = torch.stack([lo, lo + 2 * num_k // 3 + 1], 1)
    ranges[0] = torch.tensor([0, 3 * num_k + 1])  # the whole index
    assert torch.equal(index.ids, labels[live])
    unit = index.keys  # the stored unit rows (cosine_topk on them is bit for bit the index's search)
    torch.testing.assert_close(unit, unit_rows(keys)[live], atol=1e-6, rtol=0)
    positions = torch.stack([torch.searchsorted(labels[live], ranges[:, 0].contiguous()),
                             torch.searchsorted(labels[live], ranges[:, 1].contiguous())], 1)
    for backend in (INDEX_BACKENDS if not half_scan else ["cpp"]):
        got = index.search(queries, k, ranges=ranges, backend=backend)
        want = cosine_topk(queries, unit, k, ranges=positions, backend=backend)
        assert torch.equal(got.ids, mapped(want, labels[live])), backend
        torch.testing.assert_close(got.scores, want.scores, atol=2e-5 if backend == "torch" else 0, rtol=0)
        assert torch.equal(index.search(queries, k, backend=backend).ids,
                           mapped(cosine_topk(queries, unit, k, backend=backend), labels[live])), backend


def test_ranges_need_ascending_ids():
    index = CosineIndex(4)
    index.add(torch.randn(3, 4), ids=[5, 1, 9])
    with pytest.raises(ValueError, match="ascending"):
        index.search(torch.randn(1, 4), 2, ranges=[[0, 10]])


# --------------------------------------------------------------------------
# The float16 scan copy: the float32 index's results, bit for bit
# --------------------------------------------------------------------------
def test_half_scan_returns_the_float32_results_bit_for_bit():
    needs_cpp()
    g = torch.Generator().manual_seed(11)
    base = torch.randn(40, 96, generator=g)
    # Clusters of near-duplicates: scores within float16's resolution of each other, where a scan
    # of the copy alone would misrank.
    keys = base.repeat_interleave(50, 0) + 1e-3 * torch.randn(2000, 96, generator=g)
    keys[::97] = 0
    keys[5] = keys[1234]
    plain, half = CosineIndex(96), CosineIndex(96, half_scan=True)
    for index in (plain, half):
        index.add(keys)
        index.remove(torch.arange(300, 700, 3))
    queries = torch.cat([keys[1234:1235], base[:6] + 1e-3 * torch.randn(6, 96, generator=g),
                         torch.randn(3, 96, generator=g)])
    for num_q in (1, 3, 10):
        for k in (1, 5, 64):
            a, b = plain.search(queries[:num_q], k), half.search(queries[:num_q], k)
            assert torch.equal(a.ids, b.ids) and torch.equal(a.scores, b.scores), (num_q, k)
    assert half.nbytes > plain.nbytes


def test_half_scan_needs_a_cpu_index():
    with pytest.raises(ValueError, match="half_scan=True needs a CPU index"):
        CosineIndex(4, device="meta", half_scan=True)


# --------------------------------------------------------------------------
# The checkpoint file
# --------------------------------------------------------------------------
def test_save_load_round_trip_answers_identically(tmp_path):
    keys, queries = sample(300, 20, 9, seed=13)
    index = CosineIndex(20)
    index.add(keys, ids=torch.arange(300) * 2)
    index.remove([0, 2, 100])
    index.save(tmp_path / "index.ckpt")
    for half_scan in ((False, True) if HAS_CPP else (False,)):
        back = CosineIndex.load(tmp_path / "index.ckpt", half_scan=half_scan)
        assert len(back) == len(index) and torch.equal(back.ids, index.ids) and torch.equal(back.keys, index.keys)
        for q in (queries[:1], queries):
            a, b = index.search(q, 5), back.search(q, 5)
            assert torch.equal(a.ids, b.ids) and torch.equal(a.scores, b.scores)
        assert back.add(torch.randn(1, 20)).tolist() == [599]  # next_id survives


def test_load_refuses_damaged_and_invalid_files_naming_what_is_wrong(tmp_path):
    index = CosineIndex(6)
    index.add(torch.randn(10, 6))
    path = tmp_path / "index.ckpt"
    index.save(path)
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 0xFF
    bad = tmp_path / "flipped.ckpt"
    bad.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="checksum"):
        CosineIndex.load(bad)
    with pytest.raises(ValueError, match="no such checkpoint"):
        CosineIndex.load(tmp_path / "missing.ckpt")
    state, _ = load_checkpoint(path, "CosineIndex")
    for field, value, match in (("keys", state["keys"] * 2, "unit rows"),
                                ("keys", torch.full((10, 6), float("nan")), "finite"),
                                ("ids", torch.zeros(10, dtype=torch.int64), "distinct"),
                                ("ids", -torch.ones(10, dtype=torch.int64), ">= 0"),
                                ("next_id", 3, "next_id"),
                                ("dim", 7, "keys")):
        save_checkpoint(tmp_path / "hand.ckpt", "CosineIndex", {**state, field: value})
        with pytest.raises(ValueError, match=match):
            CosineIndex.load(tmp_path / "hand.ckpt")
    save_checkpoint(tmp_path / "tree.ckpt", "CosineTree", state)
    with pytest.raises(ValueError, match="'CosineTree' state"):
        CosineIndex.load(tmp_path / "tree.ckpt")


# --------------------------------------------------------------------------
# Bad input: a ValueError naming the argument; the caller's data untouched
# --------------------------------------------------------------------------
@pytest.mark.parametrize("call,match", [
    (lambda ix: ix.add(torch.randn(2, 5)), "vectors must have D=4"),
    (lambda ix: ix.add(torch.tensor([[1.0, float("nan"), 0, 0]])), "vectors must be finite"),
    (lambda ix: ix.add(torch.randn(4)), r"vectors must have shape \(n, D\)"),
    (lambda ix: ix.add(torch.ones(2, 4, dtype=torch.int64)), "vectors must have dtype"),
    (lambda ix: ix.add(torch.randn(2, 4), ids=[7, 7]), "ids must be distinct"),
    (lambda ix: ix.add(torch.randn(2, 4), ids=[1]), r"ids must hold one id per vector \(2\)"),
    (lambda ix: ix.add(torch.randn(1, 4), ids=[0]), "ids must not be held"),
    (lambda ix: ix.add(torch.randn(1, 4), ids=[-1]), "ids must be non-negative"),
    (lambda ix: ix.remove([0, 99]), r"not found: \[99\]"),
    (lambda ix: ix.search(torch.randn(2, 3), 1), "queries and the index.s keys must have the same number of columns D"),
    (lambda ix: ix.search(torch.tensor([[float("inf"), 0, 0, 0]]), 1), "queries must be finite"),
    (lambda ix: ix.search(torch.randn(1, 4), 0), "k must be"),
    (lambda ix: ix.search(torch.randn(2, 4), 1, ranges=[[0, 1]]), r"ranges must have shape \(Q, 2\)"),
    (lambda ix: ix.search(torch.randn(1, 4), 1, ranges=[[3, 1]]), "ranges must satisfy"),
    (lambda ix: ix.search(torch.randn(1, 4), 1, backend="nope"), "backend must be one of"),
    (lambda ix: ix.reconstruct([42]), "not found"),
])
def test_bad_input_raises_value_error_naming_it(call, match):
    index = CosineIndex(4)
    index.add(torch.randn(3, 4))
    with pytest.raises(ValueError, match=match):
        call(index)
    assert len(index) == 3  # a failed call changes nothing


@pytest.mark.parametrize("make,match", [(lambda: CosineIndex(0), "dim"), (lambda: CosineIndex(4, device="nowhere"),
                                                                          "device"),
                                        (lambda: CosineIndex(4, half_scan=1), "half_scan")])
def test_bad_constructor_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_inputs_are_never_modified_and_strided_inputs_are_read_correctly():
    keys, queries = sample(120, 16, 4, seed=17)
    wide = torch.randn(120, 32)
    wide[:, ::2] = keys  # a strided view of the keys
    strided = wide[:, ::2]
    k0, q0 = strided.clone(), queries.clone()
    index = CosineIndex(16)
    index.add(strided)
    got = index.search(queries.T.contiguous().T, 5)  # column-major queries
    assert torch.equal(strided, k0) and torch.equal(queries, q0)
    assert torch.equal(got.ids, cosine_topk(queries, keys, 5).ids)


def test_an_empty_index_pads_and_numpy_input_is_accepted():
    index = CosineIndex(3)
    got = index.search(np.ones((2, 3), np.float32), 4)
    assert got.ids.eq(-1).all() and got.scores.eq(float("-inf")).all()
    index.add(np.eye(3))
    assert index.search(np.eye(3)[:1], 1).ids.tolist() == [[0]]
    index.remove([0, 1, 2])
    assert len(index) == 0 and index.search(np.ones((1, 3)), 2).ids.eq(-1).all()


# --------------------------------------------------------------------------
# The C++ paths, the custom op, concurrency
# --------------------------------------------------------------------------
def test_the_latency_path_the_one_pass_scan_and_the_blas_path_agree():
    needs_cpp()
    keys, queries = sample(2500, 40, 24, seed=19)
    index = CosineIndex(40)
    index.add(keys, ids=torch.arange(2500) + 10)
    index.remove(torch.arange(500, 900, 7) + 10)
    n, alive = index._n, index._alive[: index._n]
    rows = torch.tensor([[0, n]] * 24)
    unit = unit_rows(queries)
    fused = _index_topk_cpp(queries[:5], index._keys[:n], index._norms[:n], index._scale[:n], alive, rows[:5], 6,
                            None, None, 0.0, 0.0, 0.0)
    blas = _index_topk_blas(INDEX_TOPK.cpp_module("cpp"), queries, index._keys[:n], index._norms[:n], alive, rows, 6)
    want = index_topk_reference(unit, index._keys[:n], 6, rows, alive)
    assert torch.equal(fused[0], want[0][:5]) and torch.equal(blas[0], want[0])
    fast = index.search(queries[:5], 6)  # the latency path
    assert torch.equal(fast.ids, index._ids[fused[0]]) and torch.equal(fast.scores, fused[1])


def test_opcheck():
    index = CosineIndex(8)
    index.add(torch.randn(30, 8))
    index.remove([3, 4])
    n = index._n
    q = torch.randn(4, 8)
    ranges = torch.tensor([[0, 30], [2, 9], [0, 0], [5, 30]])
    for backend in INDEX_BACKENDS[:2]:
        torch.library.opcheck(torch.ops.streammem.index_topk.default,
                              (q, index._keys[:n], index._norms[:n], index._scale[:n], index._alive[:n], ranges, 4,
                               None, None, 0.0, 0.0, 0.0, backend))


def test_searches_run_while_another_thread_adds_and_removes():
    keys, queries = sample(4000, 16, 3, seed=23, zero_every=0)
    index = CosineIndex(16)
    index.add(keys[:1000])
    errors = []

    def writer():
        try:
            for lo in range(1000, 4000, 250):
                index.add(keys[lo : lo + 250])
                index.remove(torch.arange(lo - 1000, lo - 900))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    while thread.is_alive():
        got = index.search(queries, 3)
        assert bool((got.ids >= 0).all())
    thread.join()
    assert not errors
    final = index.search(queries, 3)
    assert torch.equal(final.ids, mapped(cosine_topk(queries, index.keys, 3), index.ids))


@pytest.mark.parametrize("ids_kind", ["default", "offset", "removed"])
def test_ranged_rounds_take_the_latency_path_with_the_general_answer(monkeypatch, ids_kind):
    """A VideoAgent round (10+ queries, ranges over ids scanned in one pass) runs on the latency path: the
    same ids and scores as the general path, with default ids, offset ids (binary search) and removed
    keys; ranges that do not hold go to the general path and its error."""
    needs_cpp()
    import streammem_kernels.tree.index as index_module

    keys, queries = sample(1200, 32, 10, seed=31)
    index = CosineIndex(32)
    offset = 0 if ids_kind == "default" else 5000
    index.add(keys, ids=None if ids_kind == "default" else torch.arange(1200) + offset)
    if ids_kind == "removed":
        index.remove(torch.arange(100, 700, 3) + offset)
    edges = torch.linspace(0, 1200, 11).long() + offset
    ranges = torch.stack([edges[:-1], edges[1:]], 1).contiguous()
    ranges[2] = torch.tensor([offset + 300, offset + 300])
    ranges[9, 1] = offset + 10**6  # beyond the last id: clipped, as searchsorted does
    fast, took = index_module.INDEX_TOPK.fast, []

    def watched(*args):
        result = fast(*args)
        took.append(result is not None)
        return result

    monkeypatch.setattr(index_module.INDEX_TOPK, "fast", watched)
    got = index.search(queries, 4, ranges=ranges)
    assert took == [True]
    bad = ranges.clone()
    bad[4] = torch.tensor([offset + 9, offset + 2])
    with pytest.raises(ValueError, match="ranges must satisfy"):
        index.search(queries, 4, ranges=bad)
    assert took == [True, False]
    monkeypatch.setattr(index_module.INDEX_TOPK, "fast", None)
    want = index.search(queries, 4, ranges=ranges)
    assert torch.equal(got.ids, want.ids) and torch.equal(got.scores, want.scores)
    for q, (lo, hi) in enumerate(ranges.tolist()):
        allowed = (index.ids >= lo) & (index.ids < hi)
        ids, _ = brute_force(queries[q : q + 1], index.keys, 4, allowed)
        assert torch.equal(got.ids[q], torch.where(ids[0] >= 0, index.ids[ids[0].clamp_min(0)], ids[0])), q


def test_strided_ids_are_looked_up_without_a_warning():
    """remove / reconstruct / contains take a strided view of ids (a column of a table) as they take a copy,
    silently: torch.searchsorted warns on non-contiguous values, so the index hands it a contiguous copy."""
    import warnings

    keys, _ = sample(20, 8, 1, seed=41)
    index = CosineIndex(8)
    index.add(keys, ids=torch.arange(20) * 3)
    table = (torch.arange(20) * 3).reshape(10, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = index.reconstruct(table[:, 1])
        index.remove(table[:, 0])
    assert torch.equal(got, index.reconstruct(table[:, 1].clone()))
    assert len(index) == 10 and torch.equal(index.ids, table[:, 1])
