"""bench/report.py and bench/run.py on small synthetic pytest-benchmark documents (no benchmark is run)."""
from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import time

import pytest

from bench import report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STARTED = "2026-11-23T12:00:00+00:00"  # the run's start as run.py records it; the page shows its day
GPU_STARTED = "2026-11-27T10:00:00+00:00"
# What the page used to hold: a dated, branch-named, hand-written section (built from parts: no such
# text sits in the source itself).
HAND_WRITTEN = f"""# Benchmark results

A hand-written intro.

## Motion gate, {GPU_STARTED[:10]} 22:39 UTC (branch {"i" + "14e"}), load 5.6

| provider | ms |
|---|---|
| ours | 1.0 |
"""


def _bench(name, group, median, suite="demo", p20=None, p80=None, **extra_info):
    stats = {"mean": median, "median": median, "min": median, "max": median, "stddev": 0.0, "rounds": 3}
    if p20 is not None:
        stats.update(p20=p20, p80=p80)
    return {"name": name, "fullname": f"bench/bench_{suite}.py::{name}", "group": group, "params": None,
            "suite": suite, "extra_info": extra_info, "stats": stats}


def _doc(benchmarks, machine="cpu2c-test", mode="full"):
    return {"machine_info": {}, "benchmarks": benchmarks,
            "streammem": {"machine": machine, "kind": "cpu", "mode": mode, "cpu_model": "Test CPU", "cores": 2,
                          "libraries": {"torch": "2.13.0"}, "command": "python -m bench.run",
                          "started_utc": STARTED, "load_average_before": "0.5 / 0.4 / 0.3",
                          "load_average_after": "0.9 / 0.5 / 0.3",
                          "suites": [{"suite": "motion", "status": "ok", "seconds": 12.0,
                                      "load_average_before": "0.5 / 0.4 / 0.3",
                                      "load_average_after": "0.6 / 0.4 / 0.3"}]}}


def _write(directory, doc, stamp):
    path = directory / f"{doc['streammem']['machine']}-{doc['streammem']['mode']}-{stamp}.json"
    path.write_text(json.dumps(doc))
    return path


def _motion_doc(ours_cpp=0.010, scale=1.0, mode="full"):
    return _doc([
        _bench("test_ours_cpp[224px]", "motion-224", ours_cpp * scale, "motion", pairs=50, provider="ours-cpp"),
        _bench("test_ours_torch[224px]", "motion-224", 0.040 * scale, "motion", pairs=50,
               provider="ours-torch-reference"),
        _bench("test_opencv_dis[224px]", "motion-224", 0.020 * scale, "motion", pairs=50, provider="opencv-dis"),
        _bench("test_opencv_farneback[224px]", "motion-224", 0.030 * scale, "motion", pairs=50,
               provider="opencv-farneback"),
        _bench("test_ours_cpp[336px]", "motion-336", 0.020 * scale, "motion", pairs=50, provider="ours-cpp"),
        _bench("test_opencv_dis[336px]", "motion-336", 0.070 * scale, "motion", pairs=50, provider="opencv-dis"),
        _bench("test_tree_greedy", "tree-N1000", 0.002 * scale, "tree", method="tree_search greedy", Q=64,
               recall10=0.91),
        _bench("test_faiss_flat", "tree-N1000", 0.004 * scale, "tree", method="faiss IndexFlatIP", Q=64,
               recall10=1.0),
    ], mode=mode)


def _row(table_lines, provider):
    """The cells of ``provider``'s table row (bold or not)."""
    line = next(line for line in table_lines if f"`{provider}`" in line.split("|")[2])
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _record(tmp_path, docs, gpu=None):
    """A baseline folder holding ``docs`` (and a GPU folder holding ``gpu``); report.main's arguments for it."""
    baseline, gpu_dir = tmp_path / "baseline", tmp_path / "gpu"
    baseline.mkdir(exist_ok=True)
    gpu_dir.mkdir(exist_ok=True)
    for doc in docs:
        meta = doc["streammem"]
        (baseline / f"{meta['machine']}-{meta['mode']}.json").write_text(json.dumps(report.strip_for_baseline(doc)))
    if gpu is not None:
        bench, summary = gpu
        (gpu_dir / "bench.json").write_text(json.dumps(bench))
        (gpu_dir / "summary.json").write_text(json.dumps(summary))
    return ["--baseline-dir", str(baseline), "--gpu-dir", str(gpu_dir), "--results-md", str(tmp_path / "RESULTS.md"),
            "--plots-dir", str(tmp_path / "plots")]


