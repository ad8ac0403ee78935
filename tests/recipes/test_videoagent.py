"""VideoAgent recipe (streammem.recipes.videoagent): the loop against brute force and against the ground truth of a
synthetic long video with planted events (which frames hold each answer), the hooks, validation and the CLI.

Model-free throughout (hashing text encoder, label captions, pixel frame encoder) so it stays fast; the real
models go through the same code (bench/bench_videoagent.py measures them)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from streammem.cli import main
from streammem.components.answers import NOT_IN_MEMORY_ANSWER, Outcome
from streammem.models.encoders import HashingTextEncoder
from streammem.recipes.videoagent import (
    Answer,
    Assessment,
    CaptionVoteAnswerer,
    LabelTextEmbedder,
    PlantedEventVideo,
    RetrievalConfidencePolicy,
    VideoAgent,
    VideoIndex,
    evaluate,
    uniform_indices,
    unobserved_segments,
)
from streammem_kernels import cosine_topk

TEXT = HashingTextEncoder()


@pytest.fixture(scope="module")
def planted():
    video = PlantedEventVideo(3600, 20, seed=0)
    return video, VideoAgent(video.index(TEXT), TEXT)


@pytest.fixture(scope="module")
def small():
    video = PlantedEventVideo(600, 4, seed=3)
    return video, video.index(TEXT)


def _brute_topk(query, embeddings, start, end, k):
    """Exact top-k of one segment: cosine of every frame in [start, end), best first, ties to the lower index."""
    scores = F.normalize(embeddings[start:end].double(), dim=1) @ F.normalize(query.double(), dim=0)
    order = sorted(range(end - start), key=lambda i: (-float(scores[i]), i))[:k]
    return [start + i for i in order], [float(scores[i]) for i in order]


# ---- frame positions against brute force ----------------------------------------------
@pytest.mark.parametrize("num_frames,n", [(1, 1), (1, 5), (7, 3), (10, 10), (100, 8), (3600, 5), (17, 16)])
def test_uniform_indices_one_per_equal_part(num_frames, n):
    idx = uniform_indices(num_frames, n)
    if n >= num_frames:
        assert idx == list(range(num_frames))
        return
    assert len(idx) == n == len(set(idx)) and idx == sorted(idx)
    for i, frame in enumerate(idx):  # frame i (the time span [frame, frame + 1)) holds the centre of part i
        assert frame <= (i + 0.5) * num_frames / n < frame + 1


@pytest.mark.parametrize("observed,num_frames", [([], 5), ([0], 1), ([0, 4], 5), ([2], 5), ([1, 2, 3], 9),
                                                 ([8, 0, 3, 3], 9), (list(range(6)), 6)])
def test_unobserved_segments_cover_exactly_the_unseen_frames(observed, num_frames):
    segments = unobserved_segments(observed, num_frames)
    assert segments.dtype == torch.int64 and segments.shape[1] == 2
    covered = [f for a, b in segments.tolist() for f in range(a, b)]
    assert covered == [f for f in range(num_frames) if f not in set(observed)]
    assert all(b > a for a, b in segments.tolist())
    # Maximal runs: consecutive segments are separated by at least one observed frame.
    assert all(b1 < a2 for (_, b1), (a2, _) in zip(segments.tolist(), segments.tolist()[1:]))


def test_frame_positions_reject_bad_input():
    with pytest.raises(ValueError, match="num_frames"):
        uniform_indices(0, 3)
    with pytest.raises(ValueError, match="n must"):
        uniform_indices(5, 0)
    with pytest.raises(ValueError, match="observed"):
        unobserved_segments([5], 5)
    with pytest.raises(ValueError, match="observed"):
        unobserved_segments([-1], 5)


# ---- retrieval: one frame-index search (ranges=...) equals per-segment brute force and cosine_topk ---------
@pytest.mark.parametrize("k", [1, 3, 40])
def test_retrieve_is_exact_per_segment_topk(small, k):
    video, index = small
    agent = VideoAgent(index, TEXT, frames_per_segment=k)
    segments = torch.tensor([[0, 1], [10, 47], [100, 130], [590, 600], [47, 48]])
    queries = agent.encode_queries([f"What was next to the {q.cue}?" for q in video.questions] + ["park bench"])
    found = agent.retrieve(queries, segments)
    assert found.ids.shape == (5, k) and found.scores.shape == (5, k)
    unit = F.normalize(index.embeddings.double(), dim=1)

    def check(row, query, start, end):
        # Tie-robust: the scores are the brute-force top-k scores, and each id has the score returned for it.
        ids, scores = _brute_topk(query, index.embeddings, start, end, k)
        got = [i for i in found.ids[row].tolist() if i >= 0]
        assert len(got) == len(ids) == len(set(got)) and all(start <= i < end for i in got), f"segment {start}-{end}"
        expected = torch.tensor(scores, dtype=torch.float64)
        torch.testing.assert_close(found.scores[row, :len(ids)].double(), expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(unit[got] @ F.normalize(query.double(), dim=0), expected, atol=1e-5, rtol=0)
        assert (found.ids[row, len(ids):] == -1).all() and torch.isneginf(found.scores[row, len(ids):]).all()

    for row, (start, end) in enumerate(segments.tolist()):
        check(row, queries[row], start, end)
    # The frame index answers as cosine_topk on the raw embeddings (which normalises them on every call).
    same = cosine_topk(queries, index.embeddings, k, ranges=segments)
    assert torch.equal(found.ids, same.ids)
    torch.testing.assert_close(found.scores, same.scores, atol=2e-5, rtol=0)
    # One query for every segment: a (E,) query broadcasts.
    found = agent.retrieve(queries[0], segments)
    for row, (start, end) in enumerate(segments.tolist()):
        check(row, queries[0], start, end)
    assert agent.retrieve(queries[:0], torch.zeros(0, 2, dtype=torch.int64)).ids.shape == (0, k)


# ---- the synthetic video's ground truth ------------------------------------------------------
def test_planted_video_ground_truth_is_consistent_and_deterministic(small):
    video, _ = small
    again = PlantedEventVideo(600, 4, seed=3)
    assert again.labels == video.labels
    assert [q.question for q in again.questions] == [q.question for q in video.questions]
    assert PlantedEventVideo(600, 4, seed=4).labels != video.labels
    spans = []
    for q in video.questions:
        start, end = q.span
        truth = q.options[q.answer]
        assert q.cue in q.question and len(q.options) == 5 and len(set(q.options)) == 5
        middle = (start + end - 1) // 2
        assert q.cue in video.labels[middle] and truth in video.labels[middle]  # every question is answerable
        assert q.answer_frames == tuple(i for i in range(start, end) if truth in video.labels[i])
        # The answer's object appears nowhere outside the event but in other questions' events.
        others = [range(*s) for o in video.questions if o is not q for s in (o.span, *o.distractor_spans)]
        assert all(truth not in video.labels[i] for i in range(len(video))
                   if not start <= i < end and not any(i in r for r in others))
        for d_start, d_end in q.distractor_spans:
            assert any(o in video.labels[i] for i in range(d_start, d_end) for o in q.options if o != truth)
        spans += [q.span, *q.distractor_spans]
    spans.sort()
    assert all(e1 < s2 for (_, e1), (s2, _) in zip(spans, spans[1:]))  # events never overlap nor touch
    assert all(len(labels) == 3 for labels in video.labels)


def test_planted_video_rejects_bad_parameters():
    with pytest.raises(ValueError, match="options"):
        PlantedEventVideo(600, 2, distractors=3, options=3)
    with pytest.raises(ValueError, match="fit"):
        PlantedEventVideo(60, 20)
    with pytest.raises(ValueError, match="p_cue"):
        PlantedEventVideo(600, 2, p_cue=1.5)
    with pytest.raises(ValueError, match="questions"):
        PlantedEventVideo(600, 0)


# ---- the loop on the planted video: accuracy against uniform sampling at the same budget ---------
def test_iterative_retrieval_finds_planted_answers_uniform_sampling_does_not(planted):
    video, agent = planted
    iterative = evaluate(agent, video, "iterative", 16)
    uniform = evaluate(agent, video, "uniform", 16)
    # Known ground truth: which option is right and which frames hold it.
    assert iterative["accuracy"] >= 0.75 and iterative["evidence_hit"] >= 0.75
    assert uniform["accuracy"] <= 0.35 and uniform["evidence_hit"] <= 0.15  # 16 of 3600 frames rarely hit an event
    assert iterative["accuracy"] >= uniform["accuracy"] + 0.4
    # Fewer frames than the budget on average (the policy stops early), never more.
    assert uniform["frames_used"] == 16
    assert 5 <= iterative["frames_used"] < 16
    assert all(r.frames_used <= 16 for r in iterative["results"])
    assert sum(iterative["stops"].values()) == 20 and iterative["stops"].get("answerable", 0) >= 10
    for r, q in zip(iterative["results"], video.questions):
        if r.answer.option == q.answer and r.answer.supported:  # a right answer rests on a frame of the event
            assert any(q.span[0] <= f < q.span[1] for f in r.answer.evidence)


@pytest.mark.parametrize("initial,budget,max_rounds,per_segment", [(5, 16, 3, 1), (1, 1, 3, 1), (3, 4, 5, 2),
                                                                   (8, 6, 0, 1), (2, 30, 10, 3)])
def test_loop_invariants(planted, initial, budget, max_rounds, per_segment):
    video, base = planted
    agent = VideoAgent(base.index, TEXT, initial=initial, budget=budget, max_rounds=max_rounds,
                       frames_per_segment=per_segment)
    for q in video.questions[:4]:
        agent.clear_captions()
        r = agent.ask(q.question, q.options)
        first = min(initial, budget)
        assert r.frames[:first] == uniform_indices(len(video), first)  # uniform sample first
        assert len(set(r.frames)) == len(r.frames) == r.frames_used <= budget
        assert len(r.rounds) <= max_rounds + 1 and r.stop in ("answerable", "budget", "max_rounds", "no_segments")
        assert sum(len(log.added) for log in r.rounds) == r.frames_used - first
        assert all(len(log.added) <= per_segment * len(log.segments) for log in r.rounds)
        assert r.timestamps == [float(video.timestamps[f]) for f in r.frames]
        assert set(r.captions) == set(r.frames) and agent.captions_computed >= r.frames_used
        if r.stop == "budget":
            assert r.frames_used == budget


def test_each_round_adds_the_best_unseen_frame_of_each_chosen_segment(planted):
    """The frames added are brute-force argmaxes inside the segments the policy chose; the default policy's
    confidence is best seen minus best unseen cosine, and it stops exactly when that reaches the margin."""
    video, base = planted
    states = []

    class Recording(RetrievalConfidencePolicy):
        def assess(self, state):
            verdict = super().assess(state)
            states.append((state, verdict))
            return verdict

    agent = VideoAgent(base.index, TEXT, policy=Recording(0.05, 4))
    q = video.questions[0]
    result = agent.ask(q.question, q.options)
    assert len(states) == len(result.rounds)
    unit = F.normalize(base.index.embeddings.double(), dim=1)
    query = agent.encode_queries([q.question])[0].double()
    for (state, verdict), log in zip(states, result.rounds):
        seen = set(state.observed)
        unseen = [f for f in range(len(video)) if f not in seen]
        best_unseen = float((unit[unseen] @ query).max())
        best_seen = float((unit[sorted(seen)] @ query).max())
        assert verdict.confidence == pytest.approx(best_seen - best_unseen, abs=1e-5)
        assert verdict.answerable == (verdict.confidence >= 0.05) or abs(verdict.confidence - 0.05) < 1e-5
        for (start, end), (frame, score) in zip(log.segments, log.added):
            _, scores = _brute_topk(query.float(), base.index.embeddings, start, end, 1)
            assert start <= frame < end and score == pytest.approx(scores[0], abs=1e-5)
            assert float(unit[frame] @ query) == pytest.approx(scores[0], abs=1e-5)


# ---- hooks ------------------------------------------------------------------------------------
def test_policy_hook_answerable_at_once_looks_only_at_the_uniform_sample(planted):
    video, base = planted

    class AtOnce:
        def assess(self, state):
            return Assessment(True, 1.0, note="trust the first look")

    agent = VideoAgent(base.index, TEXT, policy=AtOnce(), initial=7)
    r = agent.ask(video.questions[0].question, video.questions[0].options)
    assert r.frames == uniform_indices(len(video), 7) and r.stop == "answerable" and len(r.rounds) == 1


def test_policy_hook_queries_steer_retrieval(small):
    video, index = small
    target = 321
    text = LabelTextEmbedder(TEXT).text_of(index.labels[target])

    class LookFor:
        def assess(self, state):
            if target in state.observed:
                return Assessment(True, 1.0)
            row = next(i for i, (a, b) in enumerate(state.segments.tolist()) if a <= target < b)
            return Assessment(False, 0.0, [row], [text])

    agent = VideoAgent(index, TEXT, policy=LookFor())
    r = agent.ask("anything at all", None)
    # Its own label text is the frame's exact embedding (cosine 1; another frame ties only with the same labels).
    assert r.frames[-1] == target or index.labels[r.frames[-1]] == index.labels[target]


def test_policy_hook_errors_are_reported(small):
    _, index = small

    class Bad:
        def __init__(self, verdict):
            self.verdict = verdict

        def assess(self, state):
            return self.verdict

    for verdict, match in [(Assessment(False, 0.0, [999]), "segments"), (Assessment(False, 0.0, [0, 0]), "segments"),
                           (Assessment(False, 0.0, [0], ["a", "b"]), "queries")]:
        with pytest.raises(ValueError, match=match):
            VideoAgent(index, TEXT, policy=Bad(verdict)).ask("q")
    r = VideoAgent(index, TEXT, policy=Bad(Assessment(False, 0.0, []))).ask("q")
    assert r.stop == "no_segments" and r.frames_used == 5


def test_captioner_and_answerer_hooks_see_only_the_frames_looked_at(planted):
    video, base = planted
    captioned, states = [], []

    class Camera:
        def caption(self, records, pixels):
            assert pixels is None  # the planted index keeps no pixels
            captioned.extend(r.index for r in records)
            return [f"frame {r.index} shows {' and '.join(r.labels)}" for r in records]

    class Last:
        def answer(self, state):
            states.append(state)
            return Answer("last", None, [state.observed[-1]], True, "test")

    agent = VideoAgent(base.index, TEXT, captioner=Camera(), answerer=Last())
    q = video.questions[1]
    r = agent.ask(q.question, q.options)
    assert sorted(captioned) == sorted(r.frames) and len(captioned) == len(set(captioned))
    assert states[0].observed == sorted(r.frames) and set(states[0].captions) == set(r.frames)
    assert r.answer.text == "last" and r.captions[r.frames[0]].startswith(f"frame {r.frames[0]} shows")
    agent.ask(q.question, q.options)  # cached captions are not recomputed
    assert len(captioned) == len(set(captioned))
    bad = VideoAgent(base.index, TEXT, captioner=type("Short", (), {"caption": lambda self, r, p: ["x"]})())
    with pytest.raises(ValueError, match="captions"):
        bad.ask("q")


def test_caption_vote_answerer(small):
    video, index = small
    agent = VideoAgent(index, TEXT)
    q = video.questions[0]
    r = agent.answer_frames(q.question, q.answer_frames, q.options)
    assert r.answer.option == q.answer and r.answer.supported and r.strategy == "given"
    assert "not a language model" in r.answer.source
    assert r.answer.outcome == Outcome.ANSWERED and r.answer.confidence > agent.calibration.threshold
    # No frame names an option nor the cue: the fallback guess is unsupported, and the agent says the answer
    # is not in memory (keeping the guess as the candidate).
    background = [i for i in range(len(video)) if not any(o in index.labels[i] for o in q.options)][:3]
    r = agent.answer_frames(q.question, background, q.options)
    assert not r.answer.supported and r.answer.candidate_option in range(len(q.options))
    assert r.answer.outcome == Outcome.NOT_IN_MEMORY and r.answer.option is None
    assert r.answer.text == NOT_IN_MEMORY_ANSWER and r.answer.confidence < agent.calibration.threshold
    open_answer = agent.answer_frames(q.question, q.answer_frames, None).answer
    assert open_answer.option is None and q.options[q.answer] in open_answer.text
    assert open_answer.text.startswith("At ") and open_answer.text.count("s:") == 1  # the span said once
    assert CaptionVoteAnswerer.mentions("1.0s: tennis ball, desk", "Tennis Ball")
    assert not CaptionVoteAnswerer.mentions("1.0s: tennis balls", "tennis ball")


# ---- abstention and time references ------------------------------------------------------------
def test_captions_that_never_name_the_question_are_not_in_memory():
    """The reported case: on carphone_pristine.mp4 every caption is "Windsor tie, bow tie, suit" and "Is there a
    phone?" (yes / no) was answered "yes" at confidence +0.000 in every round."""
    index = VideoIndex.from_labels(np.arange(20) / 5.0, [("Windsor tie", "bow tie", "suit")] * 20,
                                   LabelTextEmbedder(TEXT))
    agent = VideoAgent(index, TEXT)
    res = agent.ask("Is there a phone?", ["yes", "no"])
    assert res.outcome == Outcome.NOT_IN_MEMORY and res.answer.text == NOT_IN_MEMORY_ANSWER
    assert res.answer.option is None and res.answer.candidate in ("yes", "no") and not res.answer.supported
    assert res.to_dict()["outcome"] == "not_in_memory" and res.to_dict()["answer"]["candidate"] in ("yes", "no")
    seen = agent.ask("Is there a bow tie?")
    assert seen.outcome == Outcome.ANSWERED and "bow tie" in seen.answer.text
    assert seen.confidence >= agent.calibration.threshold > res.confidence


