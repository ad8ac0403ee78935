"""Scenarios replayed by the ahead-of-time compile check (tests/gpu_readiness/test_triton_compile.py).

Each scenario calls public ops with ``backend="triton"`` the way users do, on
a realistic grid: the package's working sizes (224-px frames, D = 384/768
embeddings, vocabularies of 49,152 and 151,936 tokens) and the size-1 cases that
specialise differently (one query, one push, k = 1, T = 1, one frame pair).
Triton specialises integer arguments equal to 1 and multiples of 16, and
pointers on 16-byte alignment, so odd sizes and sliced inputs are here too.

Triton compiles one binary per specialisation class, not per size, so the
scenarios use small sizes *in the same classes* as the working sizes (a
224 x 126 frame has W divisible by 16 and H, H-2, W-2 not: 32 x 14 is in the
same classes), which the interpreter replays in seconds; the recorded
arguments are what matters.  Each op's list belongs to that op's
owner: add a scenario whenever a new kernel or launch path appears (the check
fails on a kernel that no scenario launches).
"""
from __future__ import annotations

import torch

from tests.support import interpreter_speedup
import streammem_kernels as sk

interpreter_speedup.install()  # the scenarios run interpreted while they are recorded


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------
# motion
# --------------------------------------------------------------------------
def motion_scenarios():
    g = _g(1)
    # A 400 x 175 RGB clip gated at size=32 gives 32 x 14 gray frames: the classes
    # of the gate's 224 x 126 working frames (W % 16 == 0; H, H-2, W-2 and the
    # window outputs Ho, Wo not).  The window is a runtime argument: one
    # specialisation serves every window, 3, 5, 7 and beyond.
    rgb = torch.randint(0, 256, (2, 175, 400, 3), dtype=torch.uint8, generator=g)
    small = torch.randint(0, 256, (2, 14, 32, 3), dtype=torch.uint8, generator=g)
    square = torch.randint(0, 256, (2, 32, 32), dtype=torch.uint8, generator=g)  # 224 x 224: H, W % 16 == 0
    gray_f = torch.rand(2, 21, 35, generator=g)

    def working_size_rgb():  # the gate's default path: uint8 RGB resized to gray, window 5
        sk.motion_magnitude(rgb, size=32, backend="triton")

    def square_frames():
        sk.motion_magnitude(square, backend="triton")

    def windows_3_7():
        for w in (3, 7):
            sk.motion_magnitude(small, window=w, backend="triton")

    def one_output_pixel_and_large_window():  # Ho = Wo = 1 specialise to constants
        sk.motion_magnitude(square[:, :9, :9], window=7, backend="triton")
        sk.motion_magnitude(square[:, :15, :15], window=11, backend="triton")

    def global_window():
        sk.motion_magnitude(small, window=None, backend="triton")

    def float_odd_sliced():  # float32 gray, odd sizes, a non-contiguous (sliced) input
        sk.motion_magnitude(gray_f, backend="triton")
        sk.motion_magnitude(gray_f[:, 1:, 1:], window=3, backend="triton")

    def each_float_dtype():  # converted to float32 gray before the kernels
        for dtype in (torch.float16, torch.bfloat16, torch.float64):
            sk.motion_magnitude(gray_f[:, :9, :9].to(dtype), window=3, backend="triton")

    def gate_masks():  # the device-resident gate, both references (one pair per call in "last_kept")
        sk.select_frames_mask(small, 0.3, backend="triton")
        sk.select_frames_mask(small, 0.3, reference="last_kept", backend="triton")

    # The pyramid (levels="auto"): reduce, guess, warp and the window solve composed with a guess
    # (factor 1 at the coarsest level's second step, 2 and 4 below).  Every level's sizes (frame,
    # gradients, window outputs, guess grid) must fall in the classes of the gate's: 224 x 126 ->
    # 112 x 63 -> 56 x 32 -> 28 x 16 (4 levels) is matched by 96 x 126 -> 48 x 63 -> 24 x 32 ->
    # 12 x 16 (the height cannot shrink: 32 at level 2 needs 126 or 125 at level 0), and 224 x 224
    # (5 levels, W % 16 == 0 at levels 0-1 only) by 160 x 160.
    pyr_16x9 = torch.randint(0, 256, (2, 126, 96), dtype=torch.uint8, generator=g)
    pyr_square = torch.rand(2, 160, 160, generator=g)

    def pyramid_working_sizes():
        sk.motion_magnitude(pyr_16x9, backend="triton")  # 4 levels, uint8
        sk.motion_magnitude(pyr_square, statistic="textured", backend="triton")  # 5 levels, float32

    def pyramid_two_levels_odd_sliced():  # odd sizes, a sliced input, 2 levels (factor 1 and 2 only)
        sk.motion_magnitude(gray_f[:, :, 1:], levels=2, backend="triton")

    # The "streamchat" statistic reads CLIP's 224 x 224 crops (H, W % 16 == 0, 220 window outputs a side,
    # not): 32 x 32 is in the same classes; odd frames (a second frame's pointer off 16 bytes) and one
    # window (Ho = Wo = 1) specialise differently.
    clip_mean, clip_std = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
    clip = (torch.rand(3, 3, 32, 32, generator=g) - torch.tensor(clip_mean)[:, None, None]) \
        / torch.tensor(clip_std)[:, None, None]
    clip_args = dict(channels="first", mean=clip_mean, std=clip_std, statistic="streamchat", backend="triton")

    def streamchat_clip_frames():  # the StreamChat gate's input, and the device-resident gate on it
        sk.motion_magnitude(clip, **clip_args)
        sk.select_frames_mask(clip, 0.35, **clip_args)
        sk.select_frames_mask(clip, 0.35, reference="last_kept", **clip_args)

    def streamchat_odd_and_one_window():
        sk.motion_magnitude(gray_f[:, :17, :23], statistic="streamchat", backend="triton")
        sk.motion_magnitude(gray_f[:, :5, :5], statistic="streamchat", backend="triton")

    return [working_size_rgb, square_frames, windows_3_7, one_output_pixel_and_large_window, global_window,
            float_odd_sliced, each_float_dtype, gate_masks, pyramid_working_sizes, pyramid_two_levels_odd_sliced,
            streamchat_clip_frames, streamchat_odd_and_one_window]


