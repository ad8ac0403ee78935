"""CosineIndex(int8_scan=True): the int8 scan copy the C++ one-pass scan scores first, then re-ranks
exactly.  Its results must be the float32 index's bit for bit (ids, scores, tie order), which these
tests check where a copy alone would misrank: near-duplicates, exact ties, zero keys and queries,
rows with one dominant entry (most codes 0), huge and tiny keys, odd widths, k >= N, ranges,
removals, many threads."""
import pytest
import torch

from tests.support.device_checks import cpu_backends
from streammem_kernels import CosineIndex
from streammem_kernels.runtime.native import view
from streammem_kernels.tree.index import INDEX_TOPK
from streammem_kernels.tree.reference import unit_rows

if "cpp" not in cpu_backends(INDEX_TOPK):
    pytest.skip("C++ backend not built", allow_module_level=True)

_MODULE = INDEX_TOPK.cpp_module("cpp")


def pair(keys, ids=None, remove=None, capacity=1):
    """A float32 index and an int8-copy index holding the same keys (and the same removals)."""
    plain, coded = CosineIndex(keys.shape[1], capacity=capacity), CosineIndex(keys.shape[1], int8_scan=True,
                                                                                capacity=capacity)
    for index in (plain, coded):
        index.add(keys, ids=ids)
        if remove is not None:
            index.remove(remove)
    return plain, coded


def assert_same(plain, coded, queries, ks, ranges=None):
    for num_q in sorted({1, 2, min(7, queries.shape[0]), queries.shape[0]}):
        for k in ks:
            r = None if ranges is None else ranges[:num_q]
            a, b = plain.search(queries[:num_q], k, ranges=r), coded.search(queries[:num_q], k, ranges=r)
            assert torch.equal(a.ids, b.ids), (num_q, k)
            assert torch.equal(a.scores, b.scores), (num_q, k)