def test_a_cue_that_never_appears_is_not_in_memory(planted):
    video, agent = planted
    shown = {label for labels in video.labels for label in labels}
    pq = video.questions[0]
    absent = next(c for c in ("Cairn Terrier", "zebra", "koala", "meerkat") if c not in shown)
    res = agent.ask(pq.question.replace(pq.cue, absent), pq.options)
    assert res.outcome == Outcome.NOT_IN_MEMORY and res.answer.option is None
    right = agent.ask(pq.question, pq.options)
    assert right.outcome == Outcome.ANSWERED and right.answer.option == pq.answer


def test_time_references_keep_every_frame_looked_at_in_their_span(planted):
    video, agent = planted
    end = float(video.timestamps[-1])
    res = agent.ask("What happened at the beginning?")
    assert res.frames and all(t < 0.1 * end for t in res.timestamps)
    assert res.time_reference["kind"] == "beginning" and res.outcome == Outcome.ANSWERED
    assert res.answer.text.startswith("At ") and float(res.answer.text[3:].split(" s")[0]) < 0.1 * end
    res = agent.ask("What did you see at 1000 s?")
    assert res.frames and all(998.0 <= t <= 1002.0 for t in res.timestamps)
    res = agent.ask("What did you see in the last minute?")
    assert res.frames and all(t >= end - 60.0 for t in res.timestamps)
    pq = video.questions[1]
    res = agent.ask(f"What happened right before the {pq.cue} appeared?")
    anchor = res.time_reference["anchor_match"]
    assert pq.cue in anchor["caption"] and res.frames and all(t < anchor["t"] for t in res.timestamps)
    res = agent.ask("What happened at 9000 s?")
    assert res.stop == "not_in_window" and res.frames == [] and res.outcome == Outcome.NOT_IN_MEMORY
    # Asked without reading the time reference, the same question looks anywhere.
    wide = agent.ask("What happened at the beginning?", time_references=False)
    assert wide.time_reference is None and max(wide.timestamps) > 0.1 * end