# --------------------------------------------------------------------------
# k-means
# --------------------------------------------------------------------------
def kmeans_scenarios():
    g = _g(2)

    def chunk_l2():  # StreamChat chunk compression: a few problems of L frames, D = 768 (D % 16 == 0)
        sk.batched_kmeans(torch.randn(3, 20, 768, generator=g), 8, iters=1, backend="triton")

    def chunk_cosine():
        sk.batched_kmeans(torch.randn(3, 20, 768, generator=g), 8, iters=1, metric="cosine", backend="triton")

    def cosine_odd():
        sk.batched_kmeans(torch.randn(2, 37, 97, generator=g), 5, iters=1, metric="cosine", backend="triton")

    def l2_odd_many_centres():  # k > 16: several centre tiles; odd D
        sk.batched_kmeans(torch.randn(2, 45, 33, generator=g), 20, iters=1, backend="triton")

    def single_problem_k1():
        sk.batched_kmeans(torch.randn(9, 384, generator=g), 1, iters=1, backend="triton")

    def single_point():  # N = k = 1
        sk.batched_kmeans(torch.randn(1, 1, 64, generator=g), 1, iters=1, backend="triton")

    def ragged_weighted_half():
        x = torch.randn(2, 33, 64, generator=g).half()
        sk.batched_kmeans(x, 4, iters=1, lengths=torch.tensor([33, 20]), weights=torch.rand(2, 33, generator=g),
                          backend="triton")

    def empty_clusters_reseeded():  # duplicated points, k close to N: the re-seeding path runs
        x = torch.randn(3, 16, generator=g).repeat(4, 1)[None].repeat(2, 1, 1)
        for metric in ("l2", "cosine"):
            sk.batched_kmeans(x, 7, init="first", iters=1, metric=metric, backend="triton")

    def frames_sliced():  # kmeans_frames on a sliced clip
        frames = torch.randn(2, 12, 8, 48, generator=g)[:, ::2, :, :32]
        sk.kmeans_frames(frames, 3, iters=1, backend="triton")

    return [chunk_l2, chunk_cosine, cosine_odd, l2_odd_many_centres, single_problem_k1, single_point,
            ragged_weighted_half, empty_clusters_reseeded, frames_sliced]


