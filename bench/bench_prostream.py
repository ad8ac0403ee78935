"""ProStream over a dialogue stream: recall accuracy, question latency and memory against stream length.

Run:  nice .venv/bin/python -m pytest bench/bench_prostream.py -q -p no:cacheprovider \
          --benchmark-json bench/results/prostream.json
      (``STREAMMEM_BENCH_PROSTREAM_1E6=1``: also 10^6 turns, about 25 more minutes on two shared cores;
      ``STREAMMEM_BENCH_QUICK=1``: 10^3 and 10^4 turns, MiniLM at 10^3, no sweeps)
      ``python -m bench.quality run prostream``: ``-k test_recall_latency``, its rows saved for the record
      (bench/baseline/quality-prostream.json, bench/quality.py)

Data: :func:`streammem.recipes.prostream.synthetic_dialogue` (seed 0, the
default "varied" style) of N turns, N in {10^3, 10^4, 10^5} (and 10^6): topic
segments of chatter, sessions separated by pauses of 8-16 h, about one turn in
25 a planted fact about one of 200 (entity, attribute) subjects (40 entities
share 12 attributes; half of the subjects are later changed) stated in one of
13 forms, about one turn in 10 a distractor naming a planted subject (the
dialogue's own questions, negations and hypotheticals with another value,
mentions, asides with names and numbers), and min(400, N / 25) questions asked
mid-stream about near (<= 100 turns back), far (>= 500 turns back) and updated
facts (the latest value is the answer, earlier ones are superseded).  Texts are
embedded by the model-free hashing encoder (MiniLM on 10^5 turns would add
about 15 min on two shared cores; ``test_minilm_accuracy`` scores 10^3 and 10^4
turns with MiniLM when it is installed).  All methods get the same embeddings,
k = 5 and min_similarity, every question's text, and every question is asked
when it comes, from the memory of the turns up to then:

* ``prostream`` -- :class:`ProStream`, 6,000-token budget (keyed units from the
  default pattern extractor, the dialogue tree, retention by expected utility
  per token, beam recall beside the keyed units);
* ``recent`` -- flat RAG at the same budget: exact ``cosine_topk`` over the
  newest turns within 6,000 tokens;
* ``everything`` -- retrieve-everything: exact ``cosine_topk`` over every turn
  (unbounded memory; not run at 10^6, where it would hold 1.5 GB of embeddings
  beside the stream's own).

Measured per N and method: top-1 accuracy per question kind (the best recalled
item is the ground-truth turn or a unit it stated), stale answers (the best
item is a superseded version), hit@5, the in-stream recall latency of every
question (p20/p50/p80, question encoding excluded), push time per turn, and the
memory at the end (stored turns and units, tokens, peak tokens, the size of
``state_dict()`` serialised), with the load average before and after each
stream -- into ``extra_info`` and ``bench/results/prostream_summary[_quick].md``.
The pytest-benchmark rows (group ``prostream-recall-N<N>``) time 200 recalls
(the stream's questions, text and embedding) on each method's memory at the end of the stream, side by side (p20/p50/p80
also in ``prostream_recall[_quick].md``).  ``prostream_extraction.md``: what
the default extractor reads of the 10^5-turn stream, form by form, and what
it reads out of distractors.  ``prostream_budget_summary.md``: ProStream at
N = 10^4 with budgets of 1,000 to 12,000 tokens; at N = 10^5 without an
extractor (no units: the tree alone) and with ``key_weight=1`` (entity names
unused by recall); and on the earlier "plain" stream (no distractors, three
possessive forms) at 10^3 to 10^5, where the record before keyed units was
0.95 / 0.73 / 0.20.  torch runs on one intra-op thread (the machine has two
cores and is shared).
"""
import io
import os
import time

import numpy as np
import pytest
import torch