# --------------------------------------------------------------------------
# The tables
# --------------------------------------------------------------------------
def test_suite_table_puts_ours_and_the_peers_side_by_side_with_the_ratio_to_the_best_peer():
    rows = [b for b in _motion_doc()["benchmarks"] if b["suite"] == "motion"]
    table = report.suite_table(rows)
    assert table[0] == "| case | provider | p20 | p50 | p80 | × best peer | throughput |"
    assert _row(table, "ours-cpp")[2:5] == ["-", "10 ms", "-"]  # no samples, no quartiles: no band to show
    # one case's rows together, fastest first; the case is named on its first row only
    cases = [line.split("|")[1].strip() for line in table[2:]]
    assert cases == ["`motion-224`", "", "", "", "`motion-336`", ""]
    assert _row(table, "ours-cpp")[1] == "**`ours-cpp`**" and _row(table, "opencv-dis")[1] == "`opencv-dis`"
    # the ratio is to the fastest peer (opencv-dis, 20 ms), not to the slower one nor to a row of ours
    assert _row(table, "ours-cpp")[5] == "0.50" and _row(table, "opencv-dis")[5] == "1.00"
    assert _row(table, "opencv-farneback")[5] == "1.50" and _row(table, "ours-torch-reference")[5] == "2.00"
    assert _row(table, "ours-cpp")[6] == "5 k pairs/s"


def test_suite_table_shows_p20_p50_p80_and_quality_and_no_ratio_without_a_peer():
    rows = [_bench("test_ours_a", "g", 0.010, p20=0.0095, p80=0.0105, Q=64, provider="ours-a", recall10=0.91),
            _bench("test_ours_b", "g", 0.030, p20=0.029, p80=0.031, Q=64, provider="ours-b", recall10=1.0)]
    table = report.suite_table(rows)
    assert table[0] == "| case | provider | p20 | p50 | p80 | × best peer | throughput | recall@10 |"
    assert _row(table, "ours-a") == ["`g`", "**`ours-a`**", "9.5 ms", "10 ms", "10.5 ms", "-", "6.4 k queries/s",
                                     "0.91"]


def test_rows_without_p20_are_marked_when_others_have_it():
    rows = [_bench("test_ours_a", "g", 0.010, p20=0.009, p80=0.011, provider="ours-a"),
            _bench("test_peer", "g", 0.020, provider="peer")]
    rows[1]["stats"].update(q1=0.019, q3=0.021)
    table = report.suite_table(rows)
    assert table[0].startswith("| case | provider | p20 | p50 | p80 |")
    assert _row(table, "peer")[2:5] == ["19 ms *", "20 ms", "21 ms *"]
    assert table[-1].startswith("\\* p25-p75 instead of p20-p80")


def test_provider_named_after_a_public_function_is_ours():
    tree = _bench("test_tree_greedy", "g", 0.002, method="tree_search greedy")
    faiss = _bench("test_faiss_flat", "g", 0.001, method="faiss IndexFlatIP")
    assert report.is_ours(tree) and not report.is_ours(faiss)


def test_parametrized_case_without_group_is_grouped_by_its_parameters():
    bench = _bench("test_logprobs_time[token-V49152-T128-ours[cpp]]", None, 0.01, "logprobs")
    del bench["suite"]
    bench["params"] = {"kind": "token", "vocab": 49152, "rows": 128, "provider": "ours[cpp]"}
    assert report.group_of(bench) == "logprobs token-V49152-T128"
    assert report.provider_of(bench) == "ours[cpp]" and report.is_ours(bench)
    assert report.units_of(bench) == (128.0, "tokens")
    assert report.size_of(bench)[0] == 49152


# --------------------------------------------------------------------------
# The record: generated from the committed JSON alone
# --------------------------------------------------------------------------
def test_record_is_a_function_of_the_committed_json(tmp_path):
    args = _record(tmp_path, [_motion_doc()])
    md = tmp_path / "RESULTS.md"
    md.write_text(HAND_WRITTEN)
    assert report.main(args + ["--no-plots"]) == 0
    first = md.read_text()
    # nothing of the hand-written page survives
    assert "hand-written intro" not in first and "Motion gate" not in first and "| ours | 1.0 |" not in first
    time.sleep(0.01)
    assert report.main(args + ["--no-plots"]) == 0
    assert md.read_text() == first  # same JSON, same bytes: no clock, no file order
    assert first.startswith(report.RECORD_TITLE + "\n")
    assert (f"| `cpu2c-test` | Test CPU | 2 | none | {STARTED[:10]} | 0.5 / 0.4 / 0.3 before the run, "
            "0.9 / 0.5 / 0.3 after |") in first
    assert "### motion" in first and "### tree" in first
    assert "`python -m bench.run --only motion --save-baseline` (ok, 12 s wall; load average 0.5 / 0.4 / 0.3" in first
    assert "](plots/cpu2c-test-motion.png)" in first
    # each figure once: one row per benchmark
    assert first.count("`opencv-farneback`") == 1
    # a new measurement in the JSON is the only way to change the page
    changed = _motion_doc(ours_cpp=0.012)
    _record(tmp_path, [changed])
    assert report.main(args + ["--no-plots"]) == 0
    assert md.read_text() != first and "12 ms" in md.read_text()


