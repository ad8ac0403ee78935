"""ProStream checkpoints you can trust: a checksummed file written atomically (it was written in
place: a kill left an unreadable file), every field checked on load, naming it."""
from __future__ import annotations

import pytest
import torch

from tests.support.checkpoint_checks import (
    assert_damage_refused_or_identical, assert_plain_torch_file_refused, edit_field, same_state, temporaries,
    with_first,
)
from tests.support.kill_points import kill_writer

from streammem.models.encoders import HashingTextEncoder
from streammem.recipes.prostream import ProStream, ProStreamConfig, synthetic_dialogue

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

ENCODER = HashingTextEncoder(64)


def _config():
    return ProStreamConfig.for_encoder("hashing", budget=400, max_event=4)


def _filled(turns=90):
    memory = ProStream(ENCODER, _config())
    memory.push(synthetic_dialogue(turns, seed=5).turns)
    return memory


@pytest.mark.parametrize("field, change", [
    ("stream_time", float("nan")),
    ("stream_time", "12"),
    ("units.unit_id", lambda ids: [-1] + list(ids[1:]) if ids else [-1]),
    ("superseded", [-3]),
    ("open_segments", [10**6]),
    ("open_turns", [[0, 10**6]]),
    ("stats.turns", -1),
    ("tree.nodes.embedding", lambda t: with_first(t, float("nan"))),
    ("tree.nodes.embedding", lambda t: with_first(t, 1e30)),
    ("tree.nodes.children", lambda c: [[10**6]] + list(c[1:])),
    ("segmenter.frames_seen", -2),
    ("session", "s"),
])
def test_prostream_load_refuses_each_invalid_field_naming_it(field, change):
    """A NaN stream_time and out-of-range cited ids were accepted; each invalid field is now a
    ValueError naming it."""
    state = edit_field(field, change)(_filled().state_dict())
    top = field.split(".")[0]
    with pytest.raises(ValueError, match=rf"field '{top}[^']*'"):
        ProStream(ENCODER, _config()).load_state_dict(state)


def test_prostream_damaged_and_hostile_files_are_refused_naming_the_file(tmp_path):
    """Bit flips loaded silently with different contents in 41/48 trials; an empty or random file
    raised EOFError / UnpicklingError.  Now each is one ValueError naming the file, or loads the
    identical state."""
    memory = _filled()
    path = memory.save(tmp_path / "ps.ckpt")
    want = memory.state_dict()

    def same(back):
        got = back.state_dict()
        got["timings"] = want["timings"]
        return same_state(got, want)

    assert assert_damage_refused_or_identical(path, lambda: ProStream.load(path, ENCODER), same,
                                              flips=24, cuts=8) > 30
    for content in (b"", bytes(range(256)) * 8):
        path.write_bytes(content)
        with pytest.raises(ValueError, match="ps.ckpt"):
            ProStream.load(path, ENCODER)
    assert_plain_torch_file_refused(path, lambda: ProStream.load(path, ENCODER), want)
    with pytest.raises(ValueError, match="no such checkpoint"):
        ProStream.load(tmp_path / "missing.ckpt", ENCODER)


_KILL = {}


def _writer_setup(path):
    _KILL["turns"] = synthetic_dialogue(120, seed=6).turns


def _push_and_save(path, step):
    """Each step pushes two more turns (a new memory every 60 steps) and saves."""
    i = (step % 1_000_000) * 2 % 120
    if i == 0 or "memory" not in _KILL:
        _KILL["memory"] = ProStream(ENCODER, _config())
        i = 0
    _KILL["memory"].push(_KILL["turns"][i:i + 2])
    _KILL["memory"].save(path)


def test_a_prostream_writer_killed_at_random_points_leaves_a_whole_memory(tmp_path):
    """ProStream.save wrote in place (a kill left an unreadable file): killed 24 times at random
    instants, every load afterwards is a whole memory, and the next save sweeps the temporaries."""
    path = tmp_path / "ps.ckpt"
    ProStream(ENCODER, _config()).save(path)

    def check():
        memory = ProStream.load(path, ENCODER)
        turns = memory.summary()["turns"]
        assert turns % 2 == 0
        return turns

    seen = kill_writer(__file__, "_push_and_save", [str(path)], check, kills=24, max_delay=0.15,
                       setup="_writer_setup")
    assert len(set(seen)) > 1
    _filled(10).save(path)
    assert temporaries(tmp_path) == []
    assert torch.isfinite(torch.tensor([u.score for u in ProStream.load(path, ENCODER).recall(
        ENCODER.encode(["what is the car?"])[0]).units])).all()
