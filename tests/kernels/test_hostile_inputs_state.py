"""Hostile-input regressions of the graph storage, the kernels' error names and size bounds, and the recipe and
CLI inputs: each test is named after the input that crashed, read out of bounds or raised an unclear error."""
import json

import numpy as np
import pytest
import torch

from tests.support.device_checks import cpu_backends
from streammem_kernels import (CSRGraph, StreamingSegmenter, cosine_topk, graph_retrieve, khop_neighbourhood,
                               linear_token_logprobs, motion_magnitude, neighbourhood_chunks, select_frames)
from streammem_kernels import graph as graph_op

GRAPH_BACKENDS = cpu_backends(graph_op.GRAPH)


@pytest.mark.parametrize("backend", GRAPH_BACKENDS)
def test_writing_to_the_callers_csr_tensors_afterwards_changes_nothing(backend):
    """CSRGraph kept the caller's int64 tensors: writing to them made khop_neighbourhood segfault on the
    C++ backend or read out of bounds.  The graph owns copies (and hands out copies)."""
    row_ptr, col_idx = torch.tensor([0, 2, 3, 4]), torch.tensor([1, 2, 0, 1])
    graph = CSRGraph(row_ptr, col_idx)
    seeds = torch.tensor([[0]])
    want = khop_neighbourhood(graph, seeds, 2, capacity=4, backend=backend)
    col_idx.fill_(10**9)
    row_ptr[1:] = 10**6
    graph.col_idx.fill_(-7)
    got = khop_neighbourhood(graph, seeds, 2, capacity=4, backend=backend)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_graph_retrieve_names_node_embeddings_and_chunk_capacity():
    """graph_retrieve reported its internal cosine_topk's `keys` and `capacity` for the caller's
    node_embeddings and chunk_capacity."""
    graph = CSRGraph.from_edges(torch.tensor([0, 1]), torch.tensor([1, 2]), 3)
    chunk_map = CSRGraph.from_edges(torch.tensor([0, 1, 2]), torch.tensor([0, 0, 1]), 3, num_cols=2)
    emb = torch.randn(3, 4)
    bad = emb.clone()
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError, match="node_embeddings must be finite") as info:
        graph_retrieve(torch.randn(2, 4), bad, graph, k=1, hops=1, capacity=3)
    assert "keys" not in str(info.value)
    with pytest.raises(ValueError, match="chunk_capacity"):
        graph_retrieve(torch.randn(2, 4), emb, graph, k=1, hops=1, capacity=3, chunk_map=chunk_map, chunk_capacity=0)
    with pytest.raises(ValueError, match="chunk_capacity="):
        graph_retrieve(torch.randn(2, 4), emb, graph, k=1, hops=1, capacity=3, chunk_map=chunk_map,
                       chunk_capacity=2**31 - 2)


def test_cosine_topk_names_both_sides_of_a_width_mismatch():
    """cosine_topk blamed queries alone for a size mismatch caused by keys."""
    with pytest.raises(ValueError, match=r"queries and keys must have the same number of columns"):
        cosine_topk(torch.randn(2, 4), torch.randn(5, 3), 1)


@pytest.mark.parametrize("backend", cpu_backends(graph_op.GRAPH))
def test_huge_graph_capacities_are_refused_before_allocation(backend):
    """capacity=2**31-2 reached the allocator (five (B, capacity) int64 arrays)."""
    graph = CSRGraph.from_edges(torch.tensor([0, 1]), torch.tensor([1, 2]), 3)
    with pytest.raises(ValueError, match=r"capacity=2147483646 .*capacity <= 3 suffices"):
        khop_neighbourhood(graph, torch.tensor([[0]]), 1, capacity=2**31 - 2, backend=backend)
    with pytest.raises(ValueError, match="capacity="):
        graph_retrieve(torch.randn(1, 4), torch.randn(3, 4), graph, k=1, hops=1, capacity=2**31 - 2)
    with pytest.raises(ValueError, match="capacity="):
        neighbourhood_chunks(torch.tensor([[0]]), graph, capacity=2**31 - 2, backend=backend)
    with pytest.raises(ValueError, match="num_rows must be <= 268435456"):
        CSRGraph.from_edges(torch.tensor([0]), torch.tensor([0]), 10**9)


def test_motion_size_beyond_8k_is_refused_before_allocation():
    with pytest.raises(ValueError, match="size must be <= 8192"):
        motion_magnitude(np.zeros((2, 8, 8), np.uint8), size=100_000)


