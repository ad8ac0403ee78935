"""The HTML report of ``streammem run --report FILE.html``: one self-contained page.

Everything is inline (CSS, a small script, SVG drawn here, thumbnails as
``data:image/jpeg`` URIs), so the file can be mailed, archived or opened
offline; it loads nothing from the network.  The page works without its
script (the timeline is plain SVG with ``<title>`` tooltips and links); the
script adds a cursor read-out on the timeline and highlights a question's
retrieved memory when its card is clicked.

Sections:

* **Timeline** (one SVG, shared time axis in stream seconds): the motion score
  of every decoded frame (a min/max envelope beyond ``MAX_POINTS`` frames) with
  the threshold t and the kept frames as a rug; the knowledge-base events and
  their boundaries; one lane per memory-tree level; the questions' times.
* **Kept frames**: thumbnails (up to ``MAX_GALLERY``, evenly spaced).
* **Memory tree**: every node per level, its span, caption and children.
* **Events**: the knowledge base.
* **Questions**: each question, its answer, the injection scores and the
  retrieved context (short-term frames, tree path, events, dialogue) with
  thumbnails.

Element ids and classes the tests rely on: ``#timeline``, ``#motion-score``,
``#threshold-line``, ``.kept-frame`` (or one ``.kept-frames`` path with
``data-count`` beyond ``MAX_MARKS`` kept frames), ``.event``,
``.event-boundary``, ``.tree-node[data-node][data-level]``,
``.question-marker``, ``#kept-thumbnails``, ``.question[data-nodes][data-events]``,
``body[data-ready]`` (set by the script when it ran to the end).
"""
from __future__ import annotations

import base64
import bisect
import html
import json
import math
from pathlib import Path

__all__ = ["render_report", "write_report", "check_report_path", "MAX_POINTS", "MAX_MARKS", "MAX_GALLERY"]

MAX_POINTS = 1500  # score samples drawn one by one; beyond, a min/max envelope per column
MAX_MARKS = 1000  # kept frames drawn as one element each; beyond, one path
MAX_GALLERY = 60  # kept-frame thumbnails in the gallery
MAX_TREE_THUMBS = 200  # leaves with a thumbnail in the tree table

_W = 1000.0  # SVG user units
_X0, _X1 = 96.0, 988.0  # plot area
_PLOT_H = 150.0
_LANE_H = 22.0
_RUG_H = 12.0

