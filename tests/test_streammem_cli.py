"""`streammem run` on the real sample clip: prints the summary and exits 0."""
import json
import subprocess
import sys

from streammem.cli import DEFAULT_QUERIES, _parse_query, extractive_answer, format_ranges, main
from streammem.video import sample_video_path


def test_parse_query():
    assert _parse_query("12.0: what is the rider doing?") == (12.0, "what is the rider doing?")
    assert _parse_query("what: is this") == (None, "what: is this")
    assert _parse_query("plain question") == (None, "plain question")
    assert all(_parse_query(q)[0] is not None for q in DEFAULT_QUERIES)


def test_format_ranges():
    assert format_ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    assert format_ranges([]) == ""


def test_missing_video_is_a_clear_error(capsys, tmp_path):
    rc = main(["run", str(tmp_path / "nope.mp4"), "--no-progress"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "not found" in err and "Traceback" not in err


def test_cli_text_report_with_small_encoders(capsys):
    rc = main(["run", "--no-progress", "--frame-encoder", "pixel", "--text-encoder", "hashing", "--fps", "10",
               "--query", "5.0: what colour is the scene?", "--query", "what is there?"])
    assert rc == 0
    out = capsys.readouterr().out
    for needle in ("frames decoded: 100", "kept by the motion gate", "events:", "memory tree:", "frames/s",
                   "request processing delay (RPD)", "Q: what colour is the scene? (asked at stream time",
                   "Q: what is there?", "A: "):
        assert needle in out, needle


def test_extractive_answer_picks_the_best_caption():
    class Ctx:
        tree_best = {"score": 0.2, "caption": "1.0-2.0s: taxicab"}
        knowledge = [{"score": 0.5, "caption": "3.0-4.0s: mountain bike"}]

    assert extractive_answer(Ctx()) == "At 3.0-4.0s I saw: mountain bike"


def test_cli_on_sample_clip_with_real_models_json():
    sample_video_path()
    proc = subprocess.run([sys.executable, "-m", "streammem.cli", "run", "--json", "--no-progress", "--fps", "5"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    s = report["summary"]
    assert s["frame_encoder"] == "efficientnet-lite0" and s["text_encoder"] == "all-MiniLM-L6-v2"
    assert s["frames_decoded"] == 50 and 0 < s["frames_kept"] <= 50 == s["frames_decoded"]
    assert s["events"] >= 1 and s["tree_nodes"] >= 1 and s["processed_fps"] > 0
    assert len(report["queries"]) == len(DEFAULT_QUERIES) == len(s["rpd_ms"])
    assert all(q["answer"] for q in report["queries"])
    # The last question comes at the end of the stream, when the tree holds every chunk.
    assert report["queries"][-1]["tree_best"] is not None and report["queries"][-1]["knowledge"]
    assert "Traceback" not in proc.stderr
