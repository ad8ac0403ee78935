"""The model-free answer and the stream's question form: ``extractive_answer`` on a stream context,
``caption_text``, and ``parse_query`` with the sample clip's questions."""
import pytest

from streammem import extractive_answer
from streammem.components.answers import extractive_choice
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
