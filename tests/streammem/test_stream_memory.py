"""StreamMemory and MemoryConfig: the synchronous core, its validation, and checkpoints that
restore exactly (in this process, through pickle, and in a fresh process)."""
import json
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from streammem_kernels import checkpoint

from streammem import (
    BoundedConfig, HashingTextEncoder, InjectorConfig, MemoryConfig, PixelEncoder, Preset, SegmenterConfig,
    ShortTermConfig, StreamMemory, SyntheticVideo, encoder_from_spec, encoder_spec,
)
from streammem import PRESETS

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

COLOURS = ["red", "green", "blue", "yellow", "purple", "cyan", "orange", "white"]
QUESTIONS = ["when was the screen purple?", "what colour is it now?", "was there anything green?"]


def _config(**changes):
    changes.setdefault("preset", Preset("t", 0.1, 6, 3, 2))
    changes.setdefault("motion_size", None)
    return MemoryConfig(**changes)


def _frames(n_scenes=8, seed=0):
    """Synthetic scenes with still stretches (so the gate drops some frames)."""
    video = SyntheticVideo(COLOURS[:n_scenes], [14 + 3 * (i % 4) for i in range(n_scenes)], size=(16, 16),
                           fps=10.0, seed=seed)
    frames = np.stack([f for _, f in video])
    frames[20:26] = frames[20]
    if len(frames) > 75:
        frames[70:75] = frames[70]
    return [i / 10.0 for i in range(len(frames))], frames


def _answer(ctx):
    return ctx.tree_best["caption"] if ctx.tree_best else "nothing yet"


def _memory(config=None, **hooks):
    hooks.setdefault("answer_fn", _answer)
    return StreamMemory(config or _config(), PixelEncoder(), HashingTextEncoder(), **hooks)


def _push_range(memory, times, frames, start, stop, step=5):
    for i in range(start, stop, step):
        j = min(stop, i + step)
        memory.push(times[i:j], frames[i:j])


def _comparable(ctx):
    d = ctx.to_dict()
    for key in ("timings_ms", "rpd_ms"):
        d.pop(key)
    d["centres"] = [c.tolist() for c in ctx.tree_centres]
    return d


# --------------------------------------------------------------------------
# MemoryConfig
# --------------------------------------------------------------------------
def test_config_presets_and_round_trip():
    for name, preset in PRESETS.items():
        assert MemoryConfig.from_preset(name).preset == preset
    cfg = MemoryConfig.from_preset("slow", budget=500, segmenter=SegmenterConfig(drift=0.4, max_event=None),
                                   short_term=ShortTermConfig(12, 4, 3.0), injector=InjectorConfig(0.3, 0.7, 0.2))
    assert cfg.bounded == BoundedConfig(500) and cfg.preset.name == "slow"
    assert MemoryConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert cfg.replace(seed=3).seed == 3 and cfg.seed == 0
    assert MemoryConfig() == MemoryConfig.from_preset("base")


@pytest.mark.parametrize("make, name", [
    (lambda: MemoryConfig.from_preset("medium"), "preset"),
    (lambda: MemoryConfig(motion_size=4), "motion_size"),
    (lambda: MemoryConfig(motion_window=4), "motion_window"),
    (lambda: MemoryConfig(motion_reference="first"), "motion_reference"),
    (lambda: MemoryConfig(kmeans_iters=0), "kmeans_iters"),
    (lambda: MemoryConfig(seed=-1), "seed"),
    (lambda: MemoryConfig(preset=Preset("x", 1.5, 10, 3, 3)), "preset.threshold"),
    (lambda: MemoryConfig(preset=Preset("x", 0.3, 10, 1, 3)), "preset.group"),
    (lambda: MemoryConfig(bounded={"budget": 10}), "bounded"),
    (lambda: SegmenterConfig(window=1), "segmenter.window"),
    (lambda: SegmenterConfig(drift=2.0), "segmenter.drift"),
    (lambda: BoundedConfig(0), "bounded.budget"),
    (lambda: BoundedConfig(10, low_water=0.0), "bounded.low_water"),
    (lambda: ShortTermConfig(keep=0), "short_term.keep"),
    (lambda: InjectorConfig(theta1=0.2, theta2=0.5), "injector.theta2"),
    (lambda: MemoryConfig.from_preset("base", budget=10, bounded=BoundedConfig(5)), "budget or bounded"),
    (lambda: MemoryConfig.from_dict({"preset": PRESETS["base"], "colour": 1}), "colour"),
])
def test_config_validation_names_the_field(make, name):
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        make()