# --------------------------------------------------------------------------
# tree search and cosine top-k
# --------------------------------------------------------------------------
def tree_scenarios():
    g = _g(3)
    # D = 48 is in the classes of the working D = 384 / 768 (multiples of 16); 97 is odd.
    tree = sk.CosineTree(48)
    tree.add_leaves(torch.randn(300, 48, generator=g))
    tree.grow(10)
    q = torch.randn(17, 48, generator=g)
    keys = torch.randn(200, 48, generator=g)

    # Greedy: one row per program below 16 rows, blocks of 16 rows above.
    def greedy_one_query():
        sk.tree_search(tree, q[:1], backend="triton")

    def greedy_batch():
        sk.tree_search(tree, q, backend="triton")

    def greedy_from_every_root():  # 3 roots: 3 rows for one query, 51 for the batch
        sk.tree_search(tree, q[:1], from_every_root=True, backend="triton")
        sk.tree_search(tree, q, from_every_root=True, backend="triton")

    def beam_batch():
        sk.tree_search(tree, q, beam=(5, 10), k=3, backend="triton")

    def beam_one_query_utility():
        sk.tree_search(tree, q[:1], beam=4, k=1, use_utility=True, min_score=0.0, backend="triton")

    # Top-k: one query per program below 16 queries (or k > 64), blocks of 16 above; the
    # keys split into slices merged by a second launch, or one slice written out directly.
    def topk_one_query():  # k = 1
        sk.cosine_topk(q[:1], keys, 1, backend="triton")

    def topk_batch_k10():
        sk.cosine_topk(q, keys[:96], 10, backend="triton")

    def topk_one_slice():
        sk.cosine_topk(q, keys[:48], 5, backend="triton")
        sk.cosine_topk(q[:2], keys[:48], 5, backend="triton")

    def topk_large_k():  # k = 64: the largest a block of queries keeps; k = 65: one query per program
        sk.cosine_topk(q[:16], keys[:70], 64, backend="triton")
        sk.cosine_topk(q[:1], keys[:70], 65, backend="triton")

    def topk_ranges_odd_dim():  # VideoAgent: best frame inside each segment, odd D
        k97 = torch.randn(50, 97, generator=g)
        ranges = torch.tensor([[0, 10], [10, 33], [33, 50]])
        sk.cosine_topk(torch.randn(3, 97, generator=g), k97, 2, ranges=ranges, backend="triton")

    return [greedy_one_query, greedy_batch, greedy_from_every_root, beam_batch, beam_one_query_utility,
            topk_one_query, topk_batch_k10, topk_one_slice, topk_large_k, topk_ranges_odd_dim]


# --------------------------------------------------------------------------
# boundaries
# --------------------------------------------------------------------------
def boundaries_scenarios():
    g = _g(4)
    x = torch.randn(40, 768, generator=g)

    def offline_climb():
        sk.detect_boundaries(x, window=8, backend="triton")

    def offline_max_half_odd():
        sk.detect_boundaries(torch.randn(2, 23, 97, generator=g).half(), window=5, peak="max", max_event=7,
                             backend="triton")

    def offline_drift_and_max_event_1():  # the scan's drift mode; max_event = 1 specialises to a constant
        feats = torch.randn(3, 17, 384, generator=g)
        sk.event_ends(feats, drift=0.2, max_event=9, backend="triton")
        sk.event_ends(feats[:, 1:], max_event=1, backend="triton")  # a sliced input (copied to contiguous)

    def depth_and_cosine():
        sim = sk.adjacent_cosine(x, backend="triton")
        sk.depth_scores(sim, backend="triton")
        sk.depth_scores(sim.double(), peak="max", backend="triton")

    def streaming_one_push():  # one stream: every launch has B = 1, the pair M = 1
        seg = sk.StreamingSegmenter(window=4, backend="triton")
        for t in range(6):
            seg.push(x[t])

    def streaming_batched_window():  # the device-resident push: every stream's window decided each push
        seg = sk.StreamingSegmenter(window=8, max_event=20, backend="triton")
        feats = torch.randn(17, 9, 384, generator=g)
        for t in range(9):
            seg.push_tensors(feats[:, t])
        seg.flush_tensors()

    def streaming_batched_drift():
        seg = sk.StreamingSegmenter(window=4, drift=0.1, backend="triton")
        for t in range(3):
            seg.push(torch.randn(33, 384, generator=g))

    return [offline_climb, offline_max_half_odd, offline_drift_and_max_event_1, depth_and_cosine,
            streaming_one_push, streaming_batched_window, streaming_batched_drift]


