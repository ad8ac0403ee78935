"""streammem.distributed without Ray: cross-stream batching (== separate memories), shard checkpoints
and lost-frame accounting, consistent hashing, the router's policies on local shards, archive indexing
with the local backend (manifest, resume, crash leftovers, failures), the missing-Ray message."""
import json
import sys
import threading
import time

import numpy as np
import pytest
import torch

from streammem_kernels import checkpoint

from streammem import HashingTextEncoder, MemoryConfig, PixelEncoder, Preset, StreamMemory, SyntheticVideo
from streammem.distributed import (
    HashRing, ShardMemory, ShardOverloaded, StreamRouter, VideoMemory, configure_threads, index_archive,
    thread_settings,
)
from streammem.distributed.archive import video_id
from streammem.distributed.hashing import stable_hash
from test_stream_pipeline import _assert_same_state

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

COLOURS = ["red", "green", "blue", "yellow", "purple", "cyan", "orange"]
CONFIG = MemoryConfig(preset=Preset("t", 0.1, 6, 3, 2), motion_size=None)


def stream_items(i, size=(16, 16), n=None):
    video = SyntheticVideo(COLOURS[i % 3:] + COLOURS[:i % 3], 11 + 2 * i, size=size, fps=10.0, seed=i)
    frames = np.stack([f for _, f in video])
    frames[8 + i:13 + i] = frames[8 + i]  # a still stretch per stream
    items = [(k / 10.0, f) for k, f in enumerate(frames)]
    return items if n is None else items[:n]


def _batch(items):
    return [t for t, _ in items], np.stack([f for _, f in items])


def _shard_and_solo(streams, schedule_seed=0, **shard_kwargs):
    shard = ShardMemory(CONFIG, PixelEncoder(), HashingTextEncoder(), **shard_kwargs)
    solo = {}
    for sid in streams:
        shard.add_stream(sid)
        solo[sid] = StreamMemory(CONFIG, PixelEncoder(), HashingTextEncoder())
    return shard, solo


def test_shard_batching_equals_separate_memories():
    """Random pushes of 1-5 frames of a random subset of streams (two frame sizes): every stream's
    memory equals a StreamMemory fed its frames alone, and calls were batched across streams."""
    streams = {f"cam{i}": stream_items(i, size=(16, 16) if i % 2 else (12, 20)) for i in range(4)}
    shard, solo = _shard_and_solo(streams)
    rng = np.random.default_rng(3)
    pos = dict.fromkeys(streams, 0)
    while any(pos[s] < len(streams[s]) for s in streams):
        batch = []
        for sid, items in streams.items():
            if pos[sid] < len(items) and rng.random() < 0.7:
                chunk = items[pos[sid]:pos[sid] + int(rng.integers(1, 6))]
                batch.append((sid, pos[sid], *_batch(chunk)))
                solo[sid].push(*_batch(chunk))
                pos[sid] += len(chunk)
        if batch:
            acks = shard.push(batch)
            assert all(acks[sid]["frames_seen"] == pos[sid] for sid, *_ in batch)
    for sid in streams:
        shard.finish(sid)
        solo[sid].finish()
        _assert_same_state(shard.memory_state(sid), solo[sid].state_dict())
    c = shard.stats()["counters"]
    assert c["encoder_calls"] < c["stream_pushes"] and c["segmenter_calls"] < sum(m.frames_formed for m in solo.values())
    # Questions read the same memory.
    ctx, ref = shard.ask("cam1", "when was it green?"), solo["cam1"].ask("when was it green?")
    assert ctx.tree_best == ref.tree_best and ctx.knowledge == ref.knowledge
    with pytest.raises(ValueError, match="add_stream"):
        shard.ask("nope", "q?")
    with pytest.raises(ValueError, match="one push per stream"):
        shard.push([("cam0", None, *_batch(streams["cam0"][:1]))] * 2)