@pytest.mark.parametrize("backend", ["torch", "cpp", "auto"])
def test_requires_grad_inputs_are_read_as_torch_reads_them(backend):
    """motion_magnitude, select_frames and StreamingSegmenter on cpp/auto raised "Can't call numpy() on
    Tensor that requires grad" where torch accepts the input."""
    frames = torch.rand(4, 16, 16, requires_grad=True)
    want = motion_magnitude(frames.detach(), backend="torch")
    got = motion_magnitude(frames, backend=backend)
    torch.testing.assert_close(torch.as_tensor(got.flow_px), torch.as_tensor(want.flow_px), atol=1e-4, rtol=1e-4)
    select_frames(frames, 0.1, backend=backend)
    seg = StreamingSegmenter(window=4, backend=backend)
    for row in torch.rand(6, 8, requires_grad=True):
        seg.push(row)


def test_linear_token_logprobs_blames_the_overflow_not_a_finite_weight():
    """A huge but finite hidden said "weight must be finite"."""
    hidden = torch.full((2, 8), 1e38)
    with pytest.raises(ValueError, match=r"hidden @ weight\.T must stay finite") as info:
        linear_token_logprobs(hidden, torch.randn(50, 8), torch.tensor([0, 1]))
    assert "weight must be finite" not in str(info.value)


# ---- recipe and CLI inputs --------------------------------------------------------------------------------------
def test_turn_with_a_string_session_or_time_is_refused():
    from streammem.recipes.prostream import Turn

    with pytest.raises(ValueError, match="session"):
        Turn(1.0, "a", "hi", session="s")
    with pytest.raises(ValueError, match="t must be a finite number"):
        Turn("1", "a", "hi")


def test_read_dialogue_of_deep_json_or_a_huge_time_is_one_value_error(tmp_path):
    """read_dialogue raised RecursionError on deeply nested JSON and OverflowError on a huge integer time."""
    from streammem.recipes.prostream import read_dialogue

    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ValueError, match="deep.jsonl:1"):
        read_dialogue(deep)
    huge = tmp_path / "huge.jsonl"
    huge.write_text(json.dumps({"t": 10**400, "speaker": "a", "text": "hi"}) + "\n")
    with pytest.raises(ValueError, match="huge.jsonl:1: t must be a finite number"):
        read_dialogue(huge)


def test_memverse_refuses_a_string_time_and_a_nan_budget():
    from streammem import HashingTextEncoder
    from streammem.recipes.memverse import MemVerse, MemVerseConfig

    with pytest.raises(ValueError, match="timestamps must be numbers"):
        MemVerse(HashingTextEncoder(32)).add_turn("9", "Ana", "hello")
    with pytest.raises(ValueError, match="budget must be an int"):
        MemVerseConfig(budget=float("nan"))


def test_cli_refuses_an_empty_question_and_an_absurd_synthetic_video(capsys):
    from streammem.cli import main

    assert main(["prostream", "--generate", "20", "--text-encoder", "hashing", "--ask", "  "]) == 2
    assert "--ask must be a non-empty question" in capsys.readouterr().err
    assert main(["videoagent", "--synthetic", "--frames", "1000000000"]) == 2
    assert "--frames must be an int in [1, 1000000]" in capsys.readouterr().err


def test_prostream_names_embeddings_of_the_wrong_width():
    """ProStream named its internal `emb` for a wrong-size `embeddings`."""
    from streammem import HashingTextEncoder
    from streammem.recipes.prostream import ProStream, ProStreamConfig, Turn

    memory = ProStream(HashingTextEncoder(64), ProStreamConfig.for_encoder("hashing"))
    with pytest.raises(ValueError, match=r"embeddings must be a float \(1, E\) tensor with E = 64"):
        memory.push([Turn(1.0, "a", "hi")], torch.zeros(1, 10))


def test_a_huge_broadcast_view_is_refused_before_it_is_copied():
    """Stride-0 inputs (an expand of a huge shape) reached the allocator when an op copied them."""
    view = torch.zeros(1, 1, 1, 3, dtype=torch.uint8).expand(100_000, 1080, 1920, 3)
    with pytest.raises(ValueError, match="frames is a broadcast view"):
        motion_magnitude(view)
    with pytest.raises(ValueError, match="keys is a broadcast view"):
        cosine_topk(torch.randn(2, 8), torch.zeros(1, 8).expand(10**9, 8), 1)
    assert cosine_topk(torch.randn(2, 8), torch.randn(1, 8).expand(5, 8), 1).ids.shape == (2, 1)  # small: copied