# --------------------------------------------------------------------------
# log-probs
# --------------------------------------------------------------------------
def logprobs_scenarios():
    g = _g(5)

    def token_vocab_multiple_of_16():  # SmolLM2's V = 49,152 and Qwen's 151,936 are multiples of 16
        logits = torch.randn(3, 4096, generator=g)
        sk.token_logprobs(logits, torch.randint(0, 4096, (3,), generator=g), backend="triton")

    def token_one_row_half_odd():
        logits = torch.randn(1, 1001, generator=g).half()
        sk.token_logprobs(logits, torch.tensor([7]), backend="triton")

    def token_bf16_sliced():
        logits = torch.randn(2, 4, 3000, generator=g).bfloat16()[:, :, 1:]
        sk.token_logprobs(logits, torch.randint(0, 2999, (2, 4), generator=g), backend="triton")

    def linear_each_dtype():  # the tensor-core (float16/bfloat16) and IEEE-FMA (float32) tile configurations
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            h = torch.randn(5, 576, generator=g).to(dtype)  # SmolLM2-135M: H = 576
            w = torch.randn(1024, 576, generator=g).to(dtype)
            sk.linear_token_logprobs(h, w, torch.randint(0, 1024, (5,), generator=g), backend="triton")

    def linear_two_row_blocks_bias():  # a caption of T = 70 rows spans two 64-row tiles
        h = torch.randn(70, 64, generator=g).half()
        w = torch.randn(600, 64, generator=g).half()
        sk.linear_token_logprobs(h, w, torch.randint(0, 600, (70,), generator=g), bias=torch.randn(600).half(),
                                 backend="triton")

    def linear_one_token_bias_odd():  # H % 16 != 0: the unaligned tile configuration of each dtype
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            h = torch.randn(1, 99, generator=g).to(dtype)
            w = torch.randn(517, 99, generator=g).to(dtype)
            sk.linear_token_logprobs(h, w, torch.tensor([3]), bias=torch.randn(517, generator=g).to(dtype),
                                     backend="triton")

    return [token_vocab_multiple_of_16, token_one_row_half_odd, token_bf16_sliced, linear_each_dtype,
            linear_two_row_blocks_bias, linear_one_token_bias_odd]


# --------------------------------------------------------------------------
# memory graph: k-hop expansion and source chunks
# --------------------------------------------------------------------------
def graph_scenarios():
    g = _g(6)
    # A MemVerse-like graph: 2,000 nodes of average degree ~8 (undirected), hubs included.
    n = 2000
    src = torch.randint(0, n, (8000,), generator=g)
    dst = torch.where(torch.rand(8000, generator=g) < 0.1, torch.randint(0, 20, (8000,), generator=g),
                      torch.randint(0, n, (8000,), generator=g))
    graph = sk.CSRGraph.from_edges(src, dst, n, weight=torch.rand(8000, generator=g), symmetric=True)
    seeds = torch.randint(0, n, (64, 10), generator=g)
    chunk_map = sk.CSRGraph.from_edges(torch.arange(n).repeat(2), torch.randint(0, 333, (2 * n,), generator=g), n,
                                       num_cols=333)

    def one_query_two_hops():  # the retrieval's default: top-10 seeds, 2 hops, capacity a multiple of 16
        sk.khop_neighbourhood(graph, seeds[:1], 2, capacity=256, backend="triton")

    def batch_with_caps():  # fan-out and frontier caps, odd capacity, 3 hops
        sk.khop_neighbourhood(graph, seeds[:7, :5], 3, capacity=101, max_fanout=8, max_frontier=32,
                              backend="triton")

    def one_seed_one_hop_capacity_1():  # size-1 cases: S = 1, hops = 1, capacity = 1, fan-out 1
        sk.khop_neighbourhood(graph, seeds[:3, :1], 1, capacity=1, max_fanout=1, max_frontier=1, backend="triton")

    def seeds_only_padded_sliced():  # hops = 0, -1 padding, a non-contiguous seed block (copied by the op)
        padded = torch.where(seeds % 3 == 0, -1, seeds)
        sk.khop_neighbourhood(graph, padded[:5, ::2], 0, capacity=16, backend="triton")

    def chunks_of_neighbourhood():
        near = sk.khop_neighbourhood(graph, seeds[:4], 2, capacity=64, max_fanout=4, backend="triton")
        sk.neighbourhood_chunks(near.nodes, chunk_map, capacity=64, backend="triton")
        sk.neighbourhood_chunks(near.nodes[:1, :1], chunk_map, capacity=1, max_per_node=1, backend="triton")

    return [one_query_two_hops, batch_with_caps, one_seed_one_hop_capacity_1, seeds_only_padded_sliced,
            chunks_of_neighbourhood]


SCENARIOS = {
    "motion": motion_scenarios,
    "kmeans": kmeans_scenarios,
    "tree": tree_scenarios,
    "boundaries": boundaries_scenarios,
    "logprobs": logprobs_scenarios,
    "graph": graph_scenarios,
}
