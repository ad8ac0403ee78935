"""ProStream over a dialogue stream: recall accuracy and question latency against stream length.

Run:  .venv/bin/python -m pytest bench/bench_prostream.py -q -p no:cacheprovider --benchmark-json bench/results/prostream.json
      (``STREAMMEM_BENCH_QUICK=1``: 10^3 and 10^4 turns, MiniLM at 10^3, no budget sweep)

Data: :func:`streammem.prostream.synthetic_dialogue` (seed 0) of N turns, N in
{10^3, 10^4, 10^5}: topic segments of chatter, sessions separated by pauses of
8-16 h, about one turn in 25 a planted fact (an entity's attribute, later
changed for half of the subjects), and min(400, N / 25) questions asked
mid-stream about near (<= 100 turns back), far (>= 500 turns back) and updated
facts (the latest value is the answer, earlier ones are superseded).  Texts are
embedded by the model-free hashing encoder (MiniLM on 10^5 turns would add
about 15 min to the run on two shared cores; ``test_minilm_accuracy`` scores 10^3 and 10^4 turns
with MiniLM when it is installed).  All methods get the same embeddings, k = 5 and
min_similarity, and every question is asked when it comes, from the memory of
the turns up to then:

* ``prostream`` -- :class:`ProStream` with a 6,000-token budget (drift segments,
  extractive summaries, utility eviction, supersession, beam recall);
* ``everything`` -- retrieve-everything: exact ``cosine_topk`` over every turn
  (unbounded memory);
* ``recent`` -- the newest turns within the same 6,000 tokens, ``cosine_topk``
  over a view of them.

Measured per N and method: top-1 accuracy per question kind (the best recalled
turn is the ground-truth turn), stale answers (the best turn is a superseded
version), the in-stream recall latency of every question (p20/p50/p80, question
encoding excluded), push time per turn and the memory held at the end -- into
``extra_info`` and ``bench/results/prostream_summary[_quick].md``.  The
pytest-benchmark rows (group ``prostream-recall-N<N>``) time recalls on each
method's memory at the end of the stream, cycling through the stream's
question embeddings, side by side.  ``test_budget_sweep`` repeats ProStream at
N = 10^4 with budgets of 3,000, 12,000 and 48,000 tokens
(``prostream_budget_summary.md``), and ``test_supersession_off`` at N = 10^4
without supersession.  torch runs on one intra-op thread (the
machine has two cores and is shared).
"""
import os
import time

import pytest
import torch

from streammem.models.encoders import HashingTextEncoder  # noqa: E402
from streammem.recipes.prostream import ProStreamConfig, evaluate, synthetic_dialogue  # noqa: E402

QUICK = os.environ.get("STREAMMEM_BENCH_QUICK") == "1"
SIZES = (1_000, 10_000) if QUICK else (1_000, 10_000, 100_000)
METHODS = ("prostream", "everything", "recent")
RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
BUDGETS = (3_000, 12_000, 48_000)
SUMMARY: list[dict] = []
BUDGET_SUMMARY: list[dict] = []
_LOAD_BEFORE = os.getloadavg()


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=SIZES, ids=lambda n: f"N{n}")
def streamed(request):
    n = request.param
    encoder = HashingTextEncoder()
    dialogue = synthetic_dialogue(n, seed=0)
    t0 = time.perf_counter()
    report = evaluate(dialogue.items, encoder, config=ProStreamConfig.for_encoder("hashing"), methods=METHODS,
                      keep_memories=True)
    wall = time.perf_counter() - t0
    q = encoder.encode([x.question for x in dialogue.questions])
    for name in METHODS:
        m = report["methods"][name]
        SUMMARY.append({"encoder": "hashing", "N": n, "method": name, "wall_s": wall, **_row(m)})
    return n, report, q


def _row(m: dict) -> dict:
    kinds = m["by_kind"]
    return {
        **{f"{k}_correct": kinds[k]["correct"] for k in ("near", "far", "updated", "all") if k in kinds},
        **{f"{k}_n": kinds[k]["n"] for k in ("near", "far", "updated", "all") if k in kinds},
        "stale": kinds["all"]["stale"], "hit": kinds["all"]["hit"],
        **{f"stream_{p}_ms": v for p, v in m["latency_ms"].items()},
        "push_us_per_turn": m["push_us_per_turn"], "stored_turns": m["stored_turns"],
        "memory_tokens": m["memory_tokens"],
    }


