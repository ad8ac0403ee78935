"""bench/report.py on small synthetic pytest-benchmark documents (no benchmark is run)."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import time

import pytest

from bench import report

HAND_WRITTEN = """# Benchmark results

Every number here is reproduced by the command written next to it.
Second line of the intro.

## Motion gate

| provider | ms |
|---|---|
| ours | 1.0 |
"""


def _bench(name, group, mean, median=None, **extra_info):
    return {"name": name, "fullname": f"bench/bench_demo.py::{name}", "group": group, "params": None,
            "extra_info": extra_info, "stats": {"mean": mean, "median": mean if median is None else median,
                                                "min": mean, "max": mean, "stddev": 0.0, "rounds": 3}}


def _doc(benchmarks, machine="cpu2c-test", mode="quick"):
    return {"machine_info": {}, "benchmarks": benchmarks,
            "streammem": {"machine": machine, "kind": "cpu", "mode": mode, "cpu_model": "Test CPU", "cores": 2,
                          "libraries": {"torch": "2.13.0"}, "command": "python -m bench.run --quick",
                          "started_utc": "2026-11-23T12:00:00+00:00", "suites": []}}


def _write(directory, doc, stamp):
    path = directory / f"{doc['streammem']['machine']}-{doc['streammem']['mode']}-{stamp}.json"
    path.write_text(json.dumps(doc))
    return path


def _motion_doc(ours_cpp=0.010, scale=1.0):
    return _doc([
        _bench("test_ours_cpp[224px]", "motion-224", ours_cpp * scale, pairs=50, provider="ours-cpp"),
        _bench("test_ours_torch[224px]", "motion-224", 0.040 * scale, pairs=50, provider="ours-torch-reference"),
        _bench("test_opencv_dis[224px]", "motion-224", 0.030 * scale, pairs=50, provider="opencv-dis"),
        _bench("test_ours_cpp[336px]", "motion-336", 0.020 * scale, pairs=50, provider="ours-cpp"),
        _bench("test_opencv_dis[336px]", "motion-336", 0.070 * scale, pairs=50, provider="opencv-dis"),
        _bench("test_tree_greedy", "tree-N1000", 0.002 * scale, method="tree_search greedy", Q=64, recall10=0.91),
        _bench("test_faiss_flat", "tree-N1000", 0.004 * scale, method="faiss IndexFlatIP", Q=64, recall10=1.0),
    ])


def _row(table_lines, provider):
    """The cells of ``provider``'s table row."""
    line = next(line for line in table_lines if line.startswith(f"| `{provider}`"))
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def test_ratio_uses_fastest_ours_row_as_baseline():
    groups = report.group_benchmarks(_motion_doc())
    table = report.group_table(groups["motion-224"])
    assert table[0] == "| provider | mean | median | throughput | time / ours |"
    assert _row(table, "ours-cpp") == ["`ours-cpp`", "10 ms", "10 ms", "5 k pairs/s", "**1.00 (baseline)**"]
    # 0.040 / 0.010 and 0.030 / 0.010: ratios are to the fastest ours row, not to the torch reference
    assert _row(table, "ours-torch-reference")[4] == "4.00"
    assert _row(table, "opencv-dis")[4] == "3.00"
    # rows are sorted fastest first
    assert [line.split("|")[1].strip() for line in table[2:]] == ["`ours-cpp`", "`opencv-dis`",
                                                                 "`ours-torch-reference`"]


def test_group_without_ours_has_no_ratio_but_shows_quality_and_queries():
    rows = report.group_benchmarks(_motion_doc())["tree-N1000"]
    for bench in rows:
        bench["extra_info"]["method"] = bench["extra_info"]["method"].replace("tree_search", "a tree")
    table = report.group_table(rows)
    assert "recall@10" in table[0]
    assert table[0] == "| provider | mean | median | throughput | time / ours | recall@10 |"
    assert _row(table, "a tree greedy") == ["`a tree greedy`", "2 ms", "2 ms", "32 k queries/s", "-", "0.91"]
    assert any("no row of ours" in line for line in table)