# ---- validation --------------------------------------------------------------------------------
def test_bad_input_raises_value_error_naming_it(small):
    video, index = small
    with pytest.raises(ValueError, match="embeddings"):
        VideoIndex(np.zeros(3), torch.zeros(3), None)
    with pytest.raises(ValueError, match="timestamps"):
        VideoIndex(np.zeros(2), torch.ones(3, 4), None)
    with pytest.raises(ValueError, match="non-decreasing"):
        VideoIndex(np.array([0.0, 2.0, 1.0]), torch.ones(3, 4), None)
    with pytest.raises(ValueError, match="finite"):
        VideoIndex(np.zeros(1), torch.tensor([[math.nan, 1.0]]), None)
    with pytest.raises(ValueError, match="labels"):
        VideoIndex(np.zeros(2), torch.ones(2, 4), [("a",)])
    with pytest.raises(ValueError, match="share one space"):
        VideoAgent(index, HashingTextEncoder(dim=64))
    for kwargs, match in [({"budget": 0}, "budget"), ({"initial": 0}, "initial"), ({"max_rounds": -1}, "max_rounds"),
                          ({"frames_per_segment": 0}, "frames_per_segment"), ({"policy": object()}, "policy"),
                          ({"answerer": object()}, "answerer"), ({"captioner": object()}, "captioner")]:
        with pytest.raises(ValueError, match=match):
            VideoAgent(index, TEXT, **kwargs)
    agent = VideoAgent(index, TEXT)
    for question, options, match in [("", None, "question"), ("q", "abc", "options"), ("q", [], "options"),
                                     ("q", ["a", ""], "options")]:
        with pytest.raises(ValueError, match=match):
            agent.ask(question, options)
    with pytest.raises(ValueError, match="budget"):
        agent.ask("q", budget=0)
    with pytest.raises(ValueError, match="frames"):
        agent.answer_frames("q", [len(video)])
    with pytest.raises(ValueError, match="strategy"):
        evaluate(agent, video, "dense")
    with pytest.raises(ValueError, match="margin"):
        RetrievalConfidencePolicy(margin=-0.1)