_CSS = """
:root { --fg: #1d2330; --muted: #5b6474; --line: #d9dee7; --bg: #ffffff; --panel: #f5f7fa;
        --score: #2563eb; --thr: #dc2626; --kept: #059669; --ev1: #fde68a; --ev2: #bfdbfe; --hit: #f97316; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg);
       background: var(--bg); margin: 0 auto; max-width: 1180px; padding: 16px 24px 48px; }
h1 { font-size: 22px; margin: 8px 0 4px; }
h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid var(--line); }
h3 { font-size: 15px; margin: 0 0 6px; } h4 { font-size: 13px; margin: 10px 0 4px; color: var(--muted); }
.muted { color: var(--muted); } .small { font-size: 12px; }
table.facts { border-collapse: collapse; margin: 8px 0; }
table.facts td { padding: 2px 14px 2px 0; vertical-align: top; } table.facts td:first-child { color: var(--muted); }
table.rows { border-collapse: collapse; width: 100%; }
table.rows td, table.rows th { border-top: 1px solid var(--line); padding: 4px 8px; text-align: left;
                               vertical-align: middle; }
table.rows th { font-weight: 600; color: var(--muted); font-size: 12px; }
#timeline { width: 100%; height: auto; display: block; background: var(--panel); border-radius: 6px; }
#timeline text { font-size: 11px; fill: var(--muted); }
#timeline .lane-label { font-size: 11px; fill: var(--fg); }
#motion-score { fill: none; stroke: var(--score); stroke-width: 1.2; }
.score-envelope { fill: var(--score); opacity: 0.25; }
#threshold-line { stroke: var(--thr); stroke-width: 1.2; stroke-dasharray: 6 4; }
.kept-frame, .kept-frames { stroke: var(--kept); stroke-width: 1; }
.event { stroke: #fff; stroke-width: 1; } .event.odd { fill: var(--ev1); } .event.even { fill: var(--ev2); }
.event-boundary { stroke: #92400e; stroke-width: 1; stroke-dasharray: 3 3; opacity: 0.7; }
.tree-node { stroke: #fff; stroke-width: 1; cursor: pointer; }
.tree-node.hit, .event.hit { stroke: var(--hit); stroke-width: 3; }
.question-marker { fill: var(--hit); } .question-line { stroke: var(--hit); stroke-width: 1; opacity: 0.6; }
#cursor { stroke: var(--fg); stroke-width: 0.8; opacity: 0.6; }
.axis line { stroke: var(--line); } .window { fill: var(--hit); opacity: 0.12; }
.thumbs { display: flex; flex-wrap: wrap; gap: 6px; }
figure.thumb { margin: 0; width: 132px; }
figure.thumb img { width: 128px; height: auto; border-radius: 3px; display: block; }
figure.thumb figcaption { font-size: 11px; color: var(--muted); }
img.mini { width: 72px; height: auto; border-radius: 3px; display: block; }
.question { border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px; margin: 12px 0; cursor: pointer; }
.question.active { border-color: var(--hit); box-shadow: 0 0 0 2px rgba(249, 115, 22, 0.25); }
.answer { font-weight: 600; margin: 4px 0; }
details > summary { cursor: pointer; color: var(--muted); }
#readout { min-height: 1.4em; font-variant-numeric: tabular-nums; }
"""

_SCRIPT = r"""
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var svg = document.getElementById("timeline");
  var cursor = document.getElementById("cursor");
  var readout = document.getElementById("readout");
  function nearest(t) {
    var lo = 0, hi = data.t.length - 1;
    if (hi < 0) { return -1; }
    while (lo < hi) { var mid = (lo + hi) >> 1; if (data.t[mid] < t) { lo = mid + 1; } else { hi = mid; } }
    if (lo > 0 && Math.abs(data.t[lo - 1] - t) <= Math.abs(data.t[lo] - t)) { lo -= 1; }
    return lo;
  }
  svg.addEventListener("mousemove", function (ev) {
    var box = svg.getBoundingClientRect();
    var x = (ev.clientX - box.left) * data.width / box.width;
    if (x < data.x0 || x > data.x1) { cursor.setAttribute("visibility", "hidden"); return; }
    var t = (x - data.x0) / (data.x1 - data.x0) * data.duration;
    cursor.setAttribute("x1", x); cursor.setAttribute("x2", x); cursor.setAttribute("visibility", "visible");
    var i = nearest(t);
    readout.textContent = "t = " + t.toFixed(2) + " s" + (i < 0 ? "" : "; frame at " + data.t[i].toFixed(2) +
      " s: motion score " + data.score[i].toFixed(3) + (data.kept[i] ? " (kept)" : " (dropped)"));
  });
  svg.addEventListener("mouseleave", function () { cursor.setAttribute("visibility", "hidden"); });
  function select(card) {
    document.querySelectorAll(".hit").forEach(function (el) { el.classList.remove("hit"); });
    document.querySelectorAll(".question.active").forEach(function (el) { el.classList.remove("active"); });
    var win = document.getElementById("memory-window");
    if (!card) { win.setAttribute("visibility", "hidden"); return; }
    card.classList.add("active");
    card.dataset.nodes.split(" ").filter(Boolean).forEach(function (id) {
      document.querySelectorAll('.tree-node[data-node="' + id + '"]').forEach(function (el) {
        el.classList.add("hit");
      });
    });
    card.dataset.events.split(" ").filter(Boolean).forEach(function (id) {
      document.querySelectorAll('.event[data-event="' + id + '"]').forEach(function (el) { el.classList.add("hit"); });
    });
    var t = parseFloat(card.dataset.memoryTime);
    if (isFinite(t)) {
      var x = data.x0 + t / data.duration * (data.x1 - data.x0);
      win.setAttribute("x", data.x0); win.setAttribute("width", Math.max(0, x - data.x0));
      win.setAttribute("visibility", "visible");
    }
  }
  document.querySelectorAll(".question").forEach(function (card) {
    card.addEventListener("click", function () { select(card.classList.contains("active") ? null : card); });
  });
  document.body.dataset.ready = "1";
})();
"""


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _f(value: float) -> str:
    """SVG coordinate: short and locale-free."""
    return f"{value:.2f}".rstrip("0").rstrip(".") if math.isfinite(value) else "0"