def test_provider_named_after_a_public_function_is_ours():
    tree = _bench("test_tree_greedy", "g", 0.002, method="tree_search greedy")
    faiss = _bench("test_faiss_flat", "g", 0.001, method="faiss IndexFlatIP")
    assert report.is_ours(tree) and not report.is_ours(faiss)
    table = report.group_table([tree, faiss])
    assert _row(table, "faiss IndexFlatIP")[4] == "0.50" and "baseline" in _row(table, "tree_search greedy")[4]


def test_parametrized_case_without_group_is_grouped_by_its_parameters():
    bench = _bench("test_logprobs_time[token-V49152-T128-ours[cpp]]", None, 0.01)
    bench["fullname"] = "bench/bench_logprobs.py::" + bench["name"]
    bench["params"] = {"kind": "token", "vocab": 49152, "rows": 128, "provider": "ours[cpp]"}
    assert report.group_of(bench) == "logprobs token-V49152-T128"
    assert report.provider_of(bench) == "ours[cpp]" and report.is_ours(bench)
    assert report.units_of(bench) == (128.0, "tokens")
    assert report.size_of(bench)[0] == 49152


def test_markers_inserted_after_intro_and_replaced_without_touching_hand_written_text():
    first = report.replace_block(HAND_WRITTEN, f"{report.BEGIN}\nblock one\n{report.END}")
    assert first.startswith("# Benchmark results\n\nEvery number here is reproduced by the command written next to it.\n"
                            "Second line of the intro.\n\n<!-- report:begin -->\nblock one\n<!-- report:end -->\n\n"
                            "## Motion gate")
    second = report.replace_block(first, f"{report.BEGIN}\nblock two\n{report.END}")
    assert "block one" not in second and "block two" in second
    assert second.replace("block two", "block one") == first
    # everything outside the markers is byte-for-byte the hand-written text
    outside = second.split(report.BEGIN)[0] + second.split(report.END)[1]
    assert outside.replace("\n", "") == HAND_WRITTEN.replace("\n", "")


@pytest.mark.parametrize("slowdown,flagged", [(1.20, True), (1.05, False)])
def test_regression_line_only_above_ten_percent(slowdown, flagged):
    before = _motion_doc()
    after = copy.deepcopy(before)
    after["benchmarks"][0]["stats"]["median"] *= slowdown
    lines = report.regression_lines(after, before)
    if flagged:
        assert len(lines) == 1 and lines[0].startswith("REGRESSION:") and "test_ours_cpp[224px]" in lines[0]
        assert "+20 %" in lines[0]
    else:
        assert lines == []


def test_main_end_to_end_compares_with_previous_run_of_same_machine_and_mode(tmp_path):
    results, md, plots = tmp_path / "results", tmp_path / "RESULTS.md", tmp_path / "plots"
    results.mkdir()
    md.write_text(HAND_WRITTEN)
    _write(results, _motion_doc(), "2026-11-23T110000Z")
    _write(results, _motion_doc(scale=3.0, ours_cpp=0.010 / 3.0), "2026-11-23T113000Z")  # another mode below
    other_mode = _motion_doc(scale=5.0)
    other_mode["streammem"]["mode"] = "full"
    _write(results, other_mode, "2026-11-23T115000Z")
    latest = _motion_doc(ours_cpp=0.013)  # +30 % on ours-cpp 224 vs the 11:00 run, the rest as then
    latest_path = _write(results, latest, "2026-11-23T120000Z")
    (results / "motion.json").write_text("")  # stray files in results/ are ignored
    # the newest CPU run is the 12:00 one; its previous same-mode run is the 11:30 one (3x slower overall)
    docs = report.find_results(str(results))
    assert report.newest(docs, "cpu")["_path"] == str(latest_path)
    view = report.combined_run(docs, "cpu")
    assert view["_compared"] == ["cpu2c-test-quick-2026-11-23T110000Z.json", "cpu2c-test-quick-2026-11-23T113000Z.json"]
    assert report.main(["--mode", "quick", "--results-dir", str(results), "--results-md", str(md), "--plots-dir",
                        str(plots), "--baseline-dir", str(tmp_path / "no-baseline")]) == 0
    text = md.read_text()
    assert text.startswith(HAND_WRITTEN.split("## Motion gate")[0])
    assert text.rstrip().endswith("| ours | 1.0 |")
    block = text.split(report.BEGIN)[1].split(report.END)[0]
    # against 11:30 (everything 3x slower then, ours-cpp 224 at 0.010) only ours-cpp 224 became slower: +30 %
    assert [line for line in block.splitlines() if "REGRESSION" in line] == [
        "- REGRESSION: `bench/bench_demo.py::test_ours_cpp[224px]` median 13 ms vs 10 ms (+30 %)"]
    assert "**motion-224**" in block and "Test CPU, 2 cores, no GPU" in block
    # motion-224 / motion-336 form one scaling family with two sizes: one plot, embedded in the block
    assert sorted(p.name for p in plots.iterdir()) == ["cpu-motion.png"]
    assert "](plots/cpu-motion.png)" in block