def test_quick_baselines_are_not_part_of_the_record(tmp_path):
    args = _record(tmp_path, [_motion_doc(), _motion_doc(scale=5.0, mode="quick")])
    assert report.main(args + ["--no-plots"]) == 0
    page = (tmp_path / "RESULTS.md").read_text()
    assert page.count("## CPU: `cpu2c-test`") == 1 and "100 ms" not in page  # the quick run's 5x rows


def test_plots_are_drawn_as_planned_and_stale_ones_removed(tmp_path):
    args = _record(tmp_path, [_motion_doc()])
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "cpu-gone.png").write_bytes(b"a plot no JSON draws any more")
    assert report.main(args) == 0
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["cpu2c-test-motion.png"]


def test_gpu_section_only_when_the_one_shot_json_exists(tmp_path):
    args = _record(tmp_path, [_motion_doc()])
    assert report.main(args + ["--no-plots"]) == 0
    assert "## GPU" not in (tmp_path / "RESULTS.md").read_text()
    rows = [{"suite": "tree", "group": "topk-N1e6", "provider": "cosine_topk[cuda]", "kind": "ours",
             "median_s": 0.001, "p20_s": 0.0009, "p80_s": 0.0011, "gbps": 1500.0, "frac_bandwidth": 0.5,
             "tflops": 1.0, "status": "ok"},
            {"suite": "tree", "group": "topk-N1e6", "provider": "torch.topk(q @ k.T)", "kind": "peer",
             "median_s": 0.002, "p20_s": 0.0019, "p80_s": 0.0021, "status": "ok"},
            {"suite": "tree", "group": "topk-N1e6", "provider": "faiss GpuIndexFlatIP", "kind": "peer",
             "status": "skipped: faiss has no GPU support"}]
    summary = {"started_utc": GPU_STARTED, "device": {"gpu": "NVIDIA H100", "driver": "550",
                                                                       "compute_cap": "9.0"}, "host": {"cores": 16}}
    args = _record(tmp_path, [_motion_doc()], gpu=({"peaks": {"copy_gbps": 3000.0}, "rows": rows,
                                                    "versions": {"torch": "2.13.0"}}, summary))
    assert report.main(args + ["--no-plots"]) == 0
    page = (tmp_path / "RESULTS.md").read_text()
    gpu = page.split("## GPU: NVIDIA H100")[1]
    assert page.index("## CPU") < page.index("## GPU")
    assert "| NVIDIA H100 | 550 | 9.0 |" in gpu and GPU_STARTED[:10] in gpu and "copy 3000 GB/s" in gpu
    assert "| `topk-N1e6` | **`cosine_topk[cuda]`** | 900 µs | 1 ms | 1.1 ms | 0.50 | 1500.0 | 50% |" in gpu
    assert "| skipped: faiss has no GPU support |" in gpu


def _quality_doc(suite="abstention"):
    """A saved answer-quality document as bench/quality.py's ``save`` writes it."""
    return {"suite": suite, "what": "calibrated abstention", "command": f"python -m bench.quality run {suite}",
            "runs": "nice -n 10 python -m bench.bench_abstention --no-clips", "machine": "cpu2c-test",
            "cpu_model": "Test CPU", "cores": 2, "started_utc": STARTED, "seconds": 612.4,
            "load_average_before": "1.0 / 0.9 / 0.8", "load_average_after": "2.1 / 1.5 / 1.0",
            "versions": {"torch": "2.13.0", "numpy": "2.4.6"}, "about": "Planted questions, fixed seeds.",
            "tables": [{"title": "Calibrated abstention, evaluation seeds",
                        "columns": [["system", "system", "text"], ["answerable", "answerable", "int"],
                                    ["false_answers", "false answers", "share"], ["after", "accuracy after", "share"],
                                    ["threshold", "threshold", "rate"], ["p50", "recall p50", "ms"]],
                        "rows": [{"system": "prostream", "answerable": 1264, "false_answers": [0, 264],
                                  "after": [254, 264], "threshold": 0.52031, "p50": 1.134},
                                 {"system": "memverse", "answerable": 84, "false_answers": [3, 84],
                                  "after": [0, 0], "threshold": 0.4}]}]}


