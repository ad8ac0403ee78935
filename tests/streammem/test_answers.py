"""The model-free answer and the stream's question form: ``extractive_answer`` on a stream context,
``caption_text``, ``parse_query`` with the sample clip's questions; and abstention's pieces: the words of a
question, grounding, the calibration's fit and threshold, the report."""
import math

import numpy as np
import pytest

from streammem import HashingTextEncoder, extractive_answer
from streammem.components.answers import (
    NOT_IN_MEMORY_ANSWER, AbstentionRow, Calibration, Outcome, WordVectors, abstention_report, answer_features,
    choose_threshold, content_words, extractive_choice, grounding, proper_names,
)
from streammem.components.memory import caption_text
from streammem.stream.questions import SAMPLE_QUERIES, parse_query, split_stream_time


def test_parse_query():
    assert parse_query("12.0: what is the rider doing?") == (12.0, "what is the rider doing?")
    assert parse_query("1:30: and then?") == (90.0, "and then?")
    assert parse_query("1:02:03.5: late") == (3723.5, "late")
    assert parse_query("20s: now?") == (20.0, "now?")
    assert parse_query(".5:q") == (0.5, "q")
    assert parse_query("what: is this") == (None, "what: is this")
    assert parse_query("plain question") == (None, "plain question")
    assert all(parse_query(q)[0] is not None for q in SAMPLE_QUERIES)
    with pytest.raises(ValueError, match=">= 0"):
        parse_query("-3: before the start?")
    with pytest.raises(ValueError, match="no question"):
        parse_query("12:   ")
    # A clock's fields in range: the first is unbounded, minutes and seconds after it below 60.
    assert parse_query("59:59.5: q") == (3599.5, "q") and parse_query("25:00:00: q") == (90000.0, "q")
    assert parse_query("6039: q") == (6039.0, "q")
    for text in ("99:99: what now?", "1:60: q", "1:60:00: q", "0:00:60: q"):
        with pytest.raises(ValueError, match=r"query time '[\d:]+' is out of range: minutes and seconds"):
            parse_query(text)
    with pytest.raises(ValueError, match="query time must be a finite number"):
        parse_query("nan: q")


def test_split_stream_time_names_the_callers_argument():
    assert split_stream_time("1:30: Ana: hello", "--turn") == (90.0, "Ana: hello")
    assert split_stream_time("Ana: hello", "--turn") == (None, "Ana: hello")
    for text, message in (("-2: Ana: hi", "--turn must be >= 0 seconds"), ("inf: Ana: hi", "--turn must be a finite"),
                          ("9:75: Ana: hi", "--turn '9:75' is out of range")):
        with pytest.raises(ValueError, match=message):
            split_stream_time(text, "--turn")


def test_caption_text_strips_the_label_captioners_span():
    assert caption_text("3.0-4.0s: taxicab, minivan") == "taxicab, minivan"
    assert caption_text("a caption: with a colon") == "a caption: with a colon"


def test_extractive_answer_present_from_short_term_past_from_memory():
    short = [{"frame": 40, "t": 19.0, "labels": ["green"]}, {"frame": 41, "t": 19.5, "labels": ["green", "blue"]}]
    past = {"injection": {"s_t": 0.2}, "short_term": short,
            "tree_best": {"score": 0.2, "t_start": 1.0, "t_end": 2.0, "caption": "1.0-2.0s: taxicab"},
            "knowledge": [{"score": 0.5, "t_start": 3.0, "t_end": 4.0, "caption": "3.0-4.0s: mountain bike"}]}
    assert extractive_choice(past) == ("knowledge", "At 3.0-4.0 s I saw: mountain bike")
    now = dict(past, injection={"s_t": 0.8})
    assert extractive_choice(now) == ("short_term", "Now (19.0-19.5 s) I see: green, blue")
    empty = {"injection": {"s_t": 0.2}, "short_term": [], "tree_best": None, "knowledge": []}
    assert extractive_answer(empty) == "I have not seen anything yet."


# ---- abstention: the words of a question, grounding, calibration ------------------------------------------
def test_content_words_and_names():
    assert content_words("Where does Alice's sister work?") == ["alice", "sister", "work"]
    assert content_words("What happened?") == [] and content_words("What is on screen right now?") == []
    assert content_words("Where are the bicycles parked?") == ["bicycle", "park"]
    assert proper_names("What car does Alice drive?") == ["alice"]
    assert proper_names("Was there a Border Terrier?") == ["border", "terrier"]
    assert proper_names("Alice said what?") == []  # a sentence's first word is no name