def test_suites_missing_from_the_newest_run_come_from_the_newest_run_that_has_them(tmp_path):
    def suite_doc(suite, median):
        bench = _bench("test_ours_x", "g", median, provider="ours")
        bench["fullname"] = f"bench/bench_{suite}.py::test_ours_x"
        return _doc([bench])

    _write(tmp_path, suite_doc("motion", 1.0), "2026-11-23T100000Z")
    _write(tmp_path, suite_doc("tree", 1.0), "2026-11-23T110000Z")
    _write(tmp_path, suite_doc("motion", 2.0), "2026-11-23T120000Z")  # `run.py --only motion`, 2x slower
    view = report.combined_run(report.find_results(str(tmp_path)), "cpu", str(tmp_path / "no-baseline"))
    assert [(os.path.basename(d["_path"])[-13:], suites) for d, suites in view["_sources"]] == [
        ("T120000Z.json", ["motion"]), ("T110000Z.json", ["tree"])]
    assert sorted(b["fullname"] for b in view["benchmarks"]) == ["bench/bench_motion.py::test_ours_x",
                                                                  "bench/bench_tree.py::test_ours_x"]
    assert view["_regressions"] == ["REGRESSION: `bench/bench_motion.py::test_ours_x` median 2 s vs 1 s (+100 %)"]


def test_gpu_run_is_merged_next_to_the_cpu_run(tmp_path):
    results, md = tmp_path / "results", tmp_path / "RESULTS.md"
    results.mkdir()
    md.write_text(HAND_WRITTEN)
    _write(results, _motion_doc(), "2026-11-23T110000Z")
    gpu = _motion_doc(scale=0.1)
    gpu["streammem"].update(machine="gpu-nvidia-h100", kind="gpu", gpu="NVIDIA H100")
    _write(results, gpu, "2026-11-23T100000Z")  # older than the CPU run, still shown: one block per kind
    assert report.main(["--mode", "quick", "--results-dir", str(results), "--results-md", str(md), "--no-plots",
                        "--baseline-dir", str(tmp_path / "no-baseline")]) == 0
    block = md.read_text().split(report.BEGIN)[1].split(report.END)[0]
    assert "### CPU run: `cpu2c-test`" in block and "### GPU run: `gpu-nvidia-h100`" in block
    assert block.index("### CPU run") < block.index("### GPU run")
    assert "GPU NVIDIA H100" in block and "STREAMMEM_BENCH_DEVICE=cuda" in block
    assert block.count("**motion-224**") == 2