def _data_uri(jpeg: bytes) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(jpeg).decode("ascii")


def _nice_step(span: float, target: int = 10) -> float:
    raw = max(span, 1e-9) / target
    magnitude = 10.0 ** math.floor(math.log10(raw))
    for m in (1.0, 2.0, 5.0, 10.0):
        if m * magnitude >= raw:
            return m * magnitude
    return 10.0 * magnitude


class _Frames:
    """Kept frames by time, and their thumbnails."""

    def __init__(self, gate: dict, thumbnails: dict[int, bytes]):
        self.index = [i for i, k in enumerate(gate["kept"]) if k]
        self.times = [gate["t"][i] for i in self.index]
        self.thumbnails = thumbnails

    def at_or_after(self, t: float) -> int | None:
        """The first kept frame at or after ``t`` that has a thumbnail (else the last before it)."""
        pos = bisect.bisect_left(self.times, t - 1e-6)
        for p in list(range(pos, min(pos + 3, len(self.index)))) + list(range(pos - 1, max(pos - 3, -1), -1)):
            if self.index[p] in self.thumbnails:
                return self.index[p]
        return None

    def img(self, index: int | None, t: float | None, css: str = "mini") -> str:
        if index is None or index not in self.thumbnails:
            return ""
        label = f"frame {index}" + ("" if t is None else f" at {t:.2f} s")
        return f'<img class="{css}" src="{_data_uri(self.thumbnails[index])}" alt="{_e(label)}" title="{_e(label)}">'