def test_shard_search_is_exact_top_k():
    streams = {f"s{i}": stream_items(i) for i in range(3)}
    shard, _ = _shard_and_solo(streams)
    shard.push([(sid, 0, *_batch(items)) for sid, items in streams.items()])
    text = shard.text_encoder
    q = torch.nn.functional.normalize(text.encode(["purple scene"])[0], dim=0)
    scored = []
    for sid in streams:
        m = shard._memories[sid]
        scored += [(float(n.embedding @ q), sid, "node", n.node_id) for n in m.long_term.nodes.values()]
        scored += [(float(e.embedding @ q), sid, "event", e.event_id) for e in m.knowledge_base.entries]
    hits = shard.search("purple scene", 6)
    assert len(hits) == 6 and [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    best = sorted((s for s, *_ in scored), reverse=True)[:6]
    assert [h.score for h in hits] == pytest.approx(best, abs=1e-5)
    assert all((round(s, 6), sid, kind, item) in {(round(a, 6), b, c, d) for a, b, c, d in scored}
               for s, sid, kind, item in ((h.score, h.stream_id, h.kind, h.item) for h in hits))


def test_shard_checkpoint_restore_counts_lost_frames(tmp_path):
    """A shard restored from its checkpoint continues exactly; the frames pushed after the checkpoint
    are lost, and the next push of each stream says exactly how many."""
    streams = {f"cam{i}": stream_items(i) for i in range(3)}
    shard, ref = _shard_and_solo(streams, checkpoint_dir=tmp_path)
    shard.push([(sid, 0, *_batch(items[:20])) for sid, items in streams.items()])
    for sid in streams:
        ref[sid].push(*_batch(streams[sid][:20]))
        ref[sid].ask("what colour?")
        shard.ask(sid, "what colour?")
    assert shard.checkpoint()["streams_saved"] == 3
    shard.push([(sid, 20, *_batch(items[20:27])) for sid, items in streams.items()])  # lost in the "crash"
    restored = ShardMemory(CONFIG, PixelEncoder(), HashingTextEncoder(), checkpoint_dir=tmp_path)
    assert restored.restored_streams == 3 and sorted(restored.streams()) == sorted(streams)
    acks = restored.push([(sid, 27, *_batch(items[27:])) for sid, items in streams.items()])
    for sid, items in streams.items():
        assert acks[sid]["frames_missing"] == 7 and acks[sid]["frames_seen"] == len(items)
        ref[sid].push(*_batch(items[27:]), first_index=27)
        _assert_same_state(restored.memory_state(sid), ref[sid].state_dict())
    # A retried push (already seen) is skipped and counted, not formed twice.
    again = restored.push([("cam0", 27, *_batch(streams["cam0"][27:]))])
    assert again["cam0"]["duplicate"] and restored.stats()["counters"]["duplicate_pushes"] == 1


def test_shard_periodic_checkpoints_and_removal(tmp_path):
    shard, _ = _shard_and_solo({"a": None, "b": None}, checkpoint_dir=tmp_path, checkpoint_every_s=0.001)
    items = stream_items(0)
    shard.push([("a", 0, *_batch(items[:5]))])
    time.sleep(0.01)
    shard.push([("a", 5, *_batch(items[5:10]))])
    assert shard.stats()["counters"]["checkpoints"] == 2
    index = json.loads((tmp_path / "shard.json").read_text())["data"]
    assert sorted(index["streams"]) == ["a", "b"]
    moved = shard.remove_stream("a")
    assert moved.frames_seen == 10 and "a" not in json.loads((tmp_path / "shard.json").read_text())["data"]["streams"]
    other = ShardMemory(CONFIG, PixelEncoder(), HashingTextEncoder())
    other.attach_stream("a", moved)
    assert other.memory_state("a")["counters"]["frames_seen"] == 10
    with pytest.raises(ValueError, match="another config"):
        ShardMemory(CONFIG.replace(seed=1), PixelEncoder(), HashingTextEncoder(), checkpoint_dir=tmp_path)


# --------------------------------------------------------------------------
# Consistent hashing
# --------------------------------------------------------------------------
def test_hash_ring_balance_and_minimal_movement():
    keys = [f"camera-{i}" for i in range(4000)]
    ring = HashRing(range(4))
    before = {k: ring.lookup(k) for k in keys}
    loads = np.bincount(list(before.values()), minlength=4)
    assert loads.min() > 0.6 * len(keys) / 4 and loads.max() < 1.4 * len(keys) / 4
    ring.add(4)
    after = {k: ring.lookup(k) for k in keys}
    moved = [k for k in keys if after[k] != before[k]]
    assert all(after[k] == 4 for k in moved) and 0.1 < len(moved) / len(keys) < 0.3
    ring.remove(4)
    assert {k: ring.lookup(k) for k in keys} == before
    with pytest.raises(ValueError, match="already"):
        ring.add(0)
    with pytest.raises(ValueError, match="no nodes"):
        HashRing().lookup("x")


def test_stable_hash_is_the_same_in_another_process():
    import subprocess

    import os

    import streammem.distributed.hashing as hashing

    # Load the module file alone (stdlib only) under another hash seed: no torch import, a fast check.
    code = ("import importlib.util as u, sys; s = u.spec_from_file_location('h', sys.argv[1]); "
            "m = u.module_from_spec(s); s.loader.exec_module(m); print(m.stable_hash('camera-7'))")
    out = subprocess.run([sys.executable, "-c", code, hashing.__file__], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "123"}).stdout
    assert int(out) == stable_hash("camera-7")