def _git(cwd, *args):
    subprocess.run(["git", "-C", str(cwd), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True)


def test_regressions_are_judged_against_the_committed_baseline_not_the_working_tree(tmp_path):
    """The baseline is read at git HEAD: an uncommitted edit of the file does not move the reference."""
    repo = tmp_path / "repo"
    baseline_dir, results = repo / "bench" / "baseline", repo / "bench" / "results"
    baseline_dir.mkdir(parents=True)
    results.mkdir()
    _git(repo, "init", "-q")
    committed = report.strip_for_baseline(_motion_doc(ours_cpp=0.010))
    (baseline_dir / "cpu2c-test-quick.json").write_text(json.dumps(committed))
    _git(repo, "add", "bench/baseline/cpu2c-test-quick.json")
    _git(repo, "commit", "-q", "-m", "baseline")
    # Uncommitted: a slower "baseline" that would hide the regression if it were read.
    (baseline_dir / "cpu2c-test-quick.json").write_text(json.dumps(_motion_doc(ours_cpp=0.020)))
    # A local earlier run, even slower, would also hide it: the committed baseline takes precedence.
    _write(results, _motion_doc(ours_cpp=0.050), "2026-11-23T110000Z")
    _write(results, _motion_doc(ours_cpp=0.015), "2026-11-23T120000Z")
    view = report.combined_run(report.find_results(str(results)), "cpu", str(baseline_dir))
    assert view["_regressions"] == [
        "REGRESSION: `bench/bench_demo.py::test_ours_cpp[224px]` median 15 ms vs 10 ms (+50 %)"]
    assert view["_compared"] == [] and [b["_path"] for b in view["_baselines"]] == [
        str(baseline_dir / "cpu2c-test-quick.json")]
    text = "\n".join(report.regression_paragraph(view, str(repo / "bench")))
    assert "last committed results" in text and "pytest_benchmark compare" in text and "1 found" in text


def test_uncommitted_baseline_in_a_git_tree_is_not_used(tmp_path):
    repo = tmp_path / "repo"
    baseline_dir = repo / "bench" / "baseline"
    baseline_dir.mkdir(parents=True)
    _git(repo, "init", "-q")
    (baseline_dir / "cpu2c-test-quick.json").write_text(json.dumps(_motion_doc()))
    assert report.committed_baseline(str(baseline_dir), "cpu2c-test", "quick") is None
    # Outside git the file on disk is the baseline.
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "cpu2c-test-quick.json").write_text(json.dumps(_motion_doc()))
    assert report.committed_baseline(str(plain), "cpu2c-test", "quick")["benchmarks"][0]["name"] == \
        "test_ours_cpp[224px]"


def test_strip_for_baseline_drops_round_samples_only():
    doc = _motion_doc()
    doc["benchmarks"][0]["stats"]["data"] = [0.01] * 1000
    doc["_path"] = "x"
    slim = report.strip_for_baseline(doc)
    assert "data" not in slim["benchmarks"][0]["stats"] and "_path" not in slim
    assert slim["benchmarks"][0]["stats"]["median"] == doc["benchmarks"][0]["stats"]["median"]
    assert "data" in doc["benchmarks"][0]["stats"]  # the caller's document is left alone


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
    written = [os.path.basename(p) for _, p in report.make_plots(_doc(benches), str(tmp_path), "cpu")]
    assert sorted(written) == ["cpu-kmeans_vs_B.png", "cpu-mem_V-memory.png", "cpu-mem_V.png"]


# --------------------------------------------------------------------------
# Noise bands, our rows only, and the record left alone
# --------------------------------------------------------------------------
def _banded(bench, p20, p80):
    bench["stats"].update(p20=p20, p80=p80)
    return bench