def _timeline(report: dict, extra: dict) -> tuple[str, dict]:
    s, queries = report["summary"], report["queries"]
    gate, tree = extra["gate"], extra["tree"]
    t_all, scores, kept = gate["t"], gate["score"], gate["kept"]
    duration = max(float(s["video_duration_s"]), t_all[-1] if t_all else 0.0, 1e-6)
    threshold = float(s["motion_threshold"])

    def x(t: float) -> float:
        return _X0 + (_X1 - _X0) * min(max(t, 0.0), duration) / duration

    levels = sorted({n["level"] for n in tree}, reverse=True)
    y_plot = 10.0
    y_rug = y_plot + _PLOT_H + 4
    y_events = y_rug + _RUG_H + 6
    y_tree = y_events + _LANE_H + 6
    y_questions = y_tree + len(levels) * (_LANE_H + 4) + 2
    y_axis = y_questions + _LANE_H + 4
    height = y_axis + 24
    parts = [f'<svg id="timeline" viewBox="0 0 {_f(_W)} {_f(height)}" xmlns="http://www.w3.org/2000/svg" '
             f'role="img" aria-label="timeline of the stream">']

    # Motion score (the first frame's 1.0 is a convention, not a measurement: not drawn).
    measured = list(range(1, len(t_all)))
    top = max([scores[i] for i in measured] + [threshold]) * 1.15 or 1.0

    def y(v: float) -> float:
        return y_plot + _PLOT_H * (1.0 - min(v, top) / top)

    parts.append(f'<text class="lane-label" x="4" y="{_f(y_plot + 12)}">motion score</text>')
    for v in (0.0, threshold, top / 1.15):
        parts.append(f'<text x="{_f(_X0 - 4)}" y="{_f(y(v) + 4)}" text-anchor="end">{v:.2f}</text>')
    if len(measured) <= MAX_POINTS:
        points = " ".join(f"{_f(x(t_all[i]))},{_f(y(scores[i]))}" for i in measured)
        parts.append(f'<polyline id="motion-score" points="{points}"/>')
    else:
        columns: dict[int, list[float]] = {}
        for i in measured:
            columns.setdefault(int((x(t_all[i]) - _X0) / 1.0), []).append(scores[i])
        cols = sorted(columns)
        upper = [f"{_f(_X0 + c)},{_f(y(max(columns[c])))}" for c in cols]
        lower = [f"{_f(_X0 + c)},{_f(y(min(columns[c])))}" for c in reversed(cols)]
        parts.append(f'<polygon class="score-envelope" points="{" ".join(upper + lower)}"/>')
        parts.append(f'<polyline id="motion-score" points="{" ".join(upper)}"/>')
    parts.append(f'<line id="threshold-line" data-threshold="{threshold}" x1="{_f(_X0)}" x2="{_f(_X1)}" '
                 f'y1="{_f(y(threshold))}" y2="{_f(y(threshold))}"><title>threshold t = {threshold}: a frame is '
                 f'kept when its motion score exceeds it</title></line>')

    # Kept frames: a rug under the plot.
    parts.append(f'<text class="lane-label" x="4" y="{_f(y_rug + 10)}">kept frames</text>')
    kept_idx = [i for i, k in enumerate(kept) if k]
    if len(kept_idx) <= MAX_MARKS:
        for i in kept_idx:
            note = " (first frame, kept by definition)" if i == 0 else f", score {scores[i]:.3f}"
            parts.append(f'<line class="kept-frame" data-frame="{i}" x1="{_f(x(t_all[i]))}" x2="{_f(x(t_all[i]))}" '
                         f'y1="{_f(y_rug)}" y2="{_f(y_rug + _RUG_H)}"><title>frame {i} at {t_all[i]:.2f} s'
                         f'{note}</title></line>')
    else:
        d = " ".join(f"M{_f(x(t_all[i]))} {_f(y_rug)}v{_f(_RUG_H)}" for i in kept_idx)
        parts.append(f'<path class="kept-frames" data-count="{len(kept_idx)}" d="{d}"/>')

    # Events and their boundaries.
    parts.append(f'<text class="lane-label" x="4" y="{_f(y_events + 15)}">events</text>')
    events = s["events"]
    for k, ev in enumerate(events):
        x0, x1 = x(ev["t_start"]), x(ev["t_end"])
        parts.append(f'<rect class="event {"odd" if k % 2 else "even"}" data-event="{ev["event"]}" x="{_f(x0)}" '
                     f'y="{_f(y_events)}" width="{_f(max(x1 - x0, 1.5))}" height="{_f(_LANE_H)}">'
                     f'<title>event {ev["event"]}: {_e(ev["caption"])}</title></rect>')
    for ev in events[1:]:
        bx = x(ev["t_start"])
        parts.append(f'<line class="event-boundary" data-t="{ev["t_start"]}" x1="{_f(bx)}" x2="{_f(bx)}" '
                     f'y1="{_f(y_plot)}" y2="{_f(y_questions - 2)}"><title>event boundary at {ev["t_start"]:.2f} s'
                     f'</title></line>')

    # Memory tree: one lane per level, the highest on top.
    colours = ["#a7f3d0", "#c4b5fd", "#fbcfe8", "#fed7aa", "#bae6fd"]
    for row, level in enumerate(levels):
        ly = y_tree + row * (_LANE_H + 4)
        parts.append(f'<text class="lane-label" x="4" y="{_f(ly + 15)}">tree level {level}</text>')
        for n in (n for n in tree if n["level"] == level):
            x0, x1 = x(n["t_start"]), x(n["t_end"])
            w = max(x1 - x0, 2.0)
            label = ""
            if w > 60:
                text = _caption_text(n["caption"])
                room = int(w / 6.2)
                text = text if len(text) <= room else text[: max(room - 1, 1)] + "…"
                label = f'<text x="{_f(x0 + 4)}" y="{_f(ly + 15)}" style="fill:#1d2330">{_e(text)}</text>'
            parts.append(f'<a href="#node-{n["node"]}"><rect class="tree-node" data-node="{n["node"]}" '
                         f'data-level="{level}" x="{_f(x0)}" y="{_f(ly)}" width="{_f(w)}" height="{_f(_LANE_H)}" '
                         f'fill="{colours[level % len(colours)]}"><title>node {n["node"]} (level {level}): '
                         f'{_e(n["caption"])}</title></rect>{label}</a>')

    # Questions.
    parts.append(f'<text class="lane-label" x="4" y="{_f(y_questions + 15)}">questions</text>')
    for k, q in enumerate(queries, 1):
        t = q["asked_at"] if q["asked_at"] is not None else duration
        qx = x(t)
        parts.append(f'<line class="question-line" x1="{_f(qx)}" x2="{_f(qx)}" y1="{_f(y_plot)}" '
                     f'y2="{_f(y_questions)}"/>')
        parts.append(f'<a href="#q{k}"><path class="question-marker" data-q="{k}" d="M{_f(qx)} {_f(y_questions + 2)}'
                     f'l-6 10h12z"><title>Q{k} at {t:.2f} s: {_e(q["question"])}</title></path>'
                     f'<text x="{_f(qx + 7 if qx < _X1 - 30 else qx - 7)}" y="{_f(y_questions + 12)}" '
                     f'text-anchor="{"start" if qx < _X1 - 30 else "end"}">Q{k}</text></a>')

    # Time axis.
    step = _nice_step(duration)
    parts.append('<g class="axis">')
    tick = 0.0
    while tick <= duration + 1e-9:
        tx = x(tick)
        parts.append(f'<line x1="{_f(tx)}" x2="{_f(tx)}" y1="{_f(y_plot)}" y2="{_f(y_axis)}"/>'
                     f'<text x="{_f(tx)}" y="{_f(y_axis + 14)}" text-anchor="middle">{tick:g} s</text>')
        tick += step
    parts.append("</g>")
    parts.append(f'<rect id="memory-window" class="window" x="{_f(_X0)}" y="{_f(y_plot)}" width="0" '
                 f'height="{_f(y_questions - y_plot)}" visibility="hidden"/>')
    parts.append(f'<line id="cursor" x1="0" x2="0" y1="{_f(y_plot)}" y2="{_f(y_axis)}" visibility="hidden"/>')
    parts.append("</svg>")

    # Data for the cursor read-out, thinned to about MAX_POINTS samples.
    stride = max(1, math.ceil(len(t_all) / MAX_POINTS))
    keep = sorted(set(range(0, len(t_all), stride)) | set(kept_idx[:MAX_POINTS]))
    data = {"width": _W, "x0": _X0, "x1": _X1, "duration": duration,
            "t": [round(t_all[i], 3) for i in keep], "score": [round(scores[i], 4) for i in keep],
            "kept": [bool(kept[i]) for i in keep]}
    return "".join(parts), data