# --------------------------------------------------------------------------
# Router on local shards
# --------------------------------------------------------------------------
def test_router_local_push_ask_ask_all_and_streams():
    streams = {f"cam{i}": stream_items(i) for i in range(5)}
    with StreamRouter.local(2, CONFIG, frame_encoder="pixel", text_encoder="hashing", max_in_flight=2) as router:
        placed = {sid: router.add_stream(sid) for sid in streams}
        assert set(placed.values()) == {0, 1} and all(router.shard_of(s) == p for s, p in placed.items())
        for start in range(0, 40, 8):
            router.push_many({sid: _batch(items[start:start + 8]) for sid, items in streams.items()})
        router.flush()
        ref = StreamMemory(CONFIG, PixelEncoder(), HashingTextEncoder())
        ref.push(*_batch(streams["cam2"][:40]))
        got, want = router.ask("cam2", "what is blue?"), ref.ask("what is blue?")
        assert got.tree_best == want.tree_best and got.short_term == want.short_term
        hits = router.ask_all("blue", k=4)
        per_shard = [h for shard in router.shards for h in shard.core.search("blue", 4)]
        assert [h.score for h in hits] == sorted((h.score for h in per_shard), reverse=True)[:4]
        rep = router.report()
        assert rep["totals"]["frames"] == 5 * 40 and rep["totals"]["dropped_frames"] == 0
        assert all(s["frames_seen"] == 40 and s["frames_missing"] == 0 for s in rep["streams"].values())
        router.remove_stream("cam4")
        assert "cam4" not in router.streams
        with pytest.raises(ValueError, match="add_stream"):
            router.push("cam4", *_batch(streams["cam4"][40:42]))


class _SlowEncoder(PixelEncoder):
    def encode(self, frames):
        time.sleep(0.3)
        return super().encode(frames)


def _slow_router(policy):
    router = StreamRouter.local(1, CONFIG, frame_encoder=_SlowEncoder(), text_encoder=HashingTextEncoder(),
                                max_in_flight=1, overflow=policy)
    router.add_stream("cam")
    return router