def test_percentiles_are_added_from_samples_and_kept_in_the_baseline():
    doc = _doc([_bench("test_ours_x", "g", 5.5, provider="ours")])
    doc["benchmarks"][0]["stats"]["data"] = [float(v) for v in range(10, 0, -1)]  # 1..10, unsorted
    report.add_percentiles(doc)
    stats = doc["benchmarks"][0]["stats"]
    assert stats["p20"] == pytest.approx(2.8) and stats["p80"] == pytest.approx(8.2)  # numpy's linear rule
    slim = report.strip_for_baseline(doc)["benchmarks"][0]["stats"]
    assert "data" not in slim and slim["p20"] == pytest.approx(2.8) and slim["p80"] == pytest.approx(8.2)
    assert report.spread(slim) == (pytest.approx(2.8), pytest.approx(8.2), "p20-p80")
    assert report.spread({"median": 1.0, "q1": 0.9, "q3": 1.2}) == (0.9, 1.2, "p25-p75")  # older baselines


def test_regression_only_for_our_rows_and_only_when_the_bands_separate():
    before = _doc([_banded(_bench("test_ours_cpp", "g", 0.010, provider="ours-cpp"), 0.0095, 0.0105),
                   _banded(_bench("test_ours_torch", "g", 0.040, provider="ours-torch"), 0.030, 0.050),
                   _banded(_bench("test_opencv_dis", "g", 0.030, provider="opencv-dis"), 0.029, 0.031)])
    after = _doc([
        # +30 % with separate bands: flagged
        _banded(_bench("test_ours_cpp", "g", 0.013, provider="ours-cpp"), 0.0125, 0.0135),
        # +30 % but the band starts inside the old one (a noisy row on a loaded machine): not flagged
        _banded(_bench("test_ours_torch", "g", 0.052, provider="ours-torch"), 0.045, 0.060),
        # a peer 100x slower under load: measured, never ours to regress
        _banded(_bench("test_opencv_dis", "g", 3.0, provider="opencv-dis"), 2.9, 3.1)])
    assert report.regression_lines(after, before) == [
        "REGRESSION: `bench/bench_demo.py::test_ours_cpp` median 13 ms vs 10 ms "
        "(+30 %; p20-p80 12.5 ms-13.5 ms vs 9.5 ms-10.5 ms)"]
    # separate bands but less than 10 % slower: not flagged either
    tight = _doc([_banded(_bench("test_ours_cpp", "g", 0.0108, provider="ours-cpp"), 0.0106, 0.0110)])
    assert report.regression_lines(tight, before) == []


def test_table_shows_the_p20_p80_band():
    rows = [_banded(_bench("test_ours_cpp", "g", 0.010, pairs=50, provider="ours-cpp"), 0.0095, 0.0105),
            _bench("test_peer", "g", 0.030, pairs=50, provider="peer")]
    table = report.group_table(rows)
    assert table[0] == "| provider | mean | median | p20-p80 | throughput | time / ours |"
    assert _row(table, "ours-cpp")[3] == "9.5 ms-10.5 ms" and _row(table, "peer")[3] == "-"


def _commit_baseline(repo, doc, name):
    baseline_dir = repo / "bench" / "baseline"
    baseline_dir.mkdir(parents=True, exist_ok=True)
    if not (repo / ".git").exists():
        _git(repo, "init", "-q")
    (baseline_dir / name).write_text(json.dumps(report.strip_for_baseline(doc)))
    _git(repo, "add", f"bench/baseline/{name}")
    _git(repo, "commit", "-q", "-m", "baseline")
    return baseline_dir


def _suite_bench(suite, median, group="g"):
    bench = _bench("test_ours_x", f"{suite}-{group}", median, provider="ours")
    bench["fullname"] = f"bench/bench_{suite}.py::test_ours_x"
    bench["suite"] = suite
    return bench