def _facts(report: dict) -> str:
    s = report["summary"]
    pct = 100.0 * s["frames_kept"] / max(1, s["frames_decoded"])
    rtf = s["real_time_factor"]
    speed = f"{rtf:.2f} ({'slower' if rtf > 1 else 'faster'} than real time)"
    if rtf > 1 and s["suggested_fps"] is not None:
        speed += f"; try --fps {s['suggested_fps']:g}"
    rate = "every frame" if s["decode_fps"] is None else f"at {s['decode_fps']:g} fps"
    rows = [("interrupted", "Ctrl-C stopped the run: this page covers the frames streamed until then")] \
        if s.get("interrupted") else []
    rows += [
        ("video", f"{s['video']} ({s['video_duration_s']:.2f} s, {s['native_fps']:g} fps)"),
        ("decoded", f"{s['frames_decoded']} frames ({rate})"),
        ("kept by the motion gate", f"{s['frames_kept']} ({pct:.0f}%), threshold t = {s['motion_threshold']}"),
        ("preset, encoders", f"{s['preset']}; {s['frame_encoder']} (frames), {s['text_encoder']} (text)"),
        ("knowledge base", f"{len(s['events'])} events"),
        ("memory tree", f"{s['tree_levels']} levels, {s['tree_nodes']} nodes"),
        ("real-time factor", f"{speed}; {s['processed_fps']} frames/s"),
    ]
    body = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in rows)
    return f'<table class="facts" id="facts">{body}</table>'


