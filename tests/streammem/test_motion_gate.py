"""The motion gate on labelled synthetic clips (tests/support/motion_clips.py): a static camera with
known moving objects.  Ground truth is which frames contain motion; the presets must keep those
(one small object moving on a static camera) and drop a static scene."""
import numpy as np
import pytest

from tests.support.motion_clips import MovingObject, moving_object_clip
from streammem import MemoryConfig
from streammem import PRESETS, MotionGate
from streammem_kernels import motion_magnitude


def _kept(gate, frames, batch=6):
    kept = []
    for start in range(0, len(frames), batch):
        kept.extend(gate.push(frames[start:start + batch])[1])
    return np.array(kept)


@pytest.fixture(scope="module")
def surveillance():
    """A static 640 x 360 camera; one 24 px object (8 px at the gate's 224) moves 4 px/frame
    (1.4 px at 224) during frames 1-9 and stands still during 10-15."""
    return moving_object_clip(16, [MovingObject(24, 4.0, start=0, stop=9)], noise=2.0, seed=7)


def test_base_preset_keeps_a_small_moving_object_and_drops_it_when_still(surveillance):
    clip = surveillance
    assert clip.moving[1:10].all() and not clip.moving[10:].any()  # the labels
    for backend in ("auto", "torch"):
        kept = _kept(MotionGate.from_preset("base", backend=backend), clip.frames)
        assert kept[0] and kept[1:10].all() and not kept[10:].any(), (backend, kept.astype(int))


def test_streamchat_literal_statistic_misses_the_small_object(surveillance):
    """Why the default statistic is "moving": StreamChat's mean over all textured pixels barely moves
    for one small object (0.04 px here)."""
    kept = _kept(MotionGate.from_preset("base", statistic="textured", levels=1), surveillance.frames)
    assert kept[0] and not kept[1:].any(), kept.astype(int)
    literal = motion_magnitude(surveillance.frames, size=224, statistic="textured", levels=1).flow_px
    moving = motion_magnitude(surveillance.frames, size=224).flow_px
    assert float(literal[1:9].max()) < 0.1 < float(moving[1:9].min())


@pytest.mark.parametrize("noise", [1.0, 4.0])
def test_every_preset_drops_a_static_scene(noise):
    frames = moving_object_clip(10, [], noise=noise, seed=3).frames
    for name in PRESETS:
        kept = _kept(MotionGate.from_preset(name), frames)
        assert kept[0] and not kept[1:].any(), (name, noise, kept.astype(int))


def test_presets_order_objects_by_size_and_speed():
    """Slow keeps a slowly moving object that base and fast drop; all keep a large fast one."""
    slow_small = moving_object_clip(6, [MovingObject(48, 1.5)], noise=2.0, seed=11).frames  # 0.5 px at 224
    fast_large = moving_object_clip(6, [MovingObject(96, 16.0)], noise=2.0, seed=12).frames  # 5.6 px at 224
    kept = {name: _kept(MotionGate.from_preset(name), slow_small)[1:] for name in PRESETS}
    assert kept["slow"].all() and not kept["base"].any() and not kept["fast"].any(), kept
    kept = {name: _kept(MotionGate.from_preset(name), fast_large)[1:] for name in PRESETS}
    assert all(k.all() for k in kept.values()), kept


def test_scene_cuts_are_kept(tmp_path):
    """tests/support/clips.py: four 10 s scenes (red, green moving; blue still; yellow moving) decoded at
    2 fps and 320 px as `streammem run` does: the base gate keeps the first frame of every scene
    (a cut is motion everywhere, even into a still scene) and drops the still scene's others."""
    pytest.importorskip("cv2")
    from tests.support.clips import write_clip
    from streammem import VideoSource

    path = write_clip(tmp_path / "scenes.avi")
    frames = np.stack([f for _, f in VideoSource(path, fps=2, size=320)])
    kept = _kept(MotionGate.from_preset("base"), frames, batch=8)
    assert len(kept) == 80 and kept[[0, 20, 40, 60]].all(), np.flatnonzero(kept)
    assert not kept[41:60].any() and kept[:40].all() and kept[60:].all(), np.flatnonzero(~kept)


def test_memory_config_passes_the_statistic_to_the_gate():
    from streammem.stream.memory import StreamMemory  # noqa: F401  (the gate is built there)

    cfg = MemoryConfig(motion_statistic="textured", motion_levels=1)
    assert MemoryConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="motion_statistic"):
        MemoryConfig(motion_statistic="mean")
    with pytest.raises(ValueError, match="motion_levels"):
        MemoryConfig(motion_levels=0)
    with pytest.raises(ValueError, match="statistic"):
        MotionGate(0.3, statistic="median")