def test_answer_quality_section_renders_the_saved_counts_with_their_command_and_load(tmp_path):
    args = _record(tmp_path, [_motion_doc()])
    assert report.main(args + ["--no-plots"]) == 0
    assert report.QUALITY_TITLE not in (tmp_path / "RESULTS.md").read_text()  # no quality JSON, no section
    (tmp_path / "baseline" / "quality-abstention.json").write_text(json.dumps(_quality_doc()))
    (tmp_path / "baseline" / "quality-empty.json").write_text(json.dumps({"suite": "empty", "tables": []}))
    assert report.main(args + ["--no-plots"]) == 0
    page = (tmp_path / "RESULTS.md").read_text()
    section = page.split(report.QUALITY_TITLE + "\n")[1]
    assert page.index("## CPU") < page.index(report.QUALITY_TITLE) and "### empty" not in section
    assert ("`python -m bench.quality run abstention` (runs `nice -n 10 python -m bench.bench_abstention --no-clips`): "
            f"`cpu2c-test` (Test CPU, 2 cores), {STARTED[:10]}, 612 s wall; load average 1.0 / 0.9 / 0.8 before, "
            "2.1 / 1.5 / 1.0 after. Versions: numpy 2.4.6, torch 2.13.0.") in section
    lines = section.splitlines()
    head = lines.index("| system | answerable | false answers | accuracy after | threshold | recall p50 |")
    assert lines[head + 2:head + 4] == [
        "| prostream | 1,264 | 0.000 (0 / 264) | 0.962 (254 / 264) | 0.520 | 1.13 ms |",
        "| memverse | 84 | 0.036 (3 / 84) | - (0 / 0) | 0.400 | - |"]
    # the quality JSON alone makes a record, and the same JSON gives the same bytes
    for path in (tmp_path / "baseline").glob("*-full.json"):
        path.unlink()
    assert report.main(args + ["--no-plots"]) == 0
    first = (tmp_path / "RESULTS.md").read_text()
    assert "## CPU" not in first and "| prostream | 1,264 |" in first
    assert report.main(args + ["--no-plots"]) == 0 and (tmp_path / "RESULTS.md").read_text() == first


def test_quality_save_writes_what_the_report_reads_and_refuses_rows_without_columns(tmp_path):
    from bench import quality

    table = {"title": "t", "columns": [quality.column("system", "system"), quality.column("f", "F1", "rate")],
             "rows": [{"system": "ours", "f": 0.9234}]}
    path = quality.save("scene_cuts", [table], about="labelled cuts", started=time.time() - 5,
                        load_before="0.1 / 0.1 / 0.1", baseline_dir=str(tmp_path))
    doc = report.quality_records(str(tmp_path))[0]
    assert path.endswith("quality-scene_cuts.json") and doc["command"] == "python -m bench.quality run scene_cuts"
    assert doc["runs"].startswith("nice -n 10 python -m pytest bench/bench_scene_cuts.py")
    assert {"torch", "scenedetect"} <= set(doc["versions"])  # the peer's version beside ours
    assert "| ours | 0.923 |" in "\n".join(report.render_quality([doc]))
    with pytest.raises(ValueError, match="tables"):
        quality.save("scene_cuts", [dict(table, rows=[{"system": "ours", "recall": 1.0}])], about="",
                     started=0.0, load_before="", baseline_dir=str(tmp_path))
    with pytest.raises(ValueError, match="suite"):
        quality.save("nope", [table], about="", started=0.0, load_before="", baseline_dir=str(tmp_path))
    with pytest.raises(ValueError, match="fmt"):
        quality.column("x", "x", "percent")


def test_a_saved_document_with_a_section_renders_under_it_not_under_answer_quality():
    from bench import quality

    doc = dict(_quality_doc("torch_vs_cpp"), section=quality.SECTIONS["torch_vs_cpp"], what="torch beside C++",
               tables=[{"title": "1 thread(s)", "columns": [["case", "op (input)", "text"],
                                                            ["ratio", "torch / C++ (p50)", "text"]],
                        "rows": [{"case": "cosine_topk Q=1", "ratio": "6.0"}]}])
    lines = report.render_quality([_quality_doc(), doc])
    answers, backends = lines.index(report.QUALITY_TITLE), lines.index(quality.SECTIONS["torch_vs_cpp"])
    assert answers < lines.index("| prostream | 1,264 | 0.000 (0 / 264) | 0.962 (254 / 264) | 0.520 | 1.13 ms |") \
        < backends < lines.index("| cosine_topk Q=1 | 6.0 |")
    assert report.QUALITY_TITLE not in report.render_quality([doc])  # a section of its own only


def test_the_committed_record_is_exactly_what_the_committed_json_generates():
    """bench/RESULTS.md holds no hand-written line, and bench/plots/ exactly the plots it links."""
    runs = report.record_runs(report.BASELINE_DIR)
    page, plans = report.page_and_plots(runs, report.gpu_oneshot(report.GPU_DIR), "plots",
                                        quality=report.quality_records(report.BASELINE_DIR))
    with open(report.OUTPUTS["full"][0]) as fh:
        committed = fh.read()
    assert committed == page, "bench/RESULTS.md is generated: run `python -m bench.report` (make record)"
    if os.path.isdir(report.OUTPUTS["full"][1]):  # an sdist carries the page without its plots
        assert sorted(name for plan in plans for _, name, _, _ in plan) == \
            sorted(os.listdir(report.OUTPUTS["full"][1]))
    # no dates but the headers', no branch names, issue numbers or times of day
    headers = {line for line in committed.splitlines() if line.startswith("| `") and "load average" not in line}
    body = "\n".join(line for line in committed.splitlines() if line not in headers)
    assert not re.search(r"\b\d{1,2}:\d{2}\b|UTC|\bbranch\b|\bissue\b|\bi1\d[a-z]\b", body, re.I)


