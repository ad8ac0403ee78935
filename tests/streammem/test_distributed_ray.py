"""streammem.distributed on a real local Ray cluster (one per session, 2 CPUs): archive indexing via Ray
gives exactly the loop's memories and resumes, a shard actor answers like a StreamMemory, survives a
SIGKILL losing exactly the frames since its checkpoint (counted), and the router reports what it dropped.

Ray is installed by ``make test`` (requirements-dev.txt); the module is skipped only when it cannot be
imported at all."""
import os
import signal
import time

import numpy as np
import pytest
import torch

from streammem_kernels import checkpoint

try:
    import ray
except ImportError as exc:  # pragma: no cover - make test installs ray
    pytest.skip(f"ray is not importable ({exc}); `make test` installs it from requirements-dev.txt",
                allow_module_level=True)

from streammem import HashingTextEncoder, PixelEncoder, StreamMemory
from streammem.distributed import StreamRouter, index_archive
from test_distributed import ARCHIVE, CONFIG, _batch, stream_items, write_clip
from test_stream_pipeline import _assert_same_state

pytestmark = pytest.mark.usefixtures("ray_cluster", "one_intra_op_thread")

SPECS = dict(frame_encoder={"name": "pixel"}, text_encoder={"name": "hashing"})


@pytest.fixture(scope="session")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=256 * 2**20, log_to_driver=False,
             configure_logging=False)
    yield
    ray.shutdown()


def _states(out, vid):
    return checkpoint.load(out / "videos" / vid / "state.pt", "StreamMemory")[0]


def test_archive_via_ray_equals_the_loop_and_resumes(tmp_path):
    clips = [write_clip(tmp_path / f"clip{i}.avi", i, n=30 + 4 * i) for i in range(3)]
    loop = index_archive(clips, tmp_path / "loop", backend="local", **ARCHIVE)
    par = index_archive(clips, tmp_path / "ray", backend="ray", num_workers=2, **ARCHIVE)
    assert par.num_workers == 2 and len(par.model_load_s) == 2 and sorted(par.indexed) == sorted(loop.indexed)
    for vid in loop.indexed:
        for key in ("frames", "kept", "nodes", "events"):
            assert par.videos[vid][key] == loop.videos[vid][key], key
        _assert_same_state(_states(tmp_path / "ray", vid), _states(tmp_path / "loop", vid))
    # Resumed: nothing to do, no worker started; a changed video is the only one redone.
    again = index_archive(clips, tmp_path / "ray", backend="ray", num_workers=2, **ARCHIVE)
    assert sorted(again.skipped) == sorted(loop.indexed) and again.indexed == [] and again.model_load_s == []
    write_clip(clips[2], 4, n=20)
    third = index_archive(clips, tmp_path / "ray", backend="ray", num_workers=2, **ARCHIVE)
    assert third.indexed == [loop.indexed[2]] and len(third.skipped) == 2 and third.num_workers == 1
    assert third.videos[loop.indexed[2]]["frames"] == 20