from bench import quality
from streammem.models.encoders import HashingTextEncoder  # noqa: E402
from streammem.recipes.prostream import (  # noqa: E402
    FACT_FORMS, PatternExtractor, ProStreamConfig, evaluate, synthetic_dialogue,
)

QUICK = os.environ.get("STREAMMEM_BENCH_QUICK") == "1"
MILLION = os.environ.get("STREAMMEM_BENCH_PROSTREAM_1E6") == "1" and not QUICK
SIZES = (1_000, 10_000) if QUICK else (1_000, 10_000, 100_000) + ((1_000_000,) if MILLION else ())
BUDGET = 6_000
RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
SWEEP_BUDGETS = (1_000, 1_500, 3_000, 12_000)
SUMMARY: list[dict] = []
END_RECALL: list[dict] = []
EXTRACTION: list[str] = []
SWEEP: list[dict] = []
_LOAD_BEFORE = os.getloadavg()
_STARTED, _LOAD_BEFORE_TEXT = time.time(), quality.load_average()


def methods_for(n: int) -> tuple[str, ...]:
    return ("prostream", "recent") if n >= 1_000_000 else ("prostream", "recent", "everything")


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


class _NoFacts:
    """An extractor that reads nothing: ProStream without keyed units (the dialogue tree alone)."""

    name = "none"

    def extract(self, text):
        return []

    def mentions(self, text):
        return []


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _state_kb(memory) -> float | None:
    if not hasattr(memory, "state_dict"):
        return None
    buffer = io.BytesIO()
    torch.save(memory.state_dict(), buffer)
    return buffer.tell() / 1024


def _row(m: dict) -> dict:
    kinds = m["by_kind"]
    summary = m.get("summary", {})
    memory = m.get("memory")
    return {
        **{f"{k}_correct": kinds[k]["correct"] for k in ("near", "far", "updated", "all") if k in kinds},
        **{f"{k}_n": kinds[k]["n"] for k in ("near", "far", "updated", "all") if k in kinds},
        "stale": kinds["all"]["stale"], "hit": kinds["all"]["hit"],
        **{f"stream_{p}_ms": v for p, v in m["latency_ms"].items()},
        "push_us_per_turn": m["push_us_per_turn"], "stored_turns": m["stored_turns"],
        "units": summary.get("stored", {}).get("units"), "memory_tokens": m["memory_tokens"],
        "peak_tokens": summary.get("peak_tokens"), "state_kb": _state_kb(memory) if memory is not None else None,
    }


def _stream(n: int, *, config: ProStreamConfig, methods, style: str = "varied", extractor=None,
            keep_memories: bool = True) -> tuple[dict, list, str]:
    encoder = HashingTextEncoder()
    dialogue = synthetic_dialogue(n, seed=0, style=style)
    load_before = _load()
    report = evaluate(dialogue.items, encoder, config=config, methods=methods, extractor=extractor,
                      keep_memories=keep_memories)
    texts = [x.question for x in dialogue.questions]
    return report, list(zip(texts, encoder.encode(texts))), f"{load_before} -> {_load()}"


@pytest.fixture(scope="module", params=SIZES, ids=lambda n: f"N{n}")
def streamed(request):
    n = request.param
    t0 = time.perf_counter()
    report, q, load = _stream(n, config=ProStreamConfig.for_encoder("hashing", budget=BUDGET),
                              methods=methods_for(n))
    wall = time.perf_counter() - t0
    for name in methods_for(n):
        SUMMARY.append({"encoder": "hashing", "N": n, "method": name, "wall_s": wall, "load": load,
                        **_row(report["methods"][name])})
    return n, report, q