# --------------------------------------------------------------------------
# StreamMemory: push / ask
# --------------------------------------------------------------------------
def test_memory_forms_events_tree_and_answers():
    video = SyntheticVideo(COLOURS[:6], [20, 15, 25, 20, 15, 20], size=(16, 16), fps=10.0)
    memory = _memory(_config(preset=Preset("t", 0.0, 10, 3, 3)))
    items = list(video)
    for i in range(0, len(items), 9):
        res = memory.push([t for t, _ in items[i:i + 9]], np.stack([f for _, f in items[i:i + 9]]))
        assert res.frames == len(items[i:i + 9]) and res.kept == list(range(i, i + res.frames))
    memory.finish()
    spans = [(e.first_frame, e.last_frame) for e in memory.knowledge_base.entries]
    cuts = [0] + video.cuts + [len(items)]
    assert spans == [(a, b - 1) for a, b in zip(cuts, cuts[1:])]
    assert memory.long_term.levels() == {0: 12, 1: 4, 2: 1}
    ctx = memory.ask("when was the screen blue?")
    assert ctx.tree_path[-1]["caption"] in ("4.0-4.9s: blue", "5.0-5.9s: blue") and "blue" in ctx.tree_best["caption"]
    top = memory.knowledge_base.search(memory.encode_question("when was the screen blue?"), 1)
    assert top[0][1].caption == "3.5-5.9s: blue" and ctx.injection["mode"] in ("latest", "top3", "top5")
    assert ctx.answer == ctx.tree_best["caption"] and len(memory.dialogue) == 1
    assert ctx.stream_time == pytest.approx(11.4) and len(ctx.short_term) == 5
    s = memory.summary()
    assert s["frames_seen"] == s["frames_kept"] == s["frames_formed"] == 115 and s["questions"] == 1


def test_push_validation_and_gaps():
    times, frames = _frames()
    memory = _memory()
    with pytest.raises(ValueError, match="frames"):
        memory.push([0.0], frames[0, :, :, 0])
    with pytest.raises(ValueError, match="timestamps"):
        memory.push([0.0, 0.1], frames[:3])
    with pytest.raises(ValueError, match="timestamps must be finite"):
        memory.push([float("nan")], frames[:1])
    memory.push(times[:4], frames[:4])
    with pytest.raises(ValueError, match="must not decrease"):
        memory.push([0.1], frames[4:5])
    with pytest.raises(ValueError, match="first_index"):
        memory.push(times[4:6], frames[4:6], first_index=2)
    # A lost stretch: frames 4..9 never arrive; indices continue at 10 and the gap is counted.
    res = memory.push(times[10:13], frames[10:13], first_index=10)
    assert res.kept[0] == 10 and memory.frames_missing == 6 and memory.frames_seen == 13
    one = memory.push(times[13], frames[13])  # a single (H, W, 3) frame with a scalar time
    assert one.frames == 1 and memory.frames_seen == 14
    with pytest.raises(ValueError, match="question"):
        memory.ask("  ")
    no_frames = StreamMemory(_config(), None, HashingTextEncoder())
    with pytest.raises(ValueError, match="frame_encoder"):
        no_frames.push(times[:2], frames[:2])
    with pytest.raises(ValueError, match="text_encoder"):
        StreamMemory(_config(), PixelEncoder(), None)
    with pytest.raises(ValueError, match="config"):
        StreamMemory(42, PixelEncoder(), HashingTextEncoder())