def test_router_overflow_policies_are_counted():
    items = stream_items(0)
    router = _slow_router("drop")
    assert router.push("cam", *_batch(items[:4])) is True
    assert router.push("cam", *_batch(items[4:7])) is False  # the shard still works on the first
    router.flush()
    assert router.push("cam", *_batch(items[7:9])) is True
    router.flush()
    rep = router.report()
    assert rep["totals"]["dropped_pushes"] == 1 and rep["totals"]["dropped_frames"] == 3
    cam = rep["streams"]["cam"]
    assert cam["dropped_frames"] == cam["frames_missing"] == 3 and cam["lost_to_restarts"] == 0
    assert cam["frames_seen"] == 9 and cam["frames_sent"] == 6
    router.close()

    router = _slow_router("raise")
    router.push("cam", *_batch(items[:4]))
    with pytest.raises(ShardOverloaded, match="in flight"):
        router.push("cam", *_batch(items[4:6]))
    router.flush()
    router.push("cam", *_batch(items[4:6]))  # the rejected frames' positions were given back: no gap
    router.flush()
    rep = router.report()
    assert rep["totals"]["overflows"] == 1 and rep["streams"]["cam"]["frames_missing"] == 0
    router.close()

    router = _slow_router("block")
    router.push("cam", *_batch(items[:4]))
    t0 = time.perf_counter()
    assert router.push("cam", *_batch(items[4:6])) is True
    assert time.perf_counter() - t0 > 0.1
    router.flush()
    rep = router.report()
    assert rep["totals"]["blocked_pushes"] == 1 and rep["shards"][0]["blocked_seconds"] > 0.1
    assert rep["streams"]["cam"]["frames_missing"] == 0 and rep["totals"]["dropped_frames"] == 0
    router.close()


def test_router_raises_a_failed_push_and_the_shard_is_unchanged():
    router = StreamRouter.local(1, CONFIG, frame_encoder="pixel", text_encoder="hashing")
    for sid in ("cam", "other"):
        router.add_stream(sid)
    items = stream_items(0)
    router.push("cam", *_batch(items[:3]))
    router.flush()
    before = router.memory_state("cam")
    # One bad item in a two-stream push: the shard rejects the whole call before changing anything.
    router.push_many({"cam": _batch(items[3:5]), "other": ([0.0], np.zeros((1, 16, 16), np.uint8))})
    with pytest.raises(ValueError, match="frames"):
        router.flush()
    _assert_same_state(router.memory_state("cam"), before)
    router.push("cam", *_batch(items[5:7]))
    router.flush()
    rep = router.report()
    assert rep["totals"]["failed_pushes"] == 1 and rep["totals"]["failed_frames"] == 3
    cam = rep["streams"]["cam"]
    assert cam["failed_frames"] == cam["frames_missing"] == 2 and cam["lost_to_restarts"] == 0
    router.close()


# --------------------------------------------------------------------------
# Archive indexing, local backend
# --------------------------------------------------------------------------
def write_clip(path, i, n=36, size=(24, 32)):
    import cv2

    video = SyntheticVideo((COLOURS * 2)[i:i + 3], [12, 10, 14], size=size, fps=10.0, seed=i, total_frames=n)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10.0, (size[1], size[0]))
    assert writer.isOpened()
    for _, f in video:
        writer.write(np.ascontiguousarray(f[..., ::-1]))
    writer.release()
    return path


ARCHIVE = dict(config=CONFIG, encoder="pixel", text_encoder="hashing", size=None, gate_batch=8)