def test_grounding_spells_words_and_prefixes():
    assert grounding(["taxi"], "1.0-2.0s: taxicab, minivan") == 1.0  # the span is not read, prefixes count
    assert grounding(["phone"], "Windsor tie, bow tie, suit") == 0.0
    assert grounding(["bicycle", "park"], ["mountain bike, tandem bicycle", "parking meter"]) == 1.0
    assert grounding(["alice", "move"], "Alice: We finally moved to Oslo.") == 1.0
    assert grounding([], "anything") == 1.0
    f = answer_features("Is there a phone?", "Windsor tie, bow tie, suit", 1.7)
    assert f == {"cosine": 1.0, "grounding": 0.0, "names": 1.0}
    related = answer_features("Where does Alice work?", "Alice: I started a job.", 0.3,
                              word_vectors=WordVectors(HashingTextEncoder()))
    assert related["related"] == 0.0  # hashing: no word is close to another; a model's embeddings relate them
    with pytest.raises(ValueError, match="cosine"):
        answer_features("q", "b", math.nan)


def _rows(n=200, seed=0):
    """Answerable questions whose basis spells the question (right 90 %), unanswerable ones whose does not."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        answerable = i % 2 == 0
        g = float(rng.uniform(0.7, 1.0)) if answerable else float(rng.uniform(0.0, 0.6))
        right = answerable and rng.random() < 0.9
        rows.append(AbstentionRow({"cosine": float(rng.uniform(0.2, 0.8)), "grounding": g}, answerable, right))
    return rows


def test_calibration_fit_separates_and_respects_the_false_answer_budget():
    rows = _rows()
    cal = Calibration.fit(rows, max_false_answer=0.02, fitted_on="test")
    assert cal.features == ("cosine", "grounding") and cal.weights["grounding"] > 0 and cal.fitted_on == "test"
    conf = [cal.confidence(r.features) for r in rows]
    assert all(0.0 <= c <= 1.0 for c in conf)
    neg = [c for c, r in zip(conf, rows) if not r.answerable]
    assert sum(c >= cal.threshold for c in neg) <= 0.02 * len(neg)
    decided = [AbstentionRow(r.features, r.answerable, r.correct, cal.decide(r.features)[1]) for r in _rows(seed=1)]
    report = abstention_report(decided)
    assert report["false_answer_rate"] <= 0.05 and report["retained"] >= 0.95
    # Calibrated: among the rows it gives about 0.9, about 0.9 are right.
    high = [r.correct for c, r in zip(conf, rows) if c > 0.8]
    assert len(high) > 40 and 0.8 <= np.mean(high) <= 1.0
    assert Calibration.from_dict(cal.to_dict()) == cal
    assert cal.with_threshold(0.0).decide({"cosine": 0.0, "grounding": 0.0})[1] == Outcome.ANSWERED


def test_calibration_weights_are_never_negative():
    rng = np.random.default_rng(0)
    rows = [AbstentionRow({"good": float(y), "bad": float(y) * 0.0 + float(rng.random() < 0.9) * (1 - y)},
                          True, bool(y)) for y in rng.integers(0, 2, 200)]
    cal = Calibration.fit(rows + [AbstentionRow({"good": 0.0, "bad": 1.0}, False, False)] * 20)
    assert cal.weights["bad"] == 0.0 and cal.weights["good"] > 0


def test_choose_threshold_answers_the_most_right_answers_within_the_budget():
    # Unanswerable at 0.1, 0.2, 0.3, 0.9; right answers at 0.5, 0.6, 0.95.
    conf = [0.1, 0.2, 0.3, 0.9, 0.5, 0.6, 0.95]
    answerable = [False] * 4 + [True] * 3
    assert choose_threshold(conf, answerable, 0.0) == 0.925  # between 0.9 and 0.95
    assert choose_threshold(conf, answerable, 0.25) == 0.4  # one false answer (0.9) buys 0.5 and 0.6
    assert choose_threshold(conf, [True] * 7, 0.0) == 0.0


def test_calibration_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="threshold"):
        Calibration({"cosine": 1.0}, 0.0, 1.5)
    with pytest.raises(ValueError, match="weights"):
        Calibration({}, 0.0, 0.5)
    with pytest.raises(ValueError, match=r"weights\['cosine'\]"):
        Calibration({"cosine": math.inf}, 0.0, 0.5)
    with pytest.raises(ValueError, match="lack"):
        Calibration({"cosine": 1.0}, 0.0, 0.5).confidence({})
    with pytest.raises(ValueError, match="rows"):
        Calibration.fit([])
    with pytest.raises(ValueError, match="max_false_answer"):
        Calibration.fit(_rows(), max_false_answer=2.0)


def test_extractive_choice_says_not_in_memory_and_quotes_its_basis():
    ctx = {"outcome": "not_in_memory", "short_term": [], "tree_best": None, "knowledge": []}
    assert extractive_choice(ctx) == ("none", NOT_IN_MEMORY_ANSWER)
    ctx = {"outcome": "answered", "basis": {"source": "knowledge", "t_start": 3.0, "t_end": 4.0, "text": "taxicab"}}
    assert extractive_choice(ctx) == ("knowledge", "At 3.0-4.0 s I saw: taxicab")