def test_push_encoded_skips_gate_and_encoder():
    times, frames = _frames(4)
    enc = PixelEncoder().encode(frames)
    direct = StreamMemory(_config(preset=Preset("t", 0.0, 6, 3, 2)), None, HashingTextEncoder())
    direct.push_encoded(times, enc.features, enc.labels)
    direct.finish()
    gated = _memory(_config(preset=Preset("t", 0.0, 6, 3, 2)))
    gated.push(times, frames)
    gated.finish()
    # Threshold 0 keeps every moving frame; the still stretch 20-25 is dropped by the gate only.
    assert direct.frames_formed == len(times) and gated.frames_formed == len(times) - 5
    assert [e.caption.split(": ")[1] for e in direct.knowledge_base.entries][:2] == ["red", "green"]
    with pytest.raises(ValueError, match="features"):
        direct.push_encoded([99.0], torch.tensor([[float("inf")] * enc.features.shape[1]]))
    with pytest.raises(ValueError, match="labels"):
        direct.push_encoded([99.0, 99.1], enc.features[:2], [("red",)])


# --------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------
def _with_budget():
    return _config(bounded=BoundedConfig(40, theta_concept=0.97, tau=2.0))


def _run_second_half(memory, times, frames, half):
    out = []
    _push_range(memory, times, frames, half, half + 30)
    out += [_comparable(memory.ask(q)) for q in QUESTIONS]
    _push_range(memory, times, frames, half + 30, len(times), step=7)
    memory.finish()
    out += [_comparable(memory.ask(q)) for q in QUESTIONS + QUESTIONS[:1]]
    return out


def test_state_dict_restores_exactly_in_process(tmp_path):
    times, frames = _frames()
    half = 57  # mid-chunk and mid-event
    memory = _memory(_with_budget())
    _push_range(memory, times, frames, 0, half)
    for q in QUESTIONS:
        memory.ask(q)
    memory.save(tmp_path / "ckpt")
    assert memory.long_term.pending_frames > 0 and memory.events.open_frames > 0 and len(memory.dialogue) == 3
    restored = StreamMemory.load(tmp_path / "ckpt", answer_fn=_answer)
    assert isinstance(restored.frame_encoder, PixelEncoder) and restored.text_encoder.dim == 384
    copied = pickle.loads(pickle.dumps(memory))
    want = _run_second_half(memory, times, frames, half)
    assert memory.bounded.stats.rounds > 0 and memory.bounded.stats.removed_leaves > 0
    assert _run_second_half(restored, times, frames, half) == want
    assert _run_second_half(copied, times, frames, half) == want


def test_checkpoint_with_the_earlier_gate_layout_is_refused_naming_the_version():
    """Checkpoints written before the gate kept its reference frame's gray held the raw frame
    (``{"anchor", "anchor_is_numpy", ...}``, gate state layout 1); loading one raises one ValueError
    that names the layout version instead of converting it."""
    times, frames = _frames()
    half = 57
    memory = _memory(_with_budget())
    _push_range(memory, times, frames, 0, half)
    state = memory.state_dict()
    gate = state["gate"]
    assert "anchor" not in gate and gate["anchor_gray"].shape == (16, 16) and gate["version"] == 2
    state["gate"] = {"anchor": torch.from_numpy(frames[half - 1].copy()), "anchor_is_numpy": gate["anchor_is_numpy"],
                     "frames_seen": gate["frames_seen"], "frames_kept": gate["frames_kept"]}
    with pytest.raises(ValueError, match="layout version 1"):
        StreamMemory.from_state_dict(state, answer_fn=_answer)


