"""VideoAgent checkpoints: the agent had none; now save/load in the one checkpoint format (checksum,
atomic replacement), a loaded agent answers as the saved one, every field checked naming it."""
from __future__ import annotations

import pytest
import torch

from tests.support.checkpoint_checks import (
    assert_damage_refused_or_identical, assert_plain_torch_file_refused, same_state, temporaries, with_first,
)
from tests.support.kill_points import kill_writer

from streammem.models.encoders import HashingTextEncoder
from streammem.recipes.videoagent import PlantedEventVideo, VideoAgent

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

TEXT = HashingTextEncoder(64)


def _agent():
    video = PlantedEventVideo(300, 3, seed=4)
    agent = VideoAgent(video.index(TEXT), TEXT, budget=8)
    return video, agent


def test_videoagent_save_load_answers_as_the_saved_agent(tmp_path):
    video, agent = _agent()
    first = video.questions[0]
    agent.ask(first.question, first.options)
    path = agent.save(tmp_path / "agent.ckpt")
    back = VideoAgent.load(path, TEXT)
    assert same_state(back.state_dict(), agent.state_dict()) and back.captions_computed == agent.captions_computed
    for q in video.questions:
        a, b = agent.ask(q.question, q.options).to_dict(), back.ask(q.question, q.options).to_dict()
        for d in (a, b):
            d.pop("timings_ms", None)
        assert a == b
    assert temporaries(tmp_path) == []


def test_videoagent_damaged_files_are_refused_naming_the_file(tmp_path):
    _, agent = _agent()
    path = agent.save(tmp_path / "agent.ckpt")
    want = agent.state_dict()
    assert assert_damage_refused_or_identical(path, lambda: VideoAgent.load(path, TEXT),
                                              lambda back: same_state(back.state_dict(), want),
                                              flips=24, cuts=8) > 30
    assert_plain_torch_file_refused(path, lambda: VideoAgent.load(path, TEXT), want)
    with pytest.raises(ValueError, match="agent.ckpt"):
        VideoAgent.load(tmp_path / "agent.ckpt", HashingTextEncoder(32))


@pytest.mark.parametrize("field, change", [
    ("index.embeddings", lambda t: with_first(t, float("nan"))),
    ("index.timestamps", lambda t: with_first(t, 1e9)),
    ("index.labels", lambda lab: lab[:-1]),
    ("captions.frame", lambda ids: [10**6]),
    ("captions_computed", -1),
    ("settings.budget", 0),
    ("query_dim", 3),
])
def test_videoagent_load_refuses_each_invalid_field_naming_it(field, change):
    _, agent = _agent()
    agent.caption([0, 1])
    state = agent.state_dict()
    node = state
    parts = field.split(".")
    for part in parts[:-1]:
        node = node[part]
    node[parts[-1]] = change(node[parts[-1]]) if callable(change) else change
    with pytest.raises(ValueError, match=rf"field '{parts[0]}[^']*'"):
        VideoAgent.from_state_dict(state, TEXT)


_KILL = {}


def _writer_setup(path):
    _KILL["agent"] = _agent()[1]


def _caption_and_save(path, step):
    """Each step captions one more frame and saves."""
    agent = _KILL["agent"]
    agent.caption([(step % 1_000_000) % 300])
    agent.save(path)


def test_a_videoagent_writer_killed_at_random_points_leaves_a_whole_agent(tmp_path):
    path = tmp_path / "agent.ckpt"
    _agent()[1].save(path)

    def check():
        back = VideoAgent.load(path, TEXT)
        return back.captions_computed

    seen = kill_writer(__file__, "_caption_and_save", [str(path)], check, kills=24, max_delay=0.15,
                       setup="_writer_setup")
    assert len(set(seen)) > 1
    _agent()[1].save(path)
    assert temporaries(tmp_path) == [] and torch.isfinite(VideoAgent.load(path, TEXT).index.embeddings).all()
