"""`streammem run --report`: the HTML page, checked against the run it describes.

Without a browser (always): the page parses, its SVG is well-formed XML, every element the
report promises is there and agrees with the run (one tick per kept frame, points above the
threshold line exactly for the kept frames, one boundary per event change, one rectangle per tree
node, one card per question), every image is an inline JPEG thumbnail, and nothing points outside
the file.  In a real headless Chromium (when one is installed; see docs/testing.md): the page loads
with no console error or exception and no network request, its script runs, images decode, a
click highlights the question's retrieved nodes, the cursor read-out works, and a screenshot
shows a drawn page.
"""
import base64
import json
import math
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import cv2
import numpy as np
import pytest

from tests.support.clips import write_clip
from tests.support.headless_browser import Browser, find_chromium
from streammem.cli import build_parser, main
from streammem.cli.run import run_video
from streammem.config import InjectorConfig, ShortTermConfig
from streammem.cli.report import MAX_GALLERY, MAX_MARKS, MAX_POINTS, check_report_path, render_report, write_report

SVG = "{http://www.w3.org/2000/svg}"
QUESTIONS = ["15: What is on screen right now?", "25: What happened before?", "What colours did we see?"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The scene clip at 10 fps: about 300 kept frames, so the tree has a second level."""
    folder = tmp_path_factory.mktemp("report")
    clip = write_clip(folder / "scenes.avi")
    path = folder / "report.html"
    argv = ["run", str(clip), "--no-progress", "--frame-encoder", "pixel", "--text-encoder", "hashing", "--fps", "10",
            "--report", str(path)]
    for q in QUESTIONS:
        argv += ["--query", q]
    report, extra = run_video(build_parser().parse_args(argv))
    write_report(path, report, extra)
    return report, extra, path


class _Elements(HTMLParser):
    """Every start tag with its attributes, in document order."""

    def __init__(self):
        super().__init__()
        self.elements = []

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))

    def select(self, tag=None, css=None, **attrs):
        out = []
        for t, a in self.elements:
            if tag and t != tag or css and css not in a.get("class", "").split():
                continue
            if all(a.get(k) == v for k, v in attrs.items()):
                out.append(a)
        return out


def _kept(extra):
    return [i for i, k in enumerate(extra["gate"]["kept"]) if k]


def _svg(text):
    start = text.index('<svg id="timeline"')
    return ET.fromstring(text[start:text.index("</svg>", start) + len("</svg>")])


def test_report_structure_matches_the_run(run):
    report, extra, path = run
    s, gate = report["summary"], extra["gate"]
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    page = _Elements()
    page.feed(text)

    svg = _svg(text)  # well-formed
    kept = _kept(extra)
    assert s["tree_levels"] == 2 and len(kept) == s["frames_kept"] > MAX_GALLERY
    # Motion score: one point per measured frame (the first frame's 1.0 is a convention), above the
    # threshold line exactly for the frames the gate kept.
    line = next(e for e in svg.iter(f"{SVG}polyline") if e.get("id") == "motion-score")
    points = [tuple(map(float, p.split(","))) for p in line.get("points").split()]
    assert len(points) == s["frames_decoded"] - 1
    assert all(b[0] >= a[0] for a, b in zip(points, points[1:]))
    threshold = next(e for e in svg.iter(f"{SVG}line") if e.get("id") == "threshold-line")
    assert float(threshold.get("data-threshold")) == s["motion_threshold"]
    y_threshold = float(threshold.get("y1"))
    assert threshold.get("y2") == threshold.get("y1")
    above = [i for i, (_, y) in enumerate(points, 1) if y < y_threshold]
    assert above == kept[1:]
    # Kept frames, events and their boundaries, tree nodes per level, question markers.
    ticks = [int(a["data-frame"]) for a in page.select("line", "kept-frame")]
    assert ticks == kept and len(ticks) <= MAX_MARKS
    events = s["events"]
    assert [int(a["data-event"]) for a in page.select("rect", "event")] == [e["event"] for e in events]
    assert [float(a["data-t"]) for a in page.select("line", "event-boundary")] == [e["t_start"] for e in events[1:]]
    nodes = page.select("rect", "tree-node")
    assert sorted(int(a["data-node"]) for a in nodes) == sorted(n["node"] for n in extra["tree"])
    per_level = {}
    for a in nodes:
        per_level[a["data-level"]] = per_level.get(a["data-level"], 0) + 1
    assert per_level == s["nodes_per_level"]
    assert len(page.select("path", "question-marker")) == len(report["queries"]) == 3
    # Memory tree table and question cards, linked to the timeline by node and event ids.
    assert {a["id"] for a in page.select("tr") if a.get("id", "").startswith("node-")} == \
        {f"node-{n['node']}" for n in extra["tree"]}
    cards = page.select("div", "question")
    assert [a["id"] for a in cards] == ["q1", "q2", "q3"]
    for card, q in zip(cards, report["queries"]):
        retrieved = {n["node"] for n in q["tree_path"]} | ({q["tree_best"]["node"]} if q["tree_best"] else set())
        assert set(map(int, card["data-nodes"].split())) == retrieved
        assert set(map(int, card["data-events"].split())) == {e["event"] for e in q["knowledge"]}
        assert float(card["data-memory-time"]) == q["memory_time"]
    # Thumbnails: inline JPEGs of 128 px (long side); the gallery shows at most MAX_GALLERY kept frames.
    gallery_start = text.index('id="kept-thumbnails"')
    gallery = text[gallery_start:text.index("</div>", gallery_start)]
    assert gallery.count("<img") == len(kept[::math.ceil(len(kept) / MAX_GALLERY)]) <= MAX_GALLERY
    images = page.select("img")
    assert len(images) > MAX_GALLERY
    for img in images:
        assert img["src"].startswith("data:image/jpeg;base64,")
        pixels = cv2.imdecode(np.frombuffer(base64.b64decode(img["src"].split(",", 1)[1]), np.uint8), cv2.IMREAD_COLOR)
        assert pixels is not None and max(pixels.shape[:2]) == 128
    data = json.loads(page_text_between(text, '<script type="application/json" id="report-data">', "</script>"))
    assert len(data["t"]) == len(data["score"]) == len(data["kept"]) == s["frames_decoded"]
    assert data["duration"] == pytest.approx(40.0)


def page_text_between(text, start, end):
    i = text.index(start) + len(start)
    return text[i:text.index(end, i)]


def test_report_is_self_contained(run):
    text = run[2].read_text(encoding="utf-8")
    body = re.sub(r"data:image/jpeg;base64,[A-Za-z0-9+/=]+", "", text)
    links = set(re.findall(r"(?:https?:|ftp:)?//[\w.-]+[^\s\"'<>)]*", body)) - {"http://www.w3.org/2000/svg"}
    assert not links
    for needle in ("<link", "@import", "url(", "<iframe", "fetch(", "XMLHttpRequest", "src=\"http", "<base"):
        assert needle not in body, needle
    assert body.count("<script") == 2 and "<style>" in body


def test_cli_writes_the_report(run, tmp_path, capsys):
    clip = next(run[2].parent.glob("*.avi"))
    path = tmp_path / "r.html"
    assert main(["run", str(clip), "--no-progress", "--frame-encoder", "pixel", "--text-encoder", "hashing",
                 "--fps", "2", "--report", str(path)]) == 0
    assert f"wrote {path}" in capsys.readouterr().err
    assert path.stat().st_size > 10_000 and 'id="timeline"' in path.read_text(encoding="utf-8")
    with pytest.raises(FileNotFoundError, match="folder does not exist"):
        check_report_path(tmp_path / "missing" / "r.html")


def test_long_stream_is_drawn_compactly():
    """An hour at 5 fps: the score becomes a min/max envelope, the kept frames one path."""
    rng = np.random.default_rng(0)
    n = 18_000
    t = [i / 5.0 for i in range(n)]
    score = rng.uniform(0.0, 0.7, n).round(4).tolist()
    kept = [i == 0 or s > 0.35 for i, s in enumerate(score)]
    events = [{"event": k, "t_start": 360.0 * k, "t_end": 360.0 * k + 359.8, "caption": f"event {k} <b>&</b>"}
              for k in range(10)]
    tree = [{"node": k, "level": 0, "t_start": 36.0 * k, "t_end": 36.0 * k + 35.8, "caption": f"leaf {k}",
             "children": [], "first_frame": 180 * k} for k in range(100)]
    tree += [{"node": 100 + k, "level": 1, "t_start": 360.0 * k, "t_end": 360.0 * k + 359.8, "caption": f"parent {k}",
              "children": list(range(10 * k, 10 * k + 10)), "first_frame": 1800 * k} for k in range(10)]
    summary = {"video": "hour.mp4", "video_duration_s": 3600.0, "native_fps": 25.0, "decode_fps": 5.0,
               "frame_size": [320, 180], "preset": "base", "motion_threshold": 0.35, "frame_encoder": "pixel",
               "text_encoder": "hashing", "frames_decoded": n, "frames_kept": sum(kept), "events": events,
               "tree_levels": 2, "tree_nodes": 110, "nodes_per_level": {"0": 100, "1": 10},
               "real_time_factor": 0.5, "suggested_fps": None, "processed_fps": 50.0}
    extra = {"gate": {"t": t, "score": score, "kept": kept}, "thumbnails": {}, "tree": tree,
             "injector": InjectorConfig(), "short_term": ShortTermConfig(), "question_origin": "none"}
    text = render_report({"summary": summary, "queries": []}, extra)
    svg = _svg(text)
    envelope = [e for e in svg.iter(f"{SVG}polygon") if e.get("class") == "score-envelope"]
    assert len(envelope) == 1 and len(envelope[0].get("points").split()) <= 2 * 1000
    rug = [e for e in svg.iter(f"{SVG}path") if e.get("class") == "kept-frames"]
    assert len(rug) == 1 and int(rug[0].get("data-count")) == sum(kept) > MAX_MARKS
    assert not [e for e in svg.iter(f"{SVG}line") if e.get("class") == "kept-frame"]
    assert len([e for e in svg.iter(f"{SVG}rect") if e.get("class") == "tree-node"]) == 110
    assert "event 3 &lt;b&gt;&amp;&lt;/b&gt;" in text and "<b>&</b>" not in text  # captions are escaped
    data = json.loads(page_text_between(text, '<script type="application/json" id="report-data">', "</script>"))
    assert len(data["t"]) <= MAX_POINTS + sum(kept)
    assert len(text) < 1_500_000


# ---- in a real browser ------------------------------------------------------------
@pytest.fixture(scope="module")
def chromium():
    path = find_chromium()
    if path is None:
        pytest.skip("no Chromium found (apt-get install chromium, or set $CHROMIUM): the report was checked "
                    "without a browser only (test_report_structure_matches_the_run)")
    return path


_COUNTS = """({
  ready: document.body.dataset.ready,
  keptTicks: document.querySelectorAll('#timeline .kept-frame').length,
  boundaries: document.querySelectorAll('#timeline .event-boundary').length,
  treeNodes: document.querySelectorAll('#timeline .tree-node').length,
  markers: document.querySelectorAll('#timeline .question-marker').length,
  cards: document.querySelectorAll('.question').length,
  gallery: document.querySelectorAll('#kept-thumbnails img').length,
  images: Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight]),
  timeline: (() => { const r = document.getElementById('timeline').getBoundingClientRect();
                     return [r.left, r.top, r.width, r.height]; })(),
})"""


def test_report_in_headless_chromium(run, chromium, tmp_path):
    report, extra, path = run
    s = report["summary"]
    with Browser(chromium, width=1280, height=900) as browser:
        browser.load(path.as_uri())
        counts = browser.evaluate(_COUNTS)
        assert counts["ready"] == "1"  # the script ran to its end
        assert counts["keptTicks"] == s["frames_kept"] and counts["boundaries"] == len(s["events"]) - 1
        assert counts["treeNodes"] == s["tree_nodes"] and counts["markers"] == counts["cards"] == 3
        assert 0 < counts["gallery"] <= MAX_GALLERY
        assert counts["images"] and all(ok and max(w, h) == 128 for ok, w, h in counts["images"])
        left, top, width, height = counts["timeline"]
        assert width > 1000 and height > 200  # drawn at the page's width, aspect kept

        # Clicking a card highlights exactly its retrieved tree nodes and events, and its memory window.
        q = report["queries"][1]
        browser.evaluate("document.getElementById('q2').click()")
        hit_nodes = browser.evaluate("Array.from(document.querySelectorAll('.tree-node.hit')).map(e => +e.dataset.node)")
        hit_events = browser.evaluate("Array.from(document.querySelectorAll('.event.hit')).map(e => +e.dataset.event)")
        assert set(hit_nodes) == {n["node"] for n in q["tree_path"]} | {q["tree_best"]["node"]}
        assert set(hit_events) == {e["event"] for e in q["knowledge"]}
        window = browser.evaluate("[document.getElementById('memory-window').getAttribute('visibility'), "
                                  "+document.getElementById('memory-window').getAttribute('width')]")
        assert window[0] == "visible" and window[1] == pytest.approx((988 - 96) * q["memory_time"] / 40.0, abs=0.5)

        # The cursor read-out over the timeline's middle (20 s of 40).
        x = left + width * (96 + (988 - 96) / 2) / 1000
        browser.call("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": top + 60}, session=True)
        readout = browser.evaluate("document.getElementById('readout').textContent")
        assert re.match(r"t = (19|20)\.\d\d s; frame at \d+\.\d\d s: motion score \d\.\d{3} \((kept|dropped)\)",
                        readout), readout

        png = browser.screenshot(tmp_path / "report.png")
        errors = browser.console_errors()
        requests = browser.requests()
    assert errors == []
    assert requests and all(u == path.as_uri() or u.startswith("data:image/jpeg;base64,") for u in requests), \
        [u[:80] for u in requests if not u.startswith("data:")]
    shot = cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_COLOR)
    assert 1200 <= shot.shape[1] <= 1280 and shot.shape[0] > 2000  # the full page (less a scroll bar)
    band = shot[int(top):int(top + height), int(left):int(left + width)]
    assert band.std() > 20  # the timeline is drawn, not a blank box