def test_no_one_off_result_pages_are_committed():
    """Figures live in the JSON behind the record; a suite's own summary page stays local (git-ignored)."""
    tracked = subprocess.run(["git", "-C", ROOT, "ls-files", "bench/results"], capture_output=True, text=True).stdout
    if not tracked and not os.path.isdir(os.path.join(ROOT, ".git")) and not os.path.isfile(os.path.join(ROOT, ".git")):
        pytest.skip("not a git checkout")
    assert [p for p in tracked.split() if not p.endswith((".json", ".gitkeep"))] == []


# --------------------------------------------------------------------------
# Regressions: rows of ours only, and only when the noise bands separate
# --------------------------------------------------------------------------
def test_regression_only_for_our_rows_and_only_when_the_bands_do_not_overlap():
    before = _doc([_bench("test_ours_cpp", "g", 0.010, p20=0.0095, p80=0.0105, provider="ours-cpp"),
                   _bench("test_ours_torch", "g", 0.040, p20=0.030, p80=0.050, provider="ours-torch"),
                   _bench("test_ours_tight", "g", 0.0100, p20=0.0099, p80=0.0101, provider="ours-tight"),
                   _bench("test_opencv_dis", "g", 0.030, p20=0.029, p80=0.031, provider="opencv-dis")])
    after = _doc([
        # +30 % with separate bands: flagged
        _bench("test_ours_cpp", "g", 0.013, p20=0.0125, p80=0.0135, provider="ours-cpp"),
        # +30 % median, but the band starts inside the old one (a noisy row on a loaded machine): not flagged
        _bench("test_ours_torch", "g", 0.052, p20=0.045, p80=0.060, provider="ours-torch"),
        # +3 % only, but the bands separate: flagged (the bands are the rule, not a percentage)
        _bench("test_ours_tight", "g", 0.0103, p20=0.0102, p80=0.0104, provider="ours-tight"),
        # a peer 100x slower under load: measured, never ours to regress
        _bench("test_opencv_dis", "g", 3.0, p20=2.9, p80=3.1, provider="opencv-dis")])
    assert report.regression_lines(after, before) == [
        "REGRESSION: `bench/bench_demo.py::test_ours_cpp` median 13 ms vs 10 ms "
        "(+30 %; p20-p80 12.5 ms-13.5 ms vs 9.5 ms-10.5 ms)",
        "REGRESSION: `bench/bench_demo.py::test_ours_tight` median 10.3 ms vs 10 ms "
        "(+3 %; p20-p80 10.2 ms-10.4 ms vs 9.9 ms-10.1 ms)"]
    # faster, or no earlier row: nothing to say
    assert report.regression_lines(before, after) == []
    assert report.regression_lines(after, None) == []


def test_older_baselines_without_p20_are_judged_on_their_quartiles():
    old = _bench("test_ours_cpp", "g", 0.010, provider="ours-cpp")
    old["stats"].update(q1=0.009, q3=0.011)
    new = _bench("test_ours_cpp", "g", 0.0115, p20=0.0112, p80=0.0118, provider="ours-cpp")
    assert report.regression_lines(_doc([new]), _doc([old])) == [
        "REGRESSION: `bench/bench_demo.py::test_ours_cpp` median 11.5 ms vs 10 ms "
        "(+15 %; p20-p80 vs p25-p75 11.2 ms-11.8 ms vs 9 ms-11 ms)"]


def test_percentiles_are_added_from_samples_and_kept_in_the_baseline():
    doc = _doc([_bench("test_ours_x", "g", 5.5, provider="ours")])
    doc["benchmarks"][0]["stats"]["data"] = [float(v) for v in range(10, 0, -1)]  # 1..10, unsorted
    report.add_percentiles(doc)
    stats = doc["benchmarks"][0]["stats"]
    assert stats["p20"] == pytest.approx(2.8) and stats["p80"] == pytest.approx(8.2)  # numpy's linear rule
    slim = report.strip_for_baseline(doc)["benchmarks"][0]["stats"]
    assert "data" not in slim and slim["p20"] == pytest.approx(2.8) and slim["p80"] == pytest.approx(8.2)
    assert "data" in doc["benchmarks"][0]["stats"]  # the caller's document is left alone
    assert report.spread(slim) == (pytest.approx(2.8), pytest.approx(8.2), "p20-p80")
    assert report.spread({"median": 1.0, "q1": 0.9, "q3": 1.2}) == (0.9, 1.2, "p25-p75")


