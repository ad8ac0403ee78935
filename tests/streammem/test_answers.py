"""The model-free answer and the stream's question form: ``extractive_answer`` on a stream context,
``caption_text``, and ``parse_query`` with the sample clip's questions."""
import pytest

from streammem import extractive_answer
from streammem.components.answers import extractive_choice
from streammem.components.memory import caption_text
from streammem.stream.questions import SAMPLE_QUERIES, parse_query


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
