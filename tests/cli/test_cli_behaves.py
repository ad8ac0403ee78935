"""`streammem` behaves like a Unix tool: --version, each subcommand's own usage on a bad option, the options
of every subcommand declared once, arguments checked before torch is imported, times checked, a non-video
file refused in one line, FFmpeg's messages kept off the terminal, --quiet, and Ctrl-C (a real SIGINT):
the summary of what was streamed, the report, exit status 130, within about a second."""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

import pytest

import streammem.cli
from tests.support.clips import write_clip
from streammem.cli import EXIT_INTERRUPTED, SUBCOMMANDS, build_parser, main
from streammem.cli.command import COMMON_FLAGS
from streammem.cli.run import print_text_report, run_video

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SMALL = ["--no-progress", "--frame-encoder", "pixel", "--text-encoder", "hashing"]
NAMES = [command.name for command in SUBCOMMANDS]


def _env() -> dict:
    """The test process's environment, with this checkout first on the path (the subprocesses import it)."""
    env = {k: v for k, v in os.environ.items() if k != "OPENCV_FFMPEG_LOGLEVEL"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "python"), env.get("PYTHONPATH", "")])
    return env


def _cli(*argv, timeout=300, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streammem.cli", *map(str, argv)], capture_output=True, text=True,
                          env=_env(), timeout=timeout, **kwargs)


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return write_clip(tmp_path_factory.mktemp("clip") / "scenes.avi")


# ---- --version, usage, the options of every subcommand ---------------------------------------
def test_version_is_the_installed_packages(capsys):
    try:
        expected = metadata.version("streammem-kernels")
    except metadata.PackageNotFoundError:
        from streammem import __version__ as expected
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"streammem {expected}\n"