@pytest.mark.parametrize("method", ("prostream", "recent", "everything"))
def test_recall_latency(benchmark, streamed, method):
    n, report, q = streamed
    if method not in report["methods"]:
        pytest.skip(f"{method} is not run at N = {n}")
    m = report["methods"][method]
    memory = m["memory"]
    state = {"i": 0}

    def recall():
        state["i"] = (state["i"] + 1) % len(q)
        text, embedding = q[state["i"]]
        return memory.recall(embedding, question=text)

    benchmark.group = f"prostream-recall-N{n}"
    benchmark.extra_info.update({"N": n, "method": method, "unit": "queries", "units": 1,
                                 **{k: v for k, v in _row(m).items() if k != "state_kb"}})
    benchmark.pedantic(recall, rounds=200, iterations=1, warmup_rounds=5)
    data = np.asarray(benchmark.stats.stats.data) * 1e3
    END_RECALL.append({"N": n, "method": method, **{f"p{p}": float(np.percentile(data, p)) for p in (20, 50, 80)},
                       "load": _load()})


def test_extractor_on_the_stream():
    """What the default extractor reads of the planted facts, form by form, and out of the distractors."""
    n = 10_000 if QUICK else 100_000
    d = synthetic_dialogue(n, seed=0)
    extractor, turns = PatternExtractor(), d.turns
    rows = {}
    for f in d.facts:
        got = [(x.entity, x.attribute, x.value) for x in extractor.extract(turns[f.turn].text)]
        r = rows.setdefault(f.form, [0, 0, 0, 0])
        r[0] += 1
        r[1] += got == [(f.entity, f.attribute, f.value)]
        r[2] += bool(got) and got != [(f.entity, f.attribute, f.value)]
        r[3] += not got
    EXTRACTION.append(f"Default extractor (PatternExtractor) on synthetic_dialogue({n:,}, seed=0): planted facts "
                      "by form (read = exactly the planted (entity, attribute, value)), and distractor turns.")
    EXTRACTION.append("")
    EXTRACTION.append("| form | example | facts | read | read wrong | not read |")
    EXTRACTION.append("|---|---|---|---|---|---|")
    for form in FACT_FORMS:
        r = rows.get(form, [0, 0, 0, 0])
        example = FACT_FORMS[form][0].format(E="Marlow", A="car", V="Fiat")
        EXTRACTION.append(f"| {form} | {example} | {r[0]:,} | {r[1]:,} | {r[2]:,} | {r[3]:,} |")
    total = [sum(r[i] for r in rows.values()) for i in range(4)]
    EXTRACTION.append(f"| all | | {total[0]:,} | {total[1]:,} ({total[1] / total[0]:.3f}) | {total[2]:,} | "
                      f"{total[3]:,} |")
    by_kind = {}
    for x in d.distractors:
        k = by_kind.setdefault(x.kind, [0, 0])
        k[0] += 1
        k[1] += bool(extractor.extract(turns[x.turn].text))
    EXTRACTION.append("")
    EXTRACTION.append("| distractor kind | turns | turns yielding a fact |")
    EXTRACTION.append("|---|---|---|")
    for kind, (count, yielded) in sorted(by_kind.items()):
        EXTRACTION.append(f"| {kind} | {count:,} | {yielded:,} |")


@pytest.mark.parametrize("n", (1_000,) if QUICK else (1_000, 10_000))
def test_minilm_accuracy(benchmark, n):
    """Accuracy with the real text encoder (the defaults are calibrated for it) on 10^3 and 10^4 turns."""
    try:
        from streammem.models.encoders import MiniLMTextEncoder

        encoder = MiniLMTextEncoder()
    except (ImportError, OSError) as exc:
        pytest.skip(f"MiniLM unavailable: {exc}")
    dialogue = synthetic_dialogue(n, seed=0)
    holder = {}

    def run():
        load_before = _load()
        holder["report"] = evaluate(dialogue.items, encoder, config=ProStreamConfig.for_encoder("minilm"),
                                    methods=("prostream", "recent", "everything"))
        holder["load"] = f"{load_before} -> {_load()}"

    benchmark.group = f"prostream-minilm-N{n}-stream"
    benchmark.pedantic(run, rounds=1, iterations=1)
    for name in ("prostream", "recent", "everything"):
        row = _row(holder["report"]["methods"][name])
        SUMMARY.append({"encoder": "all-MiniLM-L6-v2", "N": n, "method": name, "wall_s": None,
                        "load": holder["load"], **row})
        benchmark.extra_info[name] = {k: v for k, v in row.items() if k != "state_kb"}