def test_shard_answers_and_survives_sigkill(tmp_path):
    streams = {f"cam{i}": stream_items(i) for i in range(2)}
    router = StreamRouter.with_ray(1, CONFIG, checkpoint_dir=tmp_path, checkpoint_every_s=None, max_restarts=2,
                                   max_task_retries=2, **SPECS)
    ref = {sid: StreamMemory(CONFIG, PixelEncoder(), HashingTextEncoder()) for sid in streams}
    for sid in streams:
        router.add_stream(sid)
    for start in range(0, 20, 5):
        router.push_many({sid: _batch(items[start:start + 5]) for sid, items in streams.items()})
        for sid, items in streams.items():
            ref[sid].push(*_batch(items[start:start + 5]))
    router.flush()
    got, want = router.ask("cam1", "what is green?"), ref["cam1"].ask("what is green?")
    assert got.tree_best == want.tree_best and got.knowledge == want.knowledge and got.short_term == want.short_term
    before = router.report()
    assert before["shards"][0]["shard_counters"]["encoder_calls"] < before["shards"][0]["shard_counters"]["stream_pushes"]
    threads = ray.get(router.shards[0].actor.stats.remote())["threads"]
    assert threads["torch_threads"] == 1 and threads["omp_max_threads"] in (1, None)

    router.checkpoint()
    router.push_many({sid: _batch(items[20:26]) for sid, items in streams.items()})  # lost with the process
    router.flush()
    pid = before["shards"][0]["pid"]
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    router.push_many({sid: _batch(items[26:]) for sid, items in streams.items()})  # runs on the restarted actor
    router.flush(timeout=120)
    after = router.report()
    assert after["shards"][0]["restarted"] and after["shards"][0]["pid"] != pid
    assert after["totals"]["lost_to_restarts"] == 2 * 6
    for sid, items in streams.items():
        s = after["streams"][sid]
        assert s["lost_to_restarts"] == s["frames_missing"] == 6 and s["frames_seen"] == len(items)
        ref[sid].push(*_batch(items[26:]), first_index=26)
        _assert_same_state(router.memory_state(sid), ref[sid].state_dict())
    assert router.ask("cam0", "what colour now?").stream_time == pytest.approx(streams["cam0"][-1][0])
    hits = router.ask_all("red", k=3)
    assert len(hits) == 3 and hits[0].score >= hits[-1].score


def test_router_overflow_is_reported(tmp_path):
    router = StreamRouter.with_ray(1, CONFIG, checkpoint_dir=None, max_in_flight=1, overflow="drop", **SPECS)
    router.add_stream("cam")
    rng = np.random.default_rng(0)
    heavy = rng.integers(0, 255, size=(96, 96, 96, 3), dtype=np.uint8)  # ~0.1 s of gating on the shard
    times = np.arange(96) / 10.0
    assert router.push("cam", times, heavy) is True
    assert router.push("cam", times[-1] + 0.1 + np.arange(4) / 10.0, heavy[:4]) is False
    router.flush(timeout=120)
    assert router.push("cam", times[-1] + 1.0 + np.arange(2) / 10.0, heavy[:2]) is True
    router.flush(timeout=120)
    rep = router.report()
    assert rep["totals"]["dropped_pushes"] == 1 and rep["totals"]["dropped_frames"] == 4
    cam = rep["streams"]["cam"]
    assert cam["dropped_frames"] == cam["frames_missing"] == 4 and cam["lost_to_restarts"] == 0
    assert cam["frames_seen"] == 102 and cam["frames_sent"] == 98


def test_a_shard_killed_before_its_first_checkpoint_keeps_its_streams_and_counts_the_lost_frames(tmp_path):
    """A shard restarted before its first checkpoint came back with no streams (lost_to_restarts 0,
    failed_frames 20, every later push raised "not on this shard").  Its stream list is durable before
    a stream is acknowledged: after the kill, every stream is there, and the frames it cannot replay are
    counted in lost_to_restarts exactly."""
    streams = {f"cam{i}": stream_items(i) for i in range(2)}
    router = StreamRouter.with_ray(1, CONFIG, checkpoint_dir=tmp_path, checkpoint_every_s=None, max_restarts=2,
                                   max_task_retries=2, **SPECS)
    for sid in streams:
        router.add_stream(sid)
    router.push_many({sid: _batch(items[:20]) for sid, items in streams.items()})
    router.flush()
    pid = router.report()["shards"][0]["pid"]
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    router.push_many({sid: _batch(items[20:]) for sid, items in streams.items()})
    router.flush(timeout=120)
    after = router.report()
    assert after["shards"][0]["restarted"] and after["totals"]["lost_to_restarts"] == 2 * 20
    for sid, items in streams.items():
        s = after["streams"][sid]
        assert s["lost_to_restarts"] == s["frames_missing"] == 20 and s["failed_frames"] == 0
        assert s["frames_seen"] == len(items)
    assert router.ask("cam0", "what colour now?").stream_time == pytest.approx(streams["cam0"][-1][0])
