"""MemVerse checkpoints you can trust: a checksummed state.pt written atomically, every field
checked on load naming it, and `streammem memverse --load` of a damaged one answered in one line."""
from __future__ import annotations

import pytest

from tests.support.checkpoint_checks import (
    assert_damage_refused_or_identical, assert_plain_torch_file_refused, edit_field, same_state, temporaries,
    with_first,
)
from tests.support.kill_points import kill_writer

from streammem import HashingTextEncoder
from streammem.cli import main
from streammem.recipes.memverse import MemVerse, MemVerseConfig, PlantedFactMemory

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


def _config():
    return MemVerseConfig(window=4, consolidate_every=2)


def _filled(items=30):
    data = PlantedFactMemory(people=4, sessions=2, fillers=8, seed=2)
    memory = MemVerse(HashingTextEncoder(64), config=_config())
    for it in data.items[:items]:
        memory.add_texts([it.t], [it.text], speakers=[it.speaker], labels=[it.labels])
    return memory


@pytest.mark.parametrize("field, change", [
    ("next_chunk", -1),
    ("next_chunk", 0),
    ("stream_time", float("nan")),
    ("questions", -2),
    ("session", "1"),
    ("graph.embedding", lambda t: with_first(t, float("nan"))),
    ("graph.embedding", lambda t: with_first(t, 1e30)),
    ("graph.head", lambda t: with_first(t, 10**6)),
    ("graph.adjacency", lambda pair: [pair[0], pair[1] + 10**6]),
    ("graph.chunk_links", lambda pair: [pair[0].flip(0), pair[1]]),
    ("graph.access", lambda t: with_first(t, -1)),
    ("window.t_end", lambda t: [float("inf")] * len(t)),
    ("graph.chunks.embedding", lambda t: with_first(t, 1e30)),
])
def test_memverse_load_refuses_each_invalid_field_naming_it(field, change):
    """A negative next_chunk was accepted; each invalid field is now a ValueError naming it."""
    state = edit_field(field, change)(_filled().state_dict())
    top = field.split(".")[0]
    with pytest.raises(ValueError, match=rf"field '{top}[^']*'"):
        MemVerse(HashingTextEncoder(64), config=_config()).load_state_dict(state)


def test_memverse_damaged_files_are_refused_naming_the_file(tmp_path, capsys):
    """Bit flips loaded silently with different contents in 48/48 trials and `memverse --load` of a
    corrupt file printed a traceback; now each damaged file is refused naming state.pt (or loads the
    identical state), and the command prints one line and exits 2."""
    memory = _filled()
    folder = memory.save(tmp_path / "mv")
    want = memory.state_dict()
    path = folder / "state.pt"

    def same(back):
        got = back.state_dict()
        got["timings"] = want["timings"]
        return same_state(got, want)

    assert assert_damage_refused_or_identical(path, lambda: MemVerse.load(folder), same, flips=24, cuts=8) > 30
    assert_plain_torch_file_refused(path, lambda: MemVerse.load(folder), want)
    path.write_bytes(path.read_bytes()[:100])
    assert main(["memverse", "--no-video", "--load", str(folder), "--ask", "Who?"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "state.pt" in lines[0] and "Traceback" not in captured.err


_KILL = {}


def _writer_setup(folder):
    _KILL["items"] = PlantedFactMemory(people=4, sessions=2, fillers=8, seed=2).items[:40]


def _add_and_save(folder, step):
    """Each step adds one more text (a new memory every 40 steps) and saves."""
    i = (step % 1_000_000) % 40
    if i == 0 or "memory" not in _KILL:
        _KILL["memory"] = MemVerse(HashingTextEncoder(64), config=_config())
    it = _KILL["items"][i]
    _KILL["memory"].add_texts([it.t], [it.text], speakers=[it.speaker], labels=[it.labels])
    _KILL["memory"].save(folder)


def test_a_memverse_writer_killed_at_random_points_leaves_a_whole_memory(tmp_path):
    """An interrupted save left a checkpoint-sized *.tmp behind; killed 24 times at random instants,
    every load afterwards is a whole memory and the next save sweeps the temporaries."""
    folder = tmp_path / "mv"
    MemVerse(HashingTextEncoder(64), config=_config()).save(folder)

    def check():
        return MemVerse.load(folder).state_dict()["next_chunk"]

    seen = kill_writer(__file__, "_add_and_save", [str(folder)], check, kills=24, max_delay=0.15,
                       setup="_writer_setup")
    assert len(set(seen)) > 1
    _filled(5).save(folder)
    assert temporaries(folder) == []