def test_index_archive_local_manifest_resume_and_failures(tmp_path):
    clips = [write_clip(tmp_path / f"clip{i}.avi", i) for i in range(3)]
    out = tmp_path / "index"
    res = index_archive(clips, out, backend="local", **ARCHIVE)
    ids = [video_id(c) for c in clips]
    assert sorted(res.indexed) == sorted(ids) and res.skipped == [] and res.frames == 3 * 36
    manifest = json.loads((out / "manifest.json").read_text())["data"]
    assert {v["status"] for v in manifest["videos"].values()} == {"done"}
    vm = VideoMemory.load(out / "videos" / ids[1])
    assert vm.source == str(clips[1].resolve()) and vm.summary()["frames_seen"] == 36
    assert vm.ask("what colour was it?").tree_best is not None
    # The loop's memory is the memory of pushing the decoded clip directly.
    from streammem.io.video import VideoSource

    direct = StreamMemory(CONFIG, PixelEncoder(), HashingTextEncoder())
    decoded = list(VideoSource(clips[1]))
    for s in range(0, len(decoded), 8):
        direct.push(*_batch(decoded[s:s + 8]))
    direct.finish()
    _assert_same_state(StreamMemory.load(out / "videos" / ids[1]).state_dict(), direct.state_dict())

    again = index_archive(clips, out, backend="local", **ARCHIVE)
    assert sorted(again.skipped) == sorted(ids) and again.indexed == []
    # A changed video, a crashed worker's leftovers (temp dir, a directory without result.json)
    # and a lost manifest: exactly the affected videos are redone.
    write_clip(clips[0], 5, n=30)
    (out / "videos" / ids[2] / "result.json").unlink()
    (out / "videos" / f".{ids[2]}.deadbeef.tmp").mkdir()
    (out / "manifest.json").unlink()
    third = index_archive(clips, out, backend="local", **ARCHIVE)
    assert sorted(third.indexed) == sorted([ids[0], ids[2]]) and third.skipped == [ids[1]]
    assert third.videos[ids[0]]["frames"] == 30
    assert len(json.loads((out / "manifest.json").read_text())["data"]["videos"]) == 3

    with pytest.raises(ValueError, match="other settings"):
        index_archive(clips, out, backend="local", **{**ARCHIVE, "gate_batch": 4})
    bad = tmp_path / "broken.avi"
    bad.write_bytes(b"not a video" * 50)
    with pytest.raises(RuntimeError, match="broken"):
        index_archive([bad, clips[1]], out, backend="local", **ARCHIVE)
    recorded = index_archive([bad], out, backend="local", on_error="record", **ARCHIVE)
    assert recorded.failed == [video_id(bad)] and "ValueError" in recorded.videos[video_id(bad)]["error"]
    assert json.loads((out / "manifest.json").read_text())["data"]["videos"][video_id(bad)]["status"] == "failed"


def test_index_archive_local_processes_equal_the_loop(tmp_path):
    clips = [write_clip(tmp_path / f"c{i}.avi", i, n=24) for i in range(2)]
    loop = index_archive(clips, tmp_path / "loop", backend="local", **ARCHIVE)
    procs = index_archive(clips, tmp_path / "procs", backend="local", num_workers=2, **ARCHIVE)
    assert procs.num_workers == 2 and sorted(procs.indexed) == sorted(loop.indexed)
    for vid in loop.indexed:
        _assert_same_state(checkpoint.load(tmp_path / "loop" / "videos" / vid / "state.pt", "StreamMemory")[0],
                           checkpoint.load(tmp_path / "procs" / "videos" / vid / "state.pt", "StreamMemory")[0])


# --------------------------------------------------------------------------
# Ray missing, threads
# --------------------------------------------------------------------------
def test_missing_ray_names_the_extra(monkeypatch):
    import streammem.distributed as dist

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match=r"streammem-kernels\[ray\]") as info:
        dist.require_ray()
    assert "\n" not in str(info.value)
    with pytest.raises(ImportError, match="extra"):
        StreamRouter.with_ray(1, CONFIG)
    with pytest.raises(ImportError, match="extra"):
        dist.StreamShard


def test_configure_threads_reaches_the_calling_threads_openmp(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # restored afterwards: configure_threads sets it
    seen = {}

    def worker():
        configure_threads(1)
        seen.update(thread_settings())

    th = threading.Thread(target=worker)
    th.start()
    th.join()
    assert seen["torch_threads"] == 1 and seen["OMP_NUM_THREADS"] == "1"
    assert seen["omp_max_threads"] in (1, None)
    with pytest.raises(ValueError, match="num_threads"):
        configure_threads(0)