def _git(cwd, *args):
    subprocess.run(["git", "-C", str(cwd), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True)


def test_regressions_are_judged_against_the_committed_baseline_not_the_working_tree(tmp_path):
    """The baseline is read at git HEAD: a run saved with --save-baseline is not compared with itself."""
    repo = tmp_path / "repo"
    baseline_dir = repo / "bench" / "baseline"
    baseline_dir.mkdir(parents=True)
    _git(repo, "init", "-q")
    (baseline_dir / "cpu2c-test-quick.json").write_text(json.dumps(_motion_doc(ours_cpp=0.010)))
    assert report.committed_baseline(str(baseline_dir), "cpu2c-test", "quick") is None  # not committed yet
    _git(repo, "add", "bench/baseline/cpu2c-test-quick.json")
    _git(repo, "commit", "-q", "-m", "baseline")
    (baseline_dir / "cpu2c-test-quick.json").write_text(json.dumps(_motion_doc(ours_cpp=0.020)))
    committed = report.committed_baseline(str(baseline_dir), "cpu2c-test", "quick")
    assert committed["benchmarks"][0]["stats"]["median"] == 0.010
    # Outside git the file on disk is the baseline.
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "cpu2c-test-quick.json").write_text(json.dumps(_motion_doc()))
    assert report.committed_baseline(str(plain), "cpu2c-test", "quick")["benchmarks"][0]["name"] == \
        "test_ours_cpp[224px]"


def test_explicit_scale_axis_per_call_time_and_memory_curves(tmp_path):
    benches = []
    for b, ours, faiss in ((16, 0.002, 0.004), (64, 0.005, 0.013), (256, 0.019, 0.054)):
        for name, t in (("test_scale_ours", ours), ("test_scale_faiss", faiss)):
            benches.append(_bench(f"{name}[B{b}]", f"kmeans-vs-B-{b}", t, provider=name[11:], scale="B", B=b, N=256,
                                  problems=b, plot_per="call"))
    for vocab, ours_mem, peer_mem in ((8192, 1 << 20, 26 << 20), (151936, 0, 311 << 20)):
        for name, mem in (("ours", ours_mem), ("peer", peer_mem)):
            benches.append(_bench(f"test_mem[{vocab}-{name}]", f"mem-V{vocab}", 0.01, provider=name, vocab=vocab,
                                  tokens=256, peak_extra_bytes=mem))
    families = report.scaling_families(_doc(benches))
    keys = {(family, ylabel) for family, _, ylabel in families}
    assert ("kmeans-vs-B-*", "median time per call (s)") in keys  # per call although problems are counted
    assert ("mem-V*", report.MEMORY_LABEL) in keys and ("mem-V*", "median time per token (s)") in keys
    scale = families[("kmeans-vs-B-*", "B (problems per call)", "median time per call (s)")]
    assert sorted(scale["ours"]) == [(16.0, 0.002), (64.0, 0.005), (256.0, 0.019)]
    memory = families[("mem-V*", "vocabulary size V", report.MEMORY_LABEL)]
    assert sorted(memory["ours"]) == [(8192.0, 1.0), (151936.0, 4096 / 2**20)]  # 0 bytes plotted as one page
    assert sorted(memory["peer"]) == [(8192.0, 26.0), (151936.0, 311.0)]
    plan = report.plot_plan(_doc(benches), "cpu")
    assert sorted(name for _, name, _, _ in plan) == ["cpu-kmeans_vs_B.png", "cpu-mem_V-memory.png", "cpu-mem_V.png"]
    table = report.suite_table([b for b in benches if b["group"].startswith("mem")])
    assert table[0].endswith("| peak extra memory |") and _row(table, "peer")[-1] == "26 MiB"


# --------------------------------------------------------------------------
# bench/run.py: progress of a running suite, and where a quick run writes
# --------------------------------------------------------------------------
from bench import run  # noqa: E402

TINY_SUITE = '''
import time

def test_short(benchmark):
    benchmark.pedantic(time.sleep, args=(0.05,), rounds=1, iterations=1)

def test_long(benchmark):
    benchmark.pedantic(time.sleep, args=(SECONDS,), rounds=1, iterations=1)
'''


def _tiny_suite(tmp_path, seconds):
    path = tmp_path / "bench_tiny.py"
    path.write_text(TINY_SUITE.replace("SECONDS", str(seconds)))
    return str(path)