def _span(a: float, b: float) -> str:
    return f"{a:.2f}–{b:.2f} s"


def _gallery(frames: _Frames) -> str:
    with_thumb = [i for i in frames.index if i in frames.thumbnails]
    if not with_thumb:
        return '<p class="muted" id="kept-thumbnails">No thumbnails recorded.</p>'
    step = max(1, math.ceil(len(with_thumb) / MAX_GALLERY))
    shown = with_thumb[::step]
    times = dict(zip(frames.index, frames.times))
    figs = "".join(f'<figure class="thumb">{frames.img(i, times[i], "")}<figcaption>{times[i]:.2f} s · frame {i}'
                   f'</figcaption></figure>' for i in shown)
    note = "" if len(shown) == len(frames.index) else (f'<p class="muted small">{len(shown)} of '
                                                       f'{len(frames.index)} kept frames, evenly spaced.</p>')
    return f'{note}<div class="thumbs" id="kept-thumbnails">{figs}</div>'


def _tree_section(extra: dict, frames: _Frames) -> str:
    tree = extra["tree"]
    if not tree:
        return '<p class="muted">The memory tree is empty.</p>'
    leaves = sum(1 for n in tree if n["level"] == 0)
    thumbs = leaves <= MAX_TREE_THUMBS
    out = []
    for level in sorted({n["level"] for n in tree}, reverse=True):
        nodes = [n for n in tree if n["level"] == level]
        rows = []
        for n in nodes:
            img = frames.img(n["first_frame"], None) if thumbs and level == 0 else ""
            children = ", ".join(str(c) for c in n["children"]) or "–"
            rows.append(f'<tr id="node-{n["node"]}"><td>{n["node"]}</td><td>{_span(n["t_start"], n["t_end"])}</td>'
                        f'<td>{img}</td><td>{_e(_caption_text(n["caption"]))}</td><td>{children}</td></tr>')
        name = "leaves (chunks of kept frames)" if level == 0 else "parents of the level below"
        opened = " open" if len(nodes) <= 40 else ""
        out.append(f'<details{opened} class="tree-level" data-level="{level}"><summary>level {level}: {len(nodes)} '
                   f'nodes, {name}</summary><table class="rows"><tr><th>node</th><th>span</th><th></th>'
                   f'<th>caption</th><th>children</th></tr>{"".join(rows)}</table></details>')
    return "".join(out)


def _events_section(report: dict, frames: _Frames) -> str:
    events = report["summary"]["events"]
    if not events:
        return '<p class="muted">No event closed.</p>'
    rows = "".join(f'<tr id="event-{e["event"]}"><td>{e["event"]}</td><td>{_span(e["t_start"], e["t_end"])}</td>'
                   f'<td>{frames.img(frames.at_or_after(e["t_start"]), None)}</td>'
                   f'<td>{_e(_caption_text(e["caption"]))}</td></tr>' for e in events)
    return f'<table class="rows"><tr><th>event</th><th>span</th><th></th><th>caption</th></tr>{rows}</table>'