@pytest.mark.skipif(QUICK, reason="four streams of 10^4 turns: full mode only")
@pytest.mark.parametrize("budget", SWEEP_BUDGETS)
def test_budget_sweep(budget):
    """ProStream at N = 10^4 against the token budget: where the units start competing for it."""
    report, _, load = _stream(10_000, config=ProStreamConfig.for_encoder("hashing", budget=budget),
                              methods=("prostream",))
    SWEEP.append({"what": f"budget {budget:,}", "N": 10_000, "load": load, **_row(report["methods"]["prostream"])})


@pytest.mark.skipif(QUICK, reason="streams of 10^5 turns: full mode only")
@pytest.mark.parametrize("variant", ("no extractor", "key_weight=1"))
def test_ablations(variant):
    """ProStream at N = 10^5 without keyed units, and with keyed units but entity names unused by recall."""
    config = ProStreamConfig.for_encoder("hashing", budget=BUDGET)
    extractor = None
    if variant == "no extractor":
        extractor = _NoFacts()
    else:
        config = config.replace(key_weight=1.0)
    report, _, load = _stream(100_000, config=config, methods=("prostream",), extractor=extractor)
    SWEEP.append({"what": variant, "N": 100_000, "load": load, **_row(report["methods"]["prostream"])})


@pytest.mark.skipif(QUICK, reason="the plain stream up to 10^5 turns: full mode only")
@pytest.mark.parametrize("n", (1_000, 10_000, 100_000))
def test_plain_stream(n):
    """ProStream on the earlier plain stream, where the record before keyed units was 0.95 / 0.73 / 0.20."""
    report, _, load = _stream(n, config=ProStreamConfig.for_encoder("hashing", budget=BUDGET),
                              methods=("prostream", "recent"), style="plain")
    for name in ("prostream", "recent"):
        SWEEP.append({"what": f"plain stream, {name}", "N": n, "load": load, **_row(report["methods"][name])})


@pytest.fixture(scope="session", autouse=True)
def _write_summary():
    yield
    suffix = "_quick" if QUICK else ""
    header = (f"ProStream bench, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average before "
              f"{'/'.join(f'{x:.1f}' for x in _LOAD_BEFORE)}, after {_load()}")
    if SUMMARY:
        _write(f"prostream_summary{suffix}", [header, ""] + _table(SUMMARY, "encoder", "method"))
    if END_RECALL:
        lines = [header, "", "Recall on each memory at the end of the stream, 200 recalls (pytest-benchmark, group "
                 "`prostream-recall-N<N>`), ms:", "", "| N turns | method | p20 | p50 | p80 | load after |",
                 "|---|---|---|---|---|---|"]
        lines += [f"| {r['N']:,} | {r['method']} | {r['p20']:.3f} | {r['p50']:.3f} | {r['p80']:.3f} | {r['load']} |"
                  for r in END_RECALL]
        _write(f"prostream_recall{suffix}", lines)
    if EXTRACTION:
        _write(f"prostream_extraction{suffix}", [header, ""] + EXTRACTION)
    if SWEEP:
        _write(f"prostream_budget_summary{suffix}", [header, ""] + _table(SWEEP, "what", None))
    if SUMMARY and quality.saving() and not QUICK:
        quality.save("prostream", _quality_tables(), about=QUALITY_ABOUT, started=_STARTED,
                     load_before=_LOAD_BEFORE_TEXT)


