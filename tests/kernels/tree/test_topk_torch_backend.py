"""cosine_topk's torch backend scores only the keys in range; it must return the reference's ids
and scores bit for bit (the reference scores every key and masks those outside)."""
import pytest
import torch

from streammem_kernels import cosine_topk
from streammem_kernels.tree.reference import cosine_topk_reference
from streammem_kernels.tree.topk import COSINE_TOPK
from tests.support.device_checks import cpu_backends

TORCH_TOPK = COSINE_TOPK.impls["torch"]


def segments(num_keys, bounds):
    """(Q, 2) int64 ranges from a list of (start, end)."""
    out = torch.tensor(bounds, dtype=torch.int64)
    assert int(out.max()) <= num_keys
    return out


def assert_same(queries, keys, k, ranges):
    ids, scores = TORCH_TOPK(queries, keys, k, ranges)
    want_ids, want_scores = cosine_topk_reference(queries, keys, k, ranges)
    assert torch.equal(ids, want_ids)
    assert torch.equal(scores, want_scores)


@pytest.mark.parametrize("num_keys,dim,k", [(502, 384, 5), (97, 3, 7), (1000, 33, 1)])
def test_narrow_ranges_equal_the_reference(num_keys, dim, k):
    g = torch.Generator().manual_seed(num_keys)
    keys = torch.randn(num_keys, dim, generator=g)
    edges = sorted(torch.randint(0, num_keys, (9,), generator=g).tolist())
    bounds = list(zip([0] + edges, edges + [num_keys]))  # VideoAgent's segments: disjoint, covering
    queries = torch.randn(len(bounds), dim, generator=g)
    assert_same(queries, keys, k, segments(num_keys, bounds))


def test_ties_empty_ranges_and_short_windows():
    g = torch.Generator().manual_seed(1)
    keys = torch.randn(300, 16, generator=g)
    keys[40] = keys[12] * 4  # a power of two apart: the same unit row, a tie, the lower index first
    keys[13] = 0.0  # a zero key scores 0
    queries = torch.cat([keys[12:13], torch.randn(4, 16, generator=g), torch.zeros(1, 16)])
    ranges = segments(300, [[10, 50], [0, 0], [299, 300], [100, 102], [10, 41], [5, 20]])
    assert_same(queries, keys, 4, ranges)  # k above a window of 1 or 2: padded with -1 / -inf
    ids, _ = TORCH_TOPK(queries, keys, 4, ranges)
    assert ids[0, :2].tolist() == [12, 40]
    assert ids[1].tolist() == [-1] * 4


def test_every_range_empty():
    keys, queries = torch.randn(20, 4), torch.randn(3, 4)
    assert_same(queries, keys, 2, torch.zeros(3, 2, dtype=torch.int64))


def test_wide_ranges_run_the_reference():
    g = torch.Generator().manual_seed(2)
    keys, queries = torch.randn(64, 8, generator=g), torch.randn(3, 8, generator=g)
    assert_same(queries, keys, 5, segments(64, [[0, 64], [3, 40], [10, 11]]))


def test_public_function_with_narrow_ranges_matches_cpp():
    if "cpp" not in cpu_backends(COSINE_TOPK):
        pytest.skip("C++ backend not built")
    g = torch.Generator().manual_seed(3)
    keys, queries = torch.randn(400, 24, generator=g), torch.randn(4, 24, generator=g)
    ranges = segments(400, [[0, 90], [90, 200], [200, 205], [205, 400]])
    got = cosine_topk(queries, keys, 6, ranges=ranges, backend="torch")
    cpp = cosine_topk(queries, keys, 6, ranges=ranges, backend="cpp")
    assert torch.equal(got.ids, cpp.ids)
    torch.testing.assert_close(got.scores, cpp.scores, atol=2e-5, rtol=0)