@pytest.mark.parametrize("name", NAMES)
def test_a_bad_option_prints_the_subcommands_own_usage(capsys, name):
    with pytest.raises(SystemExit) as exit_:
        main([name, "--reprot"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.startswith(f"usage: streammem {name} ") and f"streammem {name}: error: unrecognized arguments: " \
        "--reprot" in err, err
    assert "Traceback" not in err


def test_a_misspelled_option_gets_a_suggestion(capsys):
    with pytest.raises(SystemExit):
        main(["run", "clip.mp4", "--reprot", "x.html"])
    assert "unrecognized arguments: --reprot x.html (did you mean --report?)" in capsys.readouterr().err


@pytest.mark.parametrize("name", NAMES)
def test_every_subcommand_takes_the_common_options_declared_once(name):
    args = build_parser().parse_args([name, "--json", "--no-progress", "--quiet"])
    assert all(getattr(args, flag) is True for flag in COMMON_FLAGS)
    assert build_parser().parse_args([name, "-q"]).quiet
    # Declared once (command.common_options): no subcommand adds them itself.
    own = argparse.ArgumentParser(add_help=False)
    next(c for c in SUBCOMMANDS if c.name == name).add_arguments(own)
    assert not {a.dest for a in own._actions} & set(COMMON_FLAGS)


def test_quiet_leaves_stderr_to_errors(capsys, clip, tmp_path):
    cut = tmp_path / "cut.avi"  # truncated: a VideoTruncatedWarning otherwise
    cut.write_bytes(clip.read_bytes()[: clip.stat().st_size // 2])
    page = tmp_path / "page.html"
    assert main(["run", str(cut), *SMALL, "--fps", "2", "--quiet", "--report", str(page)]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and page.exists()
    assert "WARNING: the video ended after" in captured.out  # the summary still says so
    assert main(["run", str(tmp_path / "nope.mp4"), "--quiet"]) == 2
    assert "not found" in capsys.readouterr().err  # errors still reach stderr


def test_backends_json_is_the_common_option(capsys):
    assert main(["backends", "--json"]) == 0
    assert "ops" in json.loads(capsys.readouterr().out)


# ---- arguments checked before torch is imported ------------------------------------------------
BAD_ARGUMENTS = [
    (["run", "--reprot"], "unrecognized arguments"),
    (["run", "--query", "99:99: what now?"], "query time '99:99' is out of range"),
    (["run", "--fps", "0"], "--fps must be"),
    (["run", "--report", "out.txt"], "--report must name an .html file"),
    (["videoagent", "--budget", "0"], "--budget must be"),
    (["videoagent", "--margin", "-1"], "--margin must be"),
    (["memverse", "--turn", "9:75: Ana: hi"], "--turn time '9:75' is out of range"),
    (["memverse", "--hops", "-1"], "--hops must be"),
    (["prostream", "--beam", "3"], "--beam must be SESSIONS,SEGMENTS"),
    (["prostream", "--drift", "2"], "--drift must be"),
    (["run", "missing.mp4"], "video file not found: missing.mp4"),
    (["videoagent", "missing.mp4"], "video file not found: missing.mp4"),
    (["memverse", "missing.mp4"], "video file not found: missing.mp4"),
    (["prostream", "missing.jsonl"], "dialogue file not found: missing.jsonl"),
]


def test_bad_arguments_fail_before_torch_is_imported():
    """Each mistake above ends with exit status 2 and one message while torch is still unimported."""
    code = (
        "import json, sys\n"
        "from streammem.cli import main\n"
        "out = []\n"
        "for argv in json.loads(sys.argv[1]):\n"
        "    try:\n"
        "        rc = main(argv)\n"
        "    except SystemExit as exc:\n"
        "        rc = exc.code\n"
        "    out.append((rc, 'torch' in sys.modules))\n"
        "print(json.dumps(out))\n")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps([argv for argv, _ in BAD_ARGUMENTS])],
                          capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == [[2, False]] * len(BAD_ARGUMENTS)
    for _, message in BAD_ARGUMENTS:
        assert message in proc.stderr, message
    assert "Traceback" not in proc.stderr


def test_the_command_imports_no_torch_on_a_bad_option():
    """The real entry point, measured: `python -X importtime -m streammem.cli run --reprot`."""
    start = time.perf_counter()
    proc = _cli("run", "--reprot", timeout=60)
    elapsed = time.perf_counter() - start
    assert proc.returncode == 2 and "usage: streammem run" in proc.stderr
    traced = subprocess.run([sys.executable, "-X", "importtime", "-m", "streammem.cli", "run", "--reprot"],
                            capture_output=True, text=True, env=_env(), timeout=60)
    imported = re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)", traced.stderr, re.M)
    assert "streammem.cli" in imported and not [m for m in imported if m.split(".")[0] in ("torch", "numpy")]
    # A loaded machine is not an idle one; torch alone takes several seconds to import on it.
    assert elapsed < 5.0, elapsed


# ---- bad input: one line, exit 2 ---------------------------------------------------------------
def test_a_text_file_is_refused_as_not_a_video(capsys, tmp_path):
    text = tmp_path / "readme.txt"
    text.write_text(README.read_text())  # FFmpeg read this as a 7.76 s, 25 fps video of ANSI art
    assert main(["run", str(text), *SMALL]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "readme.txt' is not a video: FFmpeg reads it as text" in err, err


def test_ffmpeg_messages_stay_off_the_terminal(tmp_path):
    from streammem.io.video import sample_video_path

    data = sample_video_path().read_bytes()
    cut = tmp_path / "cut.mp4"  # its index (moov atom) is at the end: FFmpeg cannot open it
    cut.write_bytes(data[: len(data) // 3])
    proc = _cli("run", cut, *SMALL)
    assert proc.returncode == 2 and "moov" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines() == [proc.stderr.strip()] and "OpenCV cannot open" in proc.stderr
    corrupt = bytearray(data)  # h264 decoding errors while streaming
    for offset in range(len(data) // 10, 8 * len(data) // 10, len(data) // 40):
        corrupt[offset:offset + 64] = bytes(range(64))
    damaged = tmp_path / "damaged.mp4"
    damaged.write_bytes(bytes(corrupt))
    proc = _cli("run", damaged, *SMALL, "--fps", "5", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "[h264" not in proc.stderr and "error while decoding" not in proc.stderr, proc.stderr
    assert json.loads(proc.stdout)["summary"]["frames_decoded"] > 0


# ---- Ctrl-C ----------------------------------------------------------------------------------------
def test_ctrl_c_in_any_subcommand_is_one_line_and_exit_130(capsys, monkeypatch):
    args = build_parser().parse_args(["backends"])

    def interrupted(_):
        raise KeyboardInterrupt

    args.handler = interrupted
    monkeypatch.setattr(streammem.cli, "build_parser", lambda: SimpleNamespace(parse_args=lambda argv: args))
    assert main(["backends"]) == EXIT_INTERRUPTED
    assert capsys.readouterr().err == "streammem: interrupted\n"


def test_interrupted_summary_in_text(capsys, clip):
    args = build_parser().parse_args(["run", str(clip), *SMALL, "--fps", "2", "--query", "15: what now?"])
    report, extra = run_video(args)
    assert report["summary"]["interrupted"] is False
    report["summary"]["interrupted"] = True
    extra.update(streamed_s=12.5, questions_planned=3)
    print_text_report(report, extra)
    out = capsys.readouterr().out
    assert "INTERRUPTED (Ctrl-C) after 12.50 s of the video" in out
    assert "questions: 1 answered of 3 before Ctrl-C" in out and "12.5 s of video" in out


def test_ctrl_c_stops_the_stream_prints_the_partial_summary_writes_the_report_and_exits_130(tmp_path):
    """A real SIGINT while a long clip streams (frames upscaled to 640 px so that it takes minutes)."""
    scenes = tuple((colour, 30.0, moving) for colour, moving in
                   (("red", True), ("green", True), ("blue", False), ("yellow", True)))
    clip = write_clip(tmp_path / "long.avi", scenes)  # 120 s, 3000 frames
    page = tmp_path / "partial.html"
    proc = subprocess.Popen([sys.executable, "-m", "streammem.cli", "run", str(clip), "--frame-encoder", "pixel",
                             "--text-encoder", "hashing", "--size", "640", "--report", str(page),
                             "--query", "2: what now?", "--query", "100: and now?"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    err, streaming = bytearray(), threading.Event()

    def read_stderr():  # the progress bar says when frames flow
        while chunk := proc.stderr.read1(4096):
            err.extend(chunk)
            counts = re.findall(rb"(\d+)/3000 \[", bytes(err))
            if counts and int(counts[-1]) >= 150:  # 6 s of video: well past the question at 2 s
                streaming.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        assert streaming.wait(300), bytes(err)[-2000:].decode(errors="replace")
        sent = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        watchdog = threading.Timer(60, proc.kill)  # a process that ignored the signal fails the test, not hangs it
        watchdog.start()
        out = proc.stdout.read()  # stderr is the reader thread's alone
        proc.wait()
        stopped = time.perf_counter() - sent
        watchdog.cancel()
    finally:
        proc.kill()
    reader.join(10)
    stderr = bytes(err).decode(errors="replace")
    out = out.decode()
    assert proc.returncode == EXIT_INTERRUPTED, stderr[-2000:]
    assert stopped < 3.0, f"{stopped:.2f} s from SIGINT to exit"  # about 0.3 s here; a loaded machine varies
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    assert re.search(r"streammem: interrupted after \d+\.\d+ s of the video \(\d+ frames\)", stderr.splitlines()[-1])
    match = re.search(r"INTERRUPTED \(Ctrl-C\) after (\d+\.\d+) s of the video", out)
    assert match and 3.0 <= float(match[1]) < 120.0, out[:2000]
    decoded = int(re.search(r"frames: (\d+) decoded", out)[1])
    assert 150 <= decoded < 3000
    assert "questions: 1 answered of 2 before Ctrl-C" in out and "Q1 at 2.00 s: what now?" in out
    html = page.read_text()
    assert "Ctrl-C stopped the run" in html and "what now?" in html


def test_videoagent_help_shows_the_recipes_policy_defaults():
    """The defaults are the recipe's (None on the command line); the help text names their values."""
    from streammem.recipes.videoagent import RetrievalConfidencePolicy

    policy = RetrievalConfidencePolicy()
    parser = next(c for c in SUBCOMMANDS if c.name == "videoagent")
    own = argparse.ArgumentParser()
    parser.add_arguments(own)
    text = " ".join(own.format_help().split())
    assert f"RetrievalConfidencePolicy's, {policy.margin})" in text
    assert f"RetrievalConfidencePolicy's, {policy.max_segments})" in text