def test_run_suite_prints_progress_and_heartbeats(tmp_path, capsys):
    ended = run.run_suite("tiny", str(tmp_path / "tiny.json"), quick=True, gpu=False, timeout_s=120,
                          path=_tiny_suite(tmp_path, 1.5), progress_every_s=0.0, heartbeat_s=0.5)
    out = capsys.readouterr().out
    assert ended["status"] == "ok", out
    assert "[bench] tiny: 1/2 cases done" in out and "[bench] tiny: 2/2 cases done" in out
    assert "[bench] tiny: still running test_long (" in out  # a heartbeat while the long case ran
    assert len(json.loads((tmp_path / "tiny.json").read_text())["benchmarks"]) == 2


def test_run_suite_past_its_time_limit_is_killed_and_reported(tmp_path, capsys):
    start = time.perf_counter()
    ended = run.run_suite("tiny", str(tmp_path / "tiny.json"), quick=True, gpu=False, timeout_s=4,
                          path=_tiny_suite(tmp_path, 120))
    assert time.perf_counter() - start < 30  # the 120 s case was killed, not waited for
    assert ended["status"] == "timed out after 4 s"
    assert "[bench] tiny: timed out after 4 s" in capsys.readouterr().out


def test_quick_run_writes_the_quick_page_only(tmp_path, monkeypatch, capsys):
    """run.py --quick end to end (the suite itself faked): the record and its plots stay as they were."""
    full_md, full_plots = tmp_path / "RESULTS.md", tmp_path / "plots"
    quick_md = tmp_path / "results" / "quick" / "RESULTS.md"
    monkeypatch.setitem(report.OUTPUTS, "full", (str(full_md), str(full_plots)))
    monkeypatch.setitem(report.OUTPUTS, "quick", (str(quick_md), str(quick_md.parent / "plots")))
    monkeypatch.setattr(report, "BASELINE_DIR", str(tmp_path / "no-baseline"))
    monkeypatch.setattr(run, "RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setattr(run, "discover_suites", lambda: ["demo"])

    def fake_suite(suite, json_path, quick, gpu, timeout_s, **_):
        doc = _motion_doc()
        for bench in doc["benchmarks"]:
            bench["stats"]["data"] = [bench["stats"]["median"]] * 3
        with open(json_path, "w") as fh:
            json.dump({"benchmarks": doc["benchmarks"]}, fh)
        return {"suite": suite, "status": "ok", "seconds": 0.1, "cpu_seconds": 0.1, "pytest_summary": ""}

    monkeypatch.setattr(run, "run_suite", fake_suite)
    full_md.write_text(HAND_WRITTEN)
    assert run.main(["--quick"]) == 0
    assert full_md.read_text() == HAND_WRITTEN and not full_plots.exists()
    assert "`motion-224`" in quick_md.read_text()
    written = [p for p in (tmp_path / "results").glob("*-quick-*.json")]
    assert len(written) == 1 and all("p20" in b["stats"] for b in json.loads(written[0].read_text())["benchmarks"])
    assert "results/quick/RESULTS.md" in capsys.readouterr().out


@pytest.mark.parametrize("status", ["pytest exit code 1", "timed out after 240 s"])
def test_a_suite_that_errors_fails_the_run(tmp_path, monkeypatch, capsys, status):
    """The results and the report are still written, then the exit status says a suite failed."""
    monkeypatch.setitem(report.OUTPUTS, "quick", (str(tmp_path / "quick" / "RESULTS.md"), str(tmp_path / "plots")))
    monkeypatch.setattr(report, "BASELINE_DIR", str(tmp_path / "no-baseline"))
    monkeypatch.setattr(run, "RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setattr(run, "discover_suites", lambda: ["good", "bad"])

    def fake_suite(suite, json_path, quick, gpu, timeout_s, **_):
        return {"suite": suite, "status": "ok" if suite == "good" else status, "seconds": 0.1, "cpu_seconds": 0.1,
                "pytest_summary": ""}

    monkeypatch.setattr(run, "run_suite", fake_suite)
    assert run.main(["--quick", "--no-report"]) == 1
    assert "FAILED suites: bad" in capsys.readouterr().out
    assert len(list((tmp_path / "results").glob("*-quick-*.json"))) == 1


def _fake_suites(monkeypatch, tmp_path, doc_for):
    """run.py with its suites faked: ``doc_for(suite)`` is what a suite measures (samples included)."""
    monkeypatch.setattr(run, "RESULTS_DIR", str(tmp_path / "results"))

    def fake_suite(suite, json_path, quick, gpu, timeout_s, **_):
        benchmarks = doc_for(suite)["benchmarks"]
        for bench in benchmarks:
            median = bench["stats"]["median"]
            bench["stats"]["data"] = [median * 0.99, median, median * 1.01]
        with open(json_path, "w") as fh:
            json.dump({"benchmarks": benchmarks}, fh)
        return {"suite": suite, "status": "ok", "seconds": 0.1, "cpu_seconds": 0.1, "pytest_summary": ""}

    monkeypatch.setattr(run, "run_suite", fake_suite)


def test_full_run_changes_the_record_only_with_save_baseline(tmp_path, monkeypatch, capsys):
    """A full run is compared with the committed baseline; --save-baseline makes it the record and regenerates it."""
    repo = tmp_path / "repo"
    baseline_dir = repo / "bench" / "baseline"
    baseline_dir.mkdir(parents=True)
    _git(repo, "init", "-q")
    (baseline_dir / "cpu2c-test-full.json").write_text(json.dumps(_motion_doc()))
    _git(repo, "add", "bench/baseline/cpu2c-test-full.json")
    _git(repo, "commit", "-q", "-m", "baseline")
    md, plots = repo / "bench" / "RESULTS.md", repo / "bench" / "plots"
    monkeypatch.setitem(report.OUTPUTS, "full", (str(md), str(plots)))
    monkeypatch.setattr(report, "BASELINE_DIR", str(baseline_dir))
    monkeypatch.setattr(run, "machine_tag", lambda gpu: "cpu2c-test")
    monkeypatch.setattr(run, "discover_suites", lambda: ["motion", "tree"])
    monkeypatch.setattr(run, "write_compare_table", lambda baseline, out: out[:-5] + ".compare.txt")
    monkeypatch.setattr(report, "draw_plots", lambda plan, plots_dir, machine: None)
    # motion: ours-cpp 224 three times slower with separate bands, a peer 100x slower: one regression
    slower = _motion_doc(ours_cpp=0.030)
    slower["benchmarks"][2]["stats"]["median"] = 2.0
    _fake_suites(monkeypatch, tmp_path, lambda suite: {"benchmarks": [
        b for b in copy.deepcopy(slower)["benchmarks"] if b["suite"] == suite]})
    assert run.main(["--only", "motion"]) == 0  # a regression is a report line, never a failure
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if "REGRESSION" in line] == [
        "[bench] REGRESSION: `bench/bench_motion.py::test_ours_cpp[224px]` median 30 ms vs 10 ms "
        "(+200 %; p20-p80 vs median 29.8 ms-30.2 ms vs 10 ms-10 ms)"]
    assert "changes it only with --save-baseline" in out and not md.exists()
    assert run.main(["--only", "motion", "--save-baseline"]) == 0
    page = md.read_text()
    assert "30 ms" in page and "### tree" in page  # motion replaced, tree kept from the baseline
    saved = json.loads((baseline_dir / "cpu2c-test-full.json").read_text())
    assert all("data" not in b["stats"] and "p20" in b["stats"] for b in saved["benchmarks"]
               if b["suite"] == "motion")


def test_timed_suites_run_at_the_shells_priority_and_answer_suites_niced():
    from bench import quality

    assert quality.suite_command("load_levels") == "python -m bench.bench_load"
    assert quality.suite_command("memverse").startswith("nice -n 10 python -m bench.memverse_answers")
    assert set(quality.TIMED) <= set(quality.SUITES) and set(quality.SECTIONS) <= set(quality.SUITES)


def test_small_calls_crossover_names_where_the_plain_code_wins_and_where_ours_takes_over():
    from bench.small_calls import crossover

    assert crossover([(10, 1.4), (100, 1.1), (1000, 0.8), (10_000, 0.5)]) == ("10, 100", "1,000")
    assert crossover([(10, 0.9), (100, 0.7)]) == ("none", "10 (every size)")
    assert crossover([(10, 0.9), (100, 1.2)]) == ("100", "beyond 100")
    assert crossover([(10, 1.2), (100, 0.9), (1000, 1.05), (10_000, 0.95)]) == ("10, 1,000", "10,000")


def test_load_verdicts_hold_each_loaded_row_to_its_one_thread_run_and_to_the_idle_ratio():
    from bench.bench_load import load_verdicts

    def row(busy, threads, ours, ratio):
        return {"busy": busy, "threads": threads, "case": "c", "ours_p50": ours, "ratio_p50": ratio}

    records = [row(0, 1, 10.0, 0.5), row(0, 2, 6.0, 0.4), row(2, 1, 20.0, 0.5), row(2, 2, 30.0, 0.8)]
    got = {(v["busy"], v["threads"]): v for v in load_verdicts(records)}
    assert set(got) == {(2, 1), (2, 2)}  # idle rows are the yardstick, not judged
    assert got[2, 1]["verdict"] == "met" and got[2, 1]["own"] == "1.00" and got[2, 1]["relative"] == "1.00"
    assert got[2, 2]["own"] == "1.50" and got[2, 2]["relative"] == "2.00"
    assert got[2, 2]["verdict"] == "slower than its 1-thread run; further behind the peer than when idle"
    assert load_verdicts([row(0, 1, 1.0, None), row(1, 1, 1.05, None)])[0]["verdict"] == "met"  # no peer, in noise
