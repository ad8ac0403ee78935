"""Property-based checks of the state surfaces: any damage to a checkpoint file is refused naming it or
loads the identical state; CSRGraph never shares storage with its caller; a restored StreamingSegmenter
state of random values is refused naming a field or restores exactly."""
import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from streammem_kernels import CSRGraph, StreamingSegmenter, checkpoint, khop_neighbourhood  # noqa: E402

PROPERTY = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def _state(n):
    g = torch.Generator().manual_seed(n)
    return {"x": torch.randn(n, 3, generator=g), "ids": list(range(n)), "name": "s" * n, "t": float(n)}


@PROPERTY
@given(n=st.integers(1, 40), flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 7)), max_size=3),
       cut=st.one_of(st.none(), st.integers(0, 10**6)))
def test_any_damage_to_a_checkpoint_is_refused_naming_it_or_loads_identical(tmp_path, n, flips, cut):
    path = tmp_path / f"thing{n}.ckpt"
    want = _state(n)
    checkpoint.save(path, "Thing", want)
    blob = bytearray(path.read_bytes())
    for pos, bit in flips:
        blob[pos % len(blob)] ^= 1 << bit
    if cut is not None:
        blob = blob[:cut % (len(blob) + 1)]
    path.write_bytes(bytes(blob))
    try:
        got, _ = checkpoint.load(path, "Thing")
    except ValueError as exc:
        assert path.name in str(exc)
        return
    assert torch.equal(got["x"], want["x"]) and {k: got[k] for k in ("ids", "name", "t")} == \
        {k: want[k] for k in ("ids", "name", "t")}


@PROPERTY
@given(rows=st.integers(1, 12), edges=st.lists(st.tuples(st.integers(0, 11), st.integers(0, 11)), max_size=30),
       poison=st.integers(-10**9, 10**9))
def test_a_csr_graph_is_unchanged_by_writes_to_the_callers_tensors(rows, edges, poison):
    edges = [(a % rows, b % rows) for a, b in edges]
    src = torch.tensor([a for a, _ in edges], dtype=torch.int64)
    dst = torch.tensor([b for _, b in edges], dtype=torch.int64)
    built = CSRGraph.from_edges(src, dst, rows)
    row_ptr, col_idx = built.row_ptr, built.col_idx  # copies
    graph = CSRGraph(row_ptr, col_idx)
    want = khop_neighbourhood(graph, torch.tensor([[0]]), 2, capacity=rows)
    row_ptr.fill_(poison)
    col_idx.fill_(poison)
    got = khop_neighbourhood(graph, torch.tensor([[0]]), 2, capacity=rows)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@PROPERTY
@given(field=st.sampled_from(["frames_seen", "window_sims", "frames_in_window", "last_end", "last_frame"]),
       value=st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=True, allow_infinity=True), st.none(),
                       st.text(max_size=3)))
def test_a_segmenter_state_with_any_field_replaced_is_refused_naming_it_or_restores(field, value):
    seg = StreamingSegmenter(window=4, backend="torch")
    for row in torch.randn(9, 6, generator=torch.Generator().manual_seed(1)):
        seg.push(row)
    state = seg.state_dict()
    old = state[field]
    try:
        state[field] = torch.full_like(old, value) if isinstance(old, torch.Tensor) \
            and isinstance(value, (int, float)) else value
    except RuntimeError:  # the value does not fit the field's dtype: not a state anyone can save
        hypothesis.assume(False)
    fresh = StreamingSegmenter(window=4, backend="torch")
    try:
        fresh.load_state_dict(state)
    except ValueError as exc:
        assert "checkpoint field '" in str(exc)  # the field, or the one its consistency rule names
        assert fresh.frames_seen == 0
        return
    fresh.push(torch.randn(6))  # a restored state steps on