def adversarial_keys(dim, seed):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(30, dim, generator=g)
    # Clusters of near-duplicates whose cosines differ far below the copy's resolution (~1e-2).
    keys = base.repeat_interleave(40, 0) + 1e-4 * torch.randn(1200, dim, generator=g)
    keys[::53] = 0  # zero keys score 0
    keys[7] = keys[611]  # exact ties: the earlier key first
    keys[8] = 3.0 * keys[611]  # the same direction, another norm
    keys[100:120] *= 1e30  # huge and tiny keys (normalised when added)
    keys[120:140] *= 1e-30
    spike = torch.zeros(dim)
    spike[dim // 2] = 1.0
    keys[200:220] = spike + 1e-3 * torch.randn(20, dim, generator=g)  # one dominant entry: codes mostly 0
    keys[300] = torch.arange(dim, dtype=torch.float32)  # a ramp
    queries = torch.cat([keys[611:612], keys[205:206], base[:5] + 1e-4 * torch.randn(5, dim, generator=g),
                         torch.zeros(1, dim), -keys[300:301], torch.randn(4, dim, generator=g)])
    return keys, queries


@pytest.mark.parametrize("dim", [1, 7, 33, 64, 65, 100, 384])
def test_int8_scan_returns_the_float32_results_bit_for_bit(dim):
    keys, queries = adversarial_keys(dim, seed=dim)
    plain, coded = pair(keys)
    assert_same(plain, coded, queries, ks=(1, 3, 40, 41, 1200, 1500))  # k >= N included


def test_int8_scan_with_ids_removals_and_ranges():
    keys, queries = adversarial_keys(48, seed=5)
    labels = torch.arange(keys.shape[0]) * 2 + 3
    plain, coded = pair(keys, ids=labels, remove=labels[100:400:3].contiguous())
    g = torch.Generator().manual_seed(9)
    lo = torch.randint(0, 2 * keys.shape[0], (queries.shape[0],), generator=g)
    ranges = torch.stack([lo, lo + torch.randint(0, 900, (queries.shape[0],), generator=g)], 1)
    ranges[0] = torch.tensor([0, 10 ** 6])
    assert_same(plain, coded, queries, ks=(1, 5, 64), ranges=ranges)
    for index in (plain, coded):  # compaction moves the copy with the rows
        index.compact()
        index.add(torch.randn(50, 48, generator=torch.Generator().manual_seed(1)))
    assert_same(plain, coded, queries, ks=(1, 5, 64), ranges=ranges)


def test_int8_scan_across_threads():
    """Large enough for the scan to split the keys across threads (each with its own running k-th)."""
    g = torch.Generator().manual_seed(3)
    base = torch.randn(8, 64, generator=g)
    keys = base.repeat_interleave(3000, 0) + 2e-3 * torch.randn(24000, 64, generator=g)
    queries = base[:4] + 1e-3 * torch.randn(4, 64, generator=g)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        plain, coded = pair(keys, capacity=24000)
        assert_same(plain, coded, queries, ks=(1, 10, 100))
    finally:
        torch.set_num_threads(threads)


def test_int8_copy_bounds_and_kernels_agree():
    """The copy's measured bounds hold, and this CPU's kernel computes the portable kernel's scores."""
    keys, queries = adversarial_keys(100, seed=2)
    index = CosineIndex(100, int8_scan=True)
    index.add(keys)
    n = index._n
    codes, scales = index._codes[:n], index._code_scale[:n]
    assert codes.dtype == torch.int8 and int(codes.abs().max()) <= 127
    unit = index.keys.double()
    copy = codes.double() * scales.double()[:, None]
    norm_bound, err_bound = index._scan_bounds
    assert float(unit.norm(dim=1).max()) <= norm_bound
    assert float((unit - copy).norm(dim=1).max()) <= err_bound < 0.05
    out, other = torch.empty(n), torch.empty(n)
    for q in unit_rows(queries):
        _MODULE.int8_dots(view(q), view(codes), view(scales), view(out), "")
        assert float((out.double() - unit @ q.double()).abs().max()) < 0.1
        for kernel in ("scalar", "avx2", "avx512vnni"):  # every kernel this CPU has: the same int32 sums
            try:
                _MODULE.int8_dots(view(q), view(codes), view(scales), view(other), kernel)
            except RuntimeError as exc:
                assert "lacks the kernel" in str(exc)
                continue
            assert torch.equal(out, other), kernel
    assert _MODULE.int8_scan_kernel() in ("avx512vnni", "avx2", "scalar")


def test_int8_scan_memory_and_arguments(tmp_path):
    keys, queries = adversarial_keys(16, seed=4)
    plain, coded = pair(keys, capacity=2048)
    assert coded.nbytes - plain.nbytes == 2048 * (16 + 4)  # codes and a scale per row
    assert coded.int8_scan and not plain.int8_scan and "int8_scan=True" in repr(coded)
    plain.save(tmp_path / "index.ckpt")
    back = CosineIndex.load(tmp_path / "index.ckpt", int8_scan=True)
    assert back.int8_scan
    assert_same(plain, back, queries, ks=(1, 9))
    with pytest.raises(ValueError, match="int8_scan must be a bool"):
        CosineIndex(4, int8_scan=1)
    with pytest.raises(ValueError, match="int8_scan=True needs a CPU index"):
        CosineIndex(4, device="meta", int8_scan=True)
    with pytest.raises(ValueError, match="exclusive"):
        CosineIndex(4, half_scan=True, int8_scan=True)


def test_int8_scan_survives_copies_and_reserve():
    import copy

    keys, queries = adversarial_keys(40, seed=6)
    plain, coded = pair(keys[:500])
    twin = copy.deepcopy(coded)
    assert twin.int8_scan
    assert_same(plain, twin, queries, ks=(1, 7))
    for index in (plain, coded):
        index.reserve(700)
        assert index.capacity == 1200  # exactly the rows needed, not doubled
        index.add(keys[500:])
    assert coded.capacity == plain.capacity
    assert_same(plain, coded, queries, ks=(1, 7, 1300))
    with pytest.raises(ValueError, match="count"):
        coded.reserve(-1)