def test_latency_path_takes_plain_ranges(monkeypatch):
    """A VideoAgent round (few queries, int64 ranges) goes straight to the fused scan: same ids, same errors."""
    if "cpp" not in cpu_backends(COSINE_TOPK):
        pytest.skip("C++ backend not built")
    import streammem_kernels.tree.topk as topk_module

    g = torch.Generator().manual_seed(4)
    keys, queries = torch.randn(502, 32, generator=g), torch.randn(5, 32, generator=g)
    ranges = segments(502, [[0, 100], [100, 101], [101, 300], [300, 300], [300, 502]])
    want = cosine_topk(queries, keys, 4, ranges=ranges, backend="torch")

    def general(*args):
        raise AssertionError("the general path ran")

    monkeypatch.setattr(topk_module, "_cosine_topk_general", general)
    got = cosine_topk(queries, keys, 4, ranges=ranges)
    assert torch.equal(got.ids, want.ids)
    torch.testing.assert_close(got.scores, want.scores, atol=2e-5, rtol=0)
    with pytest.raises(ValueError, match="ranges must satisfy"):
        cosine_topk(queries, keys, 4, ranges=segments(502, [[0, 100], [5, 4], [0, 1], [0, 1], [0, 1]]))
    monkeypatch.undo()
    with pytest.raises(ValueError, match="ranges must satisfy"):  # the general path's message
        cosine_topk(queries, keys, 4, ranges=segments(502, [[0, 100], [5, 4], [0, 1], [0, 1], [0, 1]]),
                    backend="torch")


def test_full_scan_ranks_ties_signed_zeros_and_blocks_like_the_sorts():
    """Without ranges the torch backend ranks the scores with one torch.topk on a packed (score, id)
    key: the reference's two sorts' order on exact ties (equal unit rows), on zero keys (+-0.0 scores)
    and on negative scores; and its blocked scan scores every key as one unblocked product would."""
    from streammem_kernels.tree.reference import dot_rows, unit_rows

    g = torch.Generator().manual_seed(6)
    base = torch.randn(6, 384, generator=g)
    picks = torch.randint(0, 6, (1500,), generator=g)
    scale = 2.0 ** torch.randint(-3, 4, (1500, 1), generator=g).float()
    sign = torch.where(torch.rand(1500, 1, generator=g) < 0.5, -1.0, 1.0)
    keys = base[picks] * scale * sign  # 12 distinct unit rows over 1,500 keys: ties everywhere
    keys[::7] = 0.0
    queries = torch.cat([base[:3], -base[3:4], torch.zeros(1, 384)])
    everything = torch.tensor([[0, 1500]] * 5)
    for k in (1, 9, 300, 1600):
        assert_same(queries, keys, k, everything)
    unblocked = dot_rows(unit_rows(queries), unit_rows(keys)[None].expand(5, -1, -1))
    _, scores = TORCH_TOPK(queries, keys, 1500, everything)
    assert torch.equal(scores.sort(1).values, unblocked.sort(1).values)


def test_latency_path_takes_a_whole_round_of_ranged_queries(monkeypatch):
    """Ten or more ranged queries that the C++ backend scans in one pass (the ranges cover less than half of
    the Q x N pairs: a VideoAgent round of 10 segments) take the latency path too, same answer; ranges
    that cover half or more go to the BLAS path through the general one."""
    if "cpp" not in cpu_backends(COSINE_TOPK):
        pytest.skip("C++ backend not built")
    import streammem_kernels.tree.topk as topk_module

    g = torch.Generator().manual_seed(6)
    keys, queries = torch.randn(1000, 24, generator=g), torch.randn(12, 24, generator=g)
    edges = torch.linspace(0, 1000, 13).long()
    round_ranges = torch.stack([edges[:-1], edges[1:]], 1).contiguous()
    round_ranges[3] = torch.tensor([40, 40])  # an empty segment
    want = cosine_topk(queries, keys, 4, ranges=round_ranges, backend="torch")
    general = topk_module._cosine_topk_general
    ran = []
    monkeypatch.setattr(topk_module, "_cosine_topk_general", lambda *a: ran.append(1) or general(*a))
    got = cosine_topk(queries, keys, 4, ranges=round_ranges)
    assert not ran and torch.equal(got.ids, want.ids)
    torch.testing.assert_close(got.scores, want.scores, atol=2e-5, rtol=0)
    wide = torch.tensor([[0, 1000]] * 6 + [[0, 0]] * 6)  # exactly half the pairs: the BLAS path
    got = cosine_topk(queries, keys, 4, ranges=wide)
    want = cosine_topk(queries, keys, 4, ranges=wide, backend="torch")
    assert ran and torch.equal(got.ids, want.ids)
    bad = round_ranges.clone()
    bad[5] = torch.tensor([7, 3])
    ran.clear()
    with pytest.raises(ValueError, match="ranges must satisfy"):
        cosine_topk(queries, keys, 4, ranges=bad)
    assert not ran  # the fused scan checked them, with the general path's message
