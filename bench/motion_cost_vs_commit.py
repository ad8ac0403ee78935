"""Motion cost per pair against an earlier commit's build, each build in its own processes.

Issue 14 asks for the default pyramid at "no more than 1.5x today's cost per pair", today being
the single-scale kernel of the day the issue was filed (7a1fad3, the parent of the merge that
started the issue's work).  Since then the single-scale kernel itself got faster (the pyramid's
C++ passes share its row code), so this compares both against that build as well as against
today's single scale.

Run (about two minutes, most of it building the earlier commit's C++ modules once):

    OMP_NUM_THREADS=1 .venv/bin/python bench/motion_cost_vs_commit.py [--base 7a1fad3] [--runs 6]

It checks the base commit out into a temporary git worktree, builds its CPU modules there
(``STREAMMEM_SKIP_CUDA=1``), then alternates one process per build ``--runs`` times, in both
orders, so that every case sees the same machine load.  Two builds of a module with the same
name must not share a process: Python would run the first one loaded for both.  Each process
times the same 15 pairs of bikes.mp4 (gray, 224x224 and 224x126), 21 interleaved rounds, CPU
time (``time.process_time``) per pair in ms, one OpenMP / torch / OpenCV thread.

Cases: the public function (``motion_magnitude(frames, backend="cpp")`` on uint8 frames, as a
user calls it) and the C++ kernel alone (``lk_flow``: float32 [0, 1] frames for the earlier
build, whose kernel took only those; uint8 frames for today's).  The worktree is removed at the
end.
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SIZES = ((224, 224), (126, 224))  # (h, w)
ROUNDS = 21


def child(tree: str) -> dict:
    """Time the cases of the build in ``tree`` (run in a process of its own)."""
    sys.path[:0] = [tree, os.path.join(tree, "python")]
    import cv2
    import numpy as np
    import torch

    from streammem_kernels import motion, motion_magnitude
    from streammem_kernels.runtime.dispatch import load_native
    from streammem_kernels.samples import read_video, sample_video_path

    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    mod, why = load_native("cpu", "motion")
    if mod is None or not os.path.realpath(mod.__file__).startswith(os.path.realpath(tree)):
        raise SystemExit(f"{tree}: its C++ motion module did not load ({why or mod.__file__})")
    pyramid_api = "levels" in inspect.signature(motion_magnitude).parameters
    rgb = read_video(sample_video_path("bikes.mp4"), max_frames=16)
    out = {"pyramid_api": pyramid_api}
    for h, w in SIZES:
        gray = np.stack([cv2.resize(cv2.cvtColor(f, cv2.COLOR_RGB2GRAY), (w, h), interpolation=cv2.INTER_AREA)
                         for f in rgb])
        frames = torch.from_numpy(gray)
        if pyramid_api:
            levels = motion._resolve_levels("auto", (h, w), 5)
            single, default, textured = (motion._cpp_lk_args(5, 1e-5, 1, "textured"),
                                         motion._cpp_lk_args(5, 1e-5, levels, "moving"),
                                         motion._cpp_lk_args(5, 1e-5, levels, "textured"))
            cases = {
                "public, single scale (levels=1, textured)":
                    lambda: motion_magnitude(frames, levels=1, statistic="textured", backend="cpp"),
                "public, default (pyramid, moving)": lambda: motion_magnitude(frames, backend="cpp"),
                "public, pyramid, textured": lambda: motion_magnitude(frames, statistic="textured", backend="cpp"),
                "kernel, single scale": lambda: mod.lk_flow(gray, *single),
                "kernel, default (pyramid, moving)": lambda: mod.lk_flow(gray, *default),
                "kernel, pyramid, textured": lambda: mod.lk_flow(gray, *textured),
            }
        else:
            unit = np.ascontiguousarray(gray.astype(np.float32) / 255.0)
            cases = {"public, single scale (levels=1, textured)": lambda: motion_magnitude(frames, backend="cpp"),
                     "kernel, single scale": lambda: mod.lk_flow(unit, 5, 1e-5)}
        times = {name: [] for name in cases}
        for fn in cases.values():
            fn()  # warm up
        pairs = len(gray) - 1
        for _ in range(ROUNDS):
            for name, fn in cases.items():
                start = time.process_time()
                fn()
                times[name].append((time.process_time() - start) / pairs * 1e3)
        out[f"{w} x {h}"] = times
    return out


def build(base: str, where: str) -> None:
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "-q", "--detach", where, base], check=True)
    env = dict(os.environ, STREAMMEM_SKIP_CUDA="1")
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace", "-j", "2"], cwd=where, env=env,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def table(runs: dict[str, list[dict]], base: str) -> str:
    import numpy as np

    def pooled(which, size, case):
        return np.concatenate([r[size][case] for r in runs[which] if case in r[size]])

    lines = []
    for h, w in SIZES:
        size = f"{w} x {h}"
        ref = {kind: {which: float(np.median(pooled(which, size, f"{kind}, single scale" if kind == "kernel"
                                                      else "public, single scale (levels=1, textured)")))
                      for which in ("base", "today")} for kind in ("public", "kernel")}
        lines += [f"{size}, 15 pairs of bikes.mp4, CPU ms per pair:",
                  f"| build | case | p20 | p50 | p80 | x today's single scale | x {base}'s single scale |",
                  "|---|---|---|---|---|---|---|"]
        for which, label in (("base", base), ("today", "today")):
            for case in runs[which][0][size]:
                v = pooled(which, size, case)
                p20, p50, p80 = np.percentile(v, [20, 50, 80])
                kind = case.split(",")[0]
                lines.append(f"| {label} | {case} | {p20:.3f} | {p50:.3f} | {p80:.3f} | "
                             f"{p50 / ref[kind]['today']:.2f} | {p50 / ref[kind]['base']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="7a1fad3", help="the earlier commit (default: the day issue 14 was filed)")
    ap.add_argument("--runs", type=int, default=6, help="processes per build and order (default 6)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    if os.environ.get("OMP_NUM_THREADS") != "1":
        print("note: run with OMP_NUM_THREADS=1 for the single-threaded figures", file=sys.stderr)
    runs: dict[str, list[dict]] = {"base": [], "today": []}
    with tempfile.TemporaryDirectory(prefix="streammem-base-") as tmp:
        where = os.path.join(tmp, "tree")
        try:
            print(f"building {args.base}'s CPU modules in {where} ...", file=sys.stderr, flush=True)
            build(args.base, where)
            load0 = os.getloadavg()
            for i in range(args.runs):
                order = (("base", where), ("today", ROOT)) if i % 2 == 0 else (("today", ROOT), ("base", where))
                for which, tree in order:
                    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", tree], check=True,
                                         capture_output=True, text=True).stdout
                    runs[which].append(json.loads(out))
                print(f"run {i + 1}/{args.runs}", file=sys.stderr, flush=True)
            load1 = os.getloadavg()
        finally:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", where], check=False)
    print(table(runs, args.base))
    print(f"load average {tuple(round(x, 2) for x in load0)} at start, {tuple(round(x, 2) for x in load1)} at end; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


if __name__ == "__main__":
    main()