_MODES = {"latest": "only the latest event", "top3": "the best 3 events", "top5": "the best 5 events"}


def _memory_row(anchor: str, ident, cells: list[str], item: dict, frames: _Frames, score: float) -> str:
    """One row of a retrieved tree node or event: id link, cells, span, thumbnail, caption, cosine."""
    thumb = frames.img(frames.at_or_after(item["t_start"]), None)
    return (f'<tr><td><a href="#{anchor}-{ident}">{ident}</a></td>{"".join(f"<td>{c}</td>" for c in cells)}'
            f'<td>{_span(item["t_start"], item["t_end"])}</td><td>{thumb}</td>'
            f'<td>{_e(_caption_text(item["caption"]))}</td><td>{score:.3f}</td></tr>')


def _question_card(k: int, q: dict, frames: _Frames, injector, short_term) -> str:
    at = "after the end of the video" if q["asked_at"] is None else f"at {q['asked_at']:.2f} s"
    memory_time = "" if q["memory_time"] is None else repr(float(q["memory_time"]))
    nodes = {n["node"] for n in q["tree_path"]} | ({q["tree_best"]["node"]} if q["tree_best"] else set())
    events = {e["event"] for e in q["knowledge"]}
    i = q["injection"]
    memory = "empty" if q["memory_time"] is None else f"frames up to {q['memory_time']:.2f} s"
    injection = (f"knowledge injection: {_MODES[i['mode']]} (S_t {i['s_t']:.2f}: how much the question is about "
                 f"now; S_r {i['s_r']:.2f}: how well the events match; S_c = {injector.gamma:g}·S_t + "
                 f"{1 - injector.gamma:g}·(1 − S_r) = {i['s_c']:.2f}; the latest event above {injector.theta1:g}, "
                 f"the best 3 above {injector.theta2:g})")
    parts = [f'<div class="question" id="q{k}" data-nodes="{" ".join(map(str, sorted(nodes)))}" '
             f'data-events="{" ".join(map(str, sorted(events)))}" data-memory-time="{memory_time}">',
             f'<h3>Q{k} {_e(at)}: {_e(q["question"])}</h3>',
             f'<p class="answer">A: {_e(q["answer"])} <span class="muted small">(extractive, from '
             f'{_e(q["answer_source"].replace("_", "-"))})</span></p>',
             f'<p class="muted small">memory: {memory} · RPD {q["rpd_ms"]:.1f} ms · {_e(injection)} · click to '
             f'highlight on the timeline</p>']
    if q["short_term"]:
        figs = "".join(f'<figure class="thumb">{frames.img(f["frame"], f["t"], "")}<figcaption>{f["t"]:.2f} s · '
                       f'{_e(", ".join(f["labels"][:2]) or "frame " + str(f["frame"]))}</figcaption></figure>'
                       for f in q["short_term"])
        parts.append(f'<h4>Short-term frames ({short_term.keep} of the {short_term.candidates} newest kept frames, '
                     f'newer ones more likely)</h4><div class="thumbs">{figs}</div>')
    best = q["tree_best"]["node"] if q["tree_best"] else None
    rows = [_memory_row("node", n["node"], [str(n["level"]) + (" (best)" if n["node"] == best else "")], n, frames,
                        n["score"]) for n in q["tree_path"]]
    if rows:
        parts.append('<h4>Memory tree path (root to leaf; cos = cosine to the question)</h4><table class="rows">'
                     '<tr><th>node</th><th>level</th><th>span</th><th></th><th>caption</th><th>cos</th></tr>'
                     + "".join(rows) + "</table>")
    if q["knowledge"]:
        rows = [_memory_row("event", e["event"], [], e, frames, e["score"]) for e in q["knowledge"]]
        parts.append('<h4>Knowledge-base events</h4><table class="rows"><tr><th>event</th><th>span</th><th></th>'
                     '<th>caption</th><th>cos</th></tr>' + "".join(rows) + "</table>")
    if q["dialogue"]:
        rows = "".join(f'<tr><td>{_e(d["question"])}</td><td>{_e(d["answer"])}</td><td>{d["score"]:.3f}</td></tr>'
                       for d in q["dialogue"])
        parts.append(f'<h4>Earlier dialogue</h4><table class="rows"><tr><th>question</th><th>answer</th><th>cos</th>'
                     f'</tr>{rows}</table>')
    if not (q["short_term"] or q["tree_path"] or q["knowledge"]):
        parts.append('<p class="muted">Nothing in memory yet.</p>')
    parts.append("</div>")
    return "".join(parts)