def test_partial_full_run_keeps_the_other_suites_from_the_committed_baseline(tmp_path):
    """`run.py --only motion` on a fresh clone: motion from the new run, every other suite from the record."""
    repo = tmp_path / "repo"
    results = repo / "bench" / "results"
    results.mkdir(parents=True)
    committed = _doc([_suite_bench("motion", 1.0), _suite_bench("tree", 2.0)], mode="full")
    baseline_dir = _commit_baseline(repo, committed, "cpu2c-test-full.json")
    _write(results, _doc([_suite_bench("motion", 1.02)], mode="full"), "2026-11-23T120000Z")
    md = repo / "bench" / "RESULTS.md"
    md.write_text(HAND_WRITTEN)
    assert report.main(["--mode", "full", "--results-dir", str(results), "--results-md", str(md), "--no-plots",
                        "--baseline-dir", str(baseline_dir)]) == 0
    block = md.read_text().split(report.BEGIN)[1].split(report.END)[0]
    assert "**motion-g**" in block and "**tree-g**" in block
    assert "`baseline/cpu2c-test-full.json` (tree) [committed baseline" in block
    assert "(motion)" in block and "Regression check" in block and "none." in block


def test_quick_report_never_touches_the_full_record(tmp_path, monkeypatch):
    """The two modes read their own runs and write their own page and plots."""
    full_md, full_plots = tmp_path / "RESULTS.md", tmp_path / "plots"
    quick_md, quick_plots = tmp_path / "results" / "quick" / "RESULTS.md", tmp_path / "results" / "quick" / "plots"
    monkeypatch.setitem(report.OUTPUTS, "full", (str(full_md), str(full_plots)))
    monkeypatch.setitem(report.OUTPUTS, "quick", (str(quick_md), str(quick_plots)))
    results = tmp_path / "results"
    results.mkdir()
    full_plots.mkdir()
    full_md.write_text(HAND_WRITTEN)
    (full_plots / "cpu-motion.png").write_bytes(b"committed plot")
    (full_plots / "cpu-gone.png").write_bytes(b"a committed plot no quick run draws")
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (full_md, *full_plots.iterdir())}
    _write(results, _motion_doc(), "2026-11-23T110000Z")  # quick
    common = ["--results-dir", str(results), "--baseline-dir", str(tmp_path / "no-baseline")]
    assert report.main(["--mode", "quick", *common]) == 0
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (full_md, *full_plots.iterdir())} == before
    quick_text = quick_md.read_text()
    assert quick_text.startswith("# Quick benchmark run (smoke test, not the record)")
    assert "## Generated report (`make bench-quick`)" in quick_text and "**motion-224**" in quick_text
    assert sorted(p.name for p in quick_plots.iterdir()) == ["cpu-motion.png"]
    # no full run yet: the full report says so and writes nothing
    assert report.main(["--mode", "full", *common]) == 1
    assert full_md.read_text() == HAND_WRITTEN
    # a full run is reported in the record only, from full runs only
    full = _motion_doc(scale=2.0)
    full["streammem"]["mode"] = "full"
    _write(results, full, "2026-11-23T100000Z")
    assert report.main(["--mode", "full", *common]) == 0
    block = full_md.read_text().split(report.BEGIN)[1].split(report.END)[0]
    assert "cpu2c-test-full-2026-11-23T100000Z.json" in block and "quick-2026" not in block
    assert "## Generated report (`make bench`)" in block


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


def test_quick_run_writes_the_quick_report_only(tmp_path, monkeypatch, capsys):
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
    assert "**motion-224**" in quick_md.read_text()
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


def test_regressions_under_load_come_with_the_load_note():
    view = {"streammem": {"load_average_before": "3.8 / 3.5 / 3.4", "load_average_after": "5.9 / 5.2 / 4.1",
                          "cores": 2}, "_baselines": [{"streammem": {"load_average_before": "0.5 / 0.4 / 0.4"}, "_path": "/r/baseline/b.json"}],
            "_regressions": ["REGRESSION: x"], "_compared": [], "_path": "/r/x.json"}
    note = report.load_note(view)
    assert note.startswith("Load average (1 min) 3.8 before this run and 5.9 after it on 2 cores; 0.5 before")
    assert "rerun those suites on idle cores" in note
    assert report.regression_paragraph(view, "/r")[-1] == note
    view["streammem"]["load_average_before"] = "0.2 / 0.2 / 0.2"
    assert "idle cores" not in report.load_note(view)  # an idle run's regressions stand as they are
