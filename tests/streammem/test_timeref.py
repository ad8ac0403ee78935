"""Time references in questions (components.timeref): every phrase the docs list parsed to its kind, numbers and
the question without it; windows against a stream's start and now; which units a window keeps and which one a
question with no content of its own is answered from."""
import math

import pytest
import torch

from streammem.components.timeref import (
    AT_TOLERANCE_S, EDGE_FRACTION, TimeReference, best_in_window, in_window, parse_time_reference, rank_in_window,
)


@pytest.mark.parametrize("question, kind, rest, numbers", [
    ("What happened at the beginning?", "beginning", "What happened?", {}),
    ("What did we see at the beginning of the video?", "beginning", "What did we see?", {}),
    ("What did the rider do at the start?", "beginning", "What did the rider do?", {}),
    ("What did you see at first?", "beginning", "What did you see?", {}),
    ("What is at the end?", "end", "What is?", {}),
    ("What happened towards the very end of the clip?", "end", "What happened?", {}),
    ("What was on screen at 20 s?", "at", "What was on screen?", {"start": 20.0}),
    ("What happened at 1:05?", "at", "What happened?", {"start": 65.0}),
    ("What happened at 1:02:03.5?", "at", "What happened?", {"start": 3723.5}),
    ("What was there at about 20 seconds?", "at", "What was there?", {"start": 20.0}),
    ("What did we see at minute 2?", "at", "What did we see?", {"start": 120.0}),
    ("What happened between 10 and 20 s?", "between", "What happened?", {"start": 10.0, "end": 20.0}),
    ("What colour was it from 0:10 to 0:20?", "between", "What colour was it?", {"start": 10.0, "end": 20.0}),
    ("What did we talk about in the last minute?", "last", "What did we talk about?", {"duration": 60.0}),
    ("What happened in the past 30 seconds?", "last", "What happened?", {"duration": 30.0}),
    ("What happened in the first two minutes?", "first", "What happened?", {"duration": 120.0}),
    ("What happened 30 seconds ago?", "ago", "What happened?", {"duration": 30.0}),
    ("Who spoke a minute ago?", "ago", "Who spoke?", {"duration": 60.0}),
    ("What happened before 20 s?", "before", "What happened?", {"start": 20.0}),
    ("What happened after 1:00?", "after", "What happened?", {"start": 60.0}),
    ("What happened before the car arrived?", "before", "What happened?", {"anchor": "car arrived"}),
    ("Who spoke after Ana mentioned the taxi?", "after", "Who spoke?", {"anchor": "Ana mentioned the taxi"}),
])
def test_parse_every_documented_phrase(question, kind, rest, numbers):
    ref = parse_time_reference(question)
    assert ref is not None and ref.kind == kind and ref.question == rest
    for name, value in numbers.items():
        assert getattr(ref, name) == value, name
    assert ref.phrase.lower() in question.lower()


@pytest.mark.parametrize("question", ["Where does Alice work?", "What did Ben say about the taxi?",
                                      "Have I seen this before?", "Is there a phone?", "What about 20 cats?"])
def test_questions_without_a_time_reference(question):
    assert parse_time_reference(question) is None


def test_windows():
    start, now = 10.0, 110.0
    w = lambda q, **kw: parse_time_reference(q).window(stream_start=start, now=now, **kw)  # noqa: E731
    assert w("at 20 s?") == (20.0 - AT_TOLERANCE_S, 20.0 + AT_TOLERANCE_S)
    assert w("at the beginning?") == (10.0, 10.0 + EDGE_FRACTION * 100.0)
    assert w("at the end?") == (110.0 - EDGE_FRACTION * 100.0, 110.0)
    assert w("in the last minute?") == (50.0, 110.0)
    assert w("in the first 30 seconds?") == (10.0, 40.0)
    assert w("between 40 and 30 s?") == (30.0, 40.0)
    assert w("30 s ago?") == (80.0 - AT_TOLERANCE_S, 80.0 + AT_TOLERANCE_S)
    assert w("before 20 s?") == (10.0, 20.0) and w("after 20 s?") == (20.0, 110.0)
    assert w("before the car arrived?", anchor_span=(60.0, 65.0)) == (10.0, 60.0)
    assert w("after the car arrived?", anchor_span=(60.0, 65.0)) == (65.0, 110.0)
    with pytest.raises(ValueError, match="anchor_span"):
        w("before the car arrived?")
    with pytest.raises(ValueError, match="stream_start"):
        parse_time_reference("at 2 s?").window(stream_start=math.nan, now=1.0)
    with pytest.raises(ValueError, match="question"):
        parse_time_reference(3)


# Units: [0-1), [1-2), ... [9-10) seconds.
T0 = torch.arange(10, dtype=torch.float64)
T1 = T0 + 0.999


def _rank(question, scores=None, generic=True, anchor_span=None):
    scores = torch.zeros(10) if scores is None else torch.as_tensor(scores)
    return rank_in_window(parse_time_reference(question), T0, T1, scores, generic=generic, stream_start=0.0,
                          now=10.0, anchor_span=anchor_span)


def test_the_beginning_is_the_first_unit_not_the_best_matching_one():
    # The best-matching unit is 1.0-2.0 s; the beginning is the first span whatever the scores.
    scores = torch.tensor([0.1, 0.9, 0.2, 0, 0, 0, 0, 0, 0, 0])
    assert _rank("What happened at the beginning?", scores) == [0]
    assert _rank("What happened at the end?", scores) == [9]
    # A question with content of its own takes the best match inside the window.
    assert _rank("What was red in the first 3 seconds?", scores, generic=False) == [1, 2, 0, 3]
    assert _rank("What happened at 5 s?")[0] == 5 and set(_rank("What happened at 5 s?")) == {3, 4, 5, 6, 7}
    assert _rank("What happened before the car arrived?", anchor_span=(6.0, 6.999)) == [5, 4, 3, 2, 1, 0]
    assert _rank("What happened after the car arrived?", anchor_span=(6.0, 6.999)) == [7, 8, 9]
    assert _rank("What happened at 50 s?") == [] and best_in_window(
        parse_time_reference("at 50 s"), T0, T1, torch.zeros(10), generic=True, stream_start=0.0, now=10.0) is None


def test_edges_always_hold_a_unit():
    # One long unit: still the beginning and the end of the stream.
    ref = parse_time_reference("What happened at the beginning?")
    assert in_window(ref, [5.0], [95.0], stream_start=5.0, now=100.0).tolist() == [True]
    assert in_window(parse_time_reference("at the end"), [0.0, 20.0], [10.0, 30.0], stream_start=0.0,
                     now=100.0).tolist() == [False, True]
    with pytest.raises(ValueError, match="one entry per unit"):
        in_window(ref, [0.0, 1.0], [1.0], stream_start=0.0, now=1.0)
    with pytest.raises(ValueError, match="scores"):
        rank_in_window(ref, T0, T1, torch.zeros(3), generic=True, stream_start=0.0, now=10.0)
    assert isinstance(ref, TimeReference) and ref.to_dict()["kind"] == "beginning"