@pytest.mark.parametrize("method", METHODS)
def test_recall_latency(benchmark, streamed, method):
    n, report, q = streamed
    m = report["methods"][method]
    memory = m["memory"]
    state = {"i": 0}

    def recall():
        state["i"] = (state["i"] + 1) % q.shape[0]
        return memory.recall(q[state["i"]])

    benchmark.group = f"prostream-recall-N{n}"
    benchmark.extra_info.update({"N": n, "method": method, "unit": "queries", "units": 1, **_row(m)})
    benchmark.pedantic(recall, rounds=200, iterations=1, warmup_rounds=5)


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
        holder["report"] = evaluate(dialogue.items, encoder, config=ProStreamConfig.for_encoder("minilm"),
                                    methods=METHODS)

    benchmark.group = f"prostream-minilm-N{n}-stream"
    benchmark.pedantic(run, rounds=1, iterations=1)
    for name in METHODS:
        row = _row(holder["report"]["methods"][name])
        SUMMARY.append({"encoder": "all-MiniLM-L6-v2", "N": n, "method": name, "wall_s": None, **row})
        benchmark.extra_info[name] = row


@pytest.mark.skipif(QUICK, reason="three streams of 10^4 turns: full mode only")
@pytest.mark.parametrize("budget", BUDGETS)
def test_budget_sweep(benchmark, budget):
    """Accuracy and recall latency against the token budget at N = 10^4 (the budget is the knob)."""
    n = 10_000
    encoder = HashingTextEncoder()
    dialogue = synthetic_dialogue(n, seed=0)
    report = evaluate(dialogue.items, encoder, config=ProStreamConfig.for_encoder("hashing", budget=budget),
                      methods=("prostream",), keep_memories=True)
    m = report["methods"]["prostream"]
    row = _row(m)
    BUDGET_SUMMARY.append({"encoder": "hashing", "N": n, "method": f"prostream, budget {budget:,}", **row})
    q = encoder.encode([x.question for x in dialogue.questions])
    state = {"i": 0}

    def recall():
        state["i"] = (state["i"] + 1) % q.shape[0]
        return m["memory"].recall(q[state["i"]])

    benchmark.group = f"prostream-recall-N{n}-budget"
    benchmark.extra_info.update({"N": n, "budget": budget, "unit": "queries", "units": 1, **row})
    benchmark.pedantic(recall, rounds=200, iterations=1, warmup_rounds=5)


@pytest.mark.skipif(QUICK, reason="10^4 turns: full mode only")
def test_supersession_off():
    """ProStream at N = 10^4 without supersession (theta_update=None): what the cosine rule costs and buys."""
    dialogue = synthetic_dialogue(10_000, seed=0)
    config = ProStreamConfig.for_encoder("hashing", theta_update=None)
    report = evaluate(dialogue.items, HashingTextEncoder(), config=config, methods=("prostream",))
    BUDGET_SUMMARY.append({"encoder": "hashing", "N": 10_000, "method": "prostream, theta_update=None",
                           **_row(report["methods"]["prostream"])})


@pytest.fixture(scope="session", autouse=True)
def _write_summary():
    yield
    for rows, name in ((SUMMARY, "prostream_summary"), (BUDGET_SUMMARY, "prostream_budget_summary")):
        if rows:
            _write_table(rows, name)


def _write_table(rows: list[dict], name: str) -> None:
    load_after = os.getloadavg()
    lines = [f"ProStream bench, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average before "
             f"{'/'.join(f'{x:.1f}' for x in _LOAD_BEFORE)}, after {'/'.join(f'{x:.1f}' for x in load_after)}",
             "",
             "| encoder | N turns | method | near | far | updated | all | stale | recall p20 / p50 / p80 (ms) "
             "| push µs/turn | stored turns | memory tokens |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def acc(r, k):
        return "-" if r.get(f"{k}_correct") is None else f"{r[f'{k}_correct']:.2f} ({r[f'{k}_n']})"

    for r in rows:
        lat = " / ".join(f"{r[f'stream_{p}_ms']:.2f}" for p in ("p20", "p50", "p80"))
        lines.append(f"| {r['encoder']} | {r['N']:,} | {r['method']} | {acc(r, 'near')} | {acc(r, 'far')} | "
                     f"{acc(r, 'updated')} | {acc(r, 'all')} | {r['stale']:.2f} | {lat} | "
                     f"{r['push_us_per_turn']:.0f} | {r['stored_turns']:,} | {r['memory_tokens']:,} |")
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f"{name}{'_quick' if QUICK else ''}.md")
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print("\n" + "\n".join(lines))