# ---- a real (synthetic) video file through the CLI ----------------------------------------------
def test_cli_on_a_clip_with_known_scenes(tmp_path, capsys):
    """PixelEncoder labels each frame with its colour; asking for the blue screen must land in the blue scene."""
    from tests.support.clips import SCENES, scene_at, write_clip

    path = write_clip(tmp_path / "scenes.avi", fps=10.0)
    argv = ["videoagent", str(path), "--frame-encoder", "pixel", "--text-encoder", "hashing", "--fps", "5",
            "--question", "When is the screen blue?", "--compare-uniform"]
    for colour, _, _ in SCENES:
        argv += ["--option", colour]
    assert main(argv + ["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["frames_indexed"] == 200 and report["frame_encoder"] == "pixel"
    answer = report["answers"][0]["iterative"]
    assert answer["answer"]["text"] == "blue" and answer["answer"]["supported"]
    times = {f["frame"]: f["t"] for f in answer["frames"]}
    assert all(scene_at(times[f]) == "blue" for f in answer["answer"]["evidence"])
    assert 1 <= answer["frames_used"] <= 16 and "uniform" in report["answers"][0]
    assert main(argv) == 0  # the text report
    out = capsys.readouterr().out
    assert "Q: When is the screen blue?" in out and "A: blue" in out and "frames used:" in out


def test_cli_synthetic_scores_against_uniform(capsys):
    argv = ["videoagent", "--synthetic", "--frames", "1200", "--questions", "6", "--text-encoder", "hashing"]
    assert main(argv + ["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    it, uni = report["strategies"]["iterative"], report["strategies"]["uniform"]
    assert it["questions"] == uni["questions"] == 6 and uni["frames_used"] == 16
    assert it["accuracy"] > uni["accuracy"]
    assert all(set(q) >= {"question", "answer", "truth", "correct", "frames_used"} for q in it["per_question"])
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "iterative" in out and "uniform" in out and "frames/question" in out


@pytest.mark.parametrize("extra,match", [(["--budget", "0"], "--budget"), (["--max-rounds", "-1"], "--max-rounds"),
                                         (["--synthetic", "--question", "q"], "--question"),
                                         (["--option", "a"], "--option needs --question"),
                                         (["missing.mp4"], "not found")])
def test_cli_errors_exit_2(extra, match, capsys):
    assert main(["videoagent", "--text-encoder", "hashing", "--frame-encoder", "pixel", *extra]) == 2
    assert match in capsys.readouterr().err


def test_docs_snippet_runs_and_prints_what_it_says(capsys):
    from pathlib import Path

    section = (Path(__file__).resolve().parents[2] / "docs" / "recipes" / "videoagent.md").read_text()
    code = section[section.index("```python\n") + len("```python\n"):section.index("\n```\n")]
    exec(compile(code, "docs/recipes/videoagent.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[0].split(" | ")[0] == out[0].split(" | ")[1].removeprefix("truth: ")  # the first question: right
    assert out[1].startswith("iterative: accuracy") and out[2].startswith("uniform: accuracy")