def render_report(report: dict, extra: dict) -> str:
    """The page (a str) for the JSON ``report`` of ``streammem run`` and its ``extra`` data.

    ``extra`` holds ``gate`` ({"t", "score", "kept"}: one entry per decoded
    frame), ``thumbnails`` ({decoded-frame index: JPEG bytes}), ``tree`` (nodes:
    node, level, t_start, t_end, caption, children, first_frame),
    ``injector`` and ``short_term`` (the ``InjectorConfig`` and ``ShortTermConfig``)
    and ``question_origin``.
    """
    s = report["summary"]
    frames = _Frames(extra["gate"], extra.get("thumbnails") or {})
    svg, data = _timeline(report, extra)
    name = Path(s["video"]).name
    cards = "".join(_question_card(k, q, frames, extra["injector"], extra["short_term"])
                    for k, q in enumerate(report["queries"], 1))
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    thr = s["motion_threshold"]
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>streammem report: {_e(name)}</title>
<style>{_CSS}</style>
</head>
<body>
<h1>streammem report: {_e(name)}</h1>
<p class="muted">All times are stream seconds: the video's own timestamps. Each question is answered from the
memory of the frames up to its time.</p>
{_facts(report)}
<h2 id="timeline-title">Timeline</h2>
{svg}
<p id="readout" class="muted small"></p>
<p class="muted small">Motion score: Lucas–Kanade motion of each decoded frame against the previous one; a frame is
kept when it exceeds the threshold t = {_e(thr)} (dashed red), and the first frame is always kept (green ticks:
kept frames). Events: the knowledge base's segments of the kept frames, dashed lines at their boundaries.
Tree: level 0 leaves are chunks of kept frames, each higher level groups the nodes below it. Click a question
below to see what its answer could use.</p>
<h2>Kept frames</h2>
{_gallery(frames)}
<h2>Memory tree</h2>
<div id="memory-tree">{_tree_section(extra, frames)}</div>
<h2>Events (knowledge base)</h2>
<div id="events">{_events_section(report, frames)}</div>
<h2>Questions</h2>
<p class="muted small">{_e(len(report["queries"]))} questions, {_e(extra.get("question_origin", ""))}.</p>
<div id="questions">{cards or '<p class="muted">No questions asked.</p>'}</div>
<script type="application/json" id="report-data">{payload}</script>
<script>{_SCRIPT}</script>
</body>
</html>
"""


def _caption_text(caption: str) -> str:
    """``components.memory.caption_text``, imported when a page is rendered (that module imports torch, and
    ``check_report_path`` runs before torch is loaded)."""
    from ..components.memory import caption_text

    return caption_text(caption)


def check_report_path(path) -> Path:
    """``path`` as a Path; ValueError unless it names an .html file, FileNotFoundError if its folder is missing."""
    path = Path(path)
    if path.suffix.lower() not in (".html", ".htm"):
        raise ValueError(f"--report must name an .html file, got {str(path)!r}")
    if not path.parent.is_dir():
        raise FileNotFoundError(f"--report folder does not exist: {path.parent}")
    return path


def write_report(path, report: dict, extra: dict) -> Path:
    """Write ``render_report(report, extra)`` to ``path`` (UTF-8); returns the path."""
    path = check_report_path(path)
    path.write_text(render_report(report, extra), encoding="utf-8")
    return path
