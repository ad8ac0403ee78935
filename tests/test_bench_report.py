"""bench/report.py on small synthetic pytest-benchmark documents (no benchmark is run)."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import report  # noqa: E402

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
                          "libraries": {"torch": "2.13.0"}, "command": "python bench/run.py --quick",
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
    assert report.main(["--results-dir", str(results), "--results-md", str(md), "--plots-dir", str(plots),
                        "--baseline-dir", str(tmp_path / "no-baseline")]) == 0
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
    assert report.main(["--results-dir", str(results), "--results-md", str(md), "--no-plots",
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