def test_checkpoint_restored_in_a_fresh_process(tmp_path):
    """Save mid-stream, load in another interpreter, and every later
    question is answered exactly as by the memory that never stopped."""
    times, frames = _frames()
    half = 61
    memory = _memory(_with_budget())
    _push_range(memory, times, frames, 0, half)
    for q in QUESTIONS[:2]:
        memory.ask(q)
    memory.save(tmp_path / "ckpt")
    script = textwrap.dedent(f"""
        import json, sys, torch
        torch.set_num_threads(1)
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import test_stream_memory as t
        from streammem import StreamMemory
        times, frames = t._frames()
        memory = StreamMemory.load({str(tmp_path / "ckpt")!r}, answer_fn=t._answer)
        json.dump(t._run_second_half(memory, times, frames, {half}), sys.stdout)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # the code under test
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    want = json.loads(json.dumps(_run_second_half(memory, times, frames, half)))
    assert len(got) == 7 and got == want
    assert any(ctx["dialogue"] for ctx in want) and any(ctx["knowledge"] for ctx in want)


def test_load_rejects_other_configs_and_dims(tmp_path):
    times, frames = _frames(3)
    memory = _memory()
    memory.push(times[:20], frames[:20])
    state = memory.state_dict()
    other = _memory(_config(seed=5))
    with pytest.raises(ValueError, match=r"another config \(fields \['seed'\]"):
        other.load_state_dict(state)
    small = StreamMemory(_config(), PixelEncoder(), HashingTextEncoder(64))
    with pytest.raises(ValueError, match="384-d text encoder"):
        small.load_state_dict(state)
    with pytest.raises(ValueError, match="not a StreamMemory"):
        memory.load_state_dict({"format": "something else"})
    with pytest.raises(FileNotFoundError, match="state.pt"):
        StreamMemory.load(tmp_path / "nothing")


def test_state_is_plain_data_and_save_is_atomic(tmp_path, monkeypatch):
    times, frames = _frames(3)
    memory = _memory()
    memory.push(times[:30], frames[:30])
    memory.ask(QUESTIONS[0])
    path = memory.save(tmp_path / "m")
    state, _ = checkpoint.load(path / "state.pt", "StreamMemory")  # read weights-only: no pickled objects inside
    assert state["counters"]["frames_seen"] == 30
    info = json.loads((path / "memory.json").read_text())
    assert info["summary"]["frames_seen"] == 30 and info["encoders"]["frame"] == {"name": "pixel", "grid": 8}
    memory.push(times[30:40], frames[30:40])

    def broken_save(obj, fh):
        fh.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        memory.save(path)
    monkeypatch.undo()
    assert StreamMemory.load(path).frames_seen == 30  # the previous checkpoint is intact
    assert sorted(p.name for p in path.iterdir()) == ["memory.json", "state.pt"]


def test_encoder_specs_rebuild_encoders():
    for enc in (PixelEncoder(grid=3), HashingTextEncoder(96)):
        rebuilt = encoder_from_spec(encoder_spec(enc))
        assert type(rebuilt) is type(enc) and rebuilt.dim == enc.dim
    assert encoder_spec(object()) is None
    with pytest.raises(ValueError, match="unknown encoder"):
        encoder_from_spec({"name": "clip"})


def test_model_encoders_pickle_as_their_spec(minilm):
    copy = pickle.loads(pickle.dumps(minilm))
    assert copy is not minilm and encoder_spec(copy) == encoder_spec(minilm)
    texts = ["a cyclist passes a taxi", "bicycles parked at the end"]
    torch.testing.assert_close(copy.encode(texts), minilm.encode(texts), rtol=0, atol=0)


# --------------------------------------------------------------------------
# LongTermMemory's public edits (what BoundedMemory uses)
# --------------------------------------------------------------------------
def test_long_term_remove_cascades_and_keeps_the_index():
    times, frames = _frames()
    memory = _memory(_config(preset=Preset("t", 0.0, 4, 2, 2)))
    memory.push(times, frames)
    ltm = memory.long_term
    parent = next(n for n in ltm.nodes.values() if n.level == 1 and n.parent is not None)
    grand = parent.parent
    siblings_of_parent = list(ltm.nodes[grand].children)
    leaves = list(parent.children)
    removed = ltm.remove(leaves)
    assert removed[:len(leaves)] == leaves and parent.node_id in removed
    assert (grand in removed) == (len(siblings_of_parent) == 1)
    assert ltm.tree.num_nodes == ltm.tree.num_live == len(ltm.nodes)
    for node in ltm.nodes.values():
        row = ltm.row_of(node.node_id)
        assert ltm.node_at(row) is node and int(ltm.tree.payload[row]) == node.node_id
        assert torch.equal(ltm.tree.embeddings[row], node.embedding)
    with pytest.raises(ValueError, match="node_ids"):
        ltm.remove([leaves[0]])
    a, b = [n.node_id for n in ltm.nodes.values() if n.level == 0][:2]
    with pytest.raises(ValueError, match="pairs"):
        ltm.merge_leaves([(a, b), (b, a)])
    assert ltm.merge_leaves([(a, b)]) == 1 and b not in ltm.nodes and ltm.nodes[a].merged == 2
    assert torch.equal(ltm.tree.embeddings[ltm.row_of(a)], ltm.nodes[a].embedding)