QUALITY_ABOUT = (
    "synthetic_dialogue(N, seed=0), the varied style (module docstring of bench/bench_prostream.py): planted facts "
    "about 200 subjects among chatter and distractors, questions asked mid-stream about near, far and updated facts. "
    "Top-1: the best recalled item is the ground-truth turn or a unit it stated; stale: a superseded value; hit@5: "
    "among the 5 recalled. prostream: ProStream at a 6,000-token budget; recent: flat RAG, exact cosine top-k over "
    "the newest turns within the same budget; everything: exact top-k over every turn (unbounded). Recall p50: "
    "in-stream, every question when it comes (question encoding excluded), and at the end of the stream (200 "
    "recalls); latencies depend on the load, the other columns do not.")


def _quality_tables() -> list[dict]:
    """The record's table (bench/quality.py): one row per encoder, stream length and method."""
    col = quality.column
    end = {(r["N"], r["method"]): r["p50"] for r in END_RECALL}
    rows = []
    for r in SUMMARY:
        def share(kind, r=r):
            n = r.get(f"{kind}_n")
            return None if n is None else quality.share(round(r[f"{kind}_correct"] * n), n)

        rows.append({"encoder": r["encoder"], "N": r["N"], "method": r["method"], "all": share("all"),
                     "near": share("near"), "far": share("far"), "updated": share("updated"), "stale": r["stale"],
                     "hit": r["hit"], "stream_p50": r["stream_p50_ms"],
                     "end_p50": end.get((r["N"], r["method"])) if r["encoder"] == "hashing" else None,
                     "peak_tokens": r["peak_tokens"] if r["peak_tokens"] is not None else r["memory_tokens"]})
    columns = [col("encoder", "encoder"), col("N", "turns", "int"), col("method", "method"),
               col("all", "top-1, all questions", "share"), col("near", "near", "share"), col("far", "far", "share"),
               col("updated", "updated", "share"), col("stale", "stale", "rate"), col("hit", "hit@5", "rate"),
               col("stream_p50", "recall p50 in stream", "ms"), col("end_p50", "recall p50 at the end", "ms"),
               col("peak_tokens", "memory tokens (prostream: peak)", "int")]
    return [{"title": "Top-1 recall of planted facts against stream length", "columns": columns, "rows": rows}]


def _table(rows: list[dict], first: str, method: str | None) -> list[str]:
    lines = [f"| {first} | N turns | {'method | ' if method else ''}near | far | updated | all | stale | hit@5 | "
             "recall p20 / p50 / p80 (ms) | push µs/turn | stored turns | units | memory tokens | peak tokens "
             "| state KB | load before -> after |",
             "|---|---|" + ("---|" if method else "") + "---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def acc(r, k):
        return "-" if r.get(f"{k}_correct") is None else f"{r[f'{k}_correct']:.3f} ({r[f'{k}_n']})"

    def opt(value, fmt):
        return "-" if value is None else format(value, fmt)

    for r in rows:
        lat = " / ".join(f"{r[f'stream_{p}_ms']:.2f}" for p in ("p20", "p50", "p80"))
        lines.append(f"| {r[first]} | {r['N']:,} | {r[method] + ' | ' if method else ''}{acc(r, 'near')} | "
                     f"{acc(r, 'far')} | {acc(r, 'updated')} | {acc(r, 'all')} | {r['stale']:.3f} | {r['hit']:.3f} | "
                     f"{lat} | {r['push_us_per_turn']:.0f} | {r['stored_turns']:,} | {opt(r['units'], ',')} | "
                     f"{r['memory_tokens']:,} | {opt(r['peak_tokens'], ',')} | {opt(r['state_kb'], ',.0f')} | "
                     f"{r['load']} |")
    return lines


def _write(name: str, lines: list[str]) -> None:
    os.makedirs(RESULTS_DIR, exist_ok=True)
    with open(os.path.join(RESULTS_DIR, f"{name}.md"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print("\n" + "\n".join(lines))
