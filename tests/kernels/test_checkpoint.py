"""The one checkpoint format (streammem_kernels.checkpoint): round trips, every damaged file refused
with a ValueError naming the path, writers killed with SIGKILL at random points leaving the old or
the new state and nothing else, stored paths kept inside their folder, and field checks."""
import os
import random

import pytest
import torch

from streammem_kernels import checkpoint
from streammem_kernels.checkpoint import HEADER_BYTES, StateReader

from tests.support.kill_points import kill_writer


def _state(i: int, n: int = 1000) -> dict:
    return {"step": i, "values": torch.full((n,), float(i)), "name": f"state {i}", "nested": {"ids": torch.arange(i + 1)}}


def _same(a: dict, b: dict) -> bool:
    return (a["step"] == b["step"] and a["name"] == b["name"] and torch.equal(a["values"], b["values"])
            and torch.equal(a["nested"]["ids"], b["nested"]["ids"]))


def test_round_trip_kind_and_version(tmp_path):
    path = tmp_path / "x.ckpt"
    checkpoint.save(path, "Thing", _state(3), version=2)
    state, version = checkpoint.load(path, "Thing", versions=(1, 2))
    assert version == 2 and _same(state, _state(3))
    with pytest.raises(ValueError, match=r"x\.ckpt.*holds a 'Thing' state"):
        checkpoint.load(path, "Other")
    with pytest.raises(ValueError, match="state layout version 2, this version reads \\[1\\]"):
        checkpoint.load(path, "Thing", versions=(1,))
    assert sorted(os.listdir(tmp_path)) == ["x.ckpt"]


@pytest.mark.parametrize("kind", ["", "x" * 25, "kïnd", None])
def test_kind_must_be_a_short_ascii_name(tmp_path, kind):
    with pytest.raises(ValueError, match="kind must be"):
        checkpoint.save(tmp_path / "x", kind, {})


def test_every_damaged_file_is_refused_naming_the_path(tmp_path):
    """Single-byte flips anywhere (header and payload), truncations at every kind of length, an empty
    file, random bytes, a plain torch.save file, a folder and a missing file: each is a ValueError
    naming the path; a flip is never loaded silently."""
    path = tmp_path / "good.ckpt"
    checkpoint.save(path, "Thing", _state(5))
    blob = path.read_bytes()
    rng = random.Random(0)
    bad = tmp_path / "bad.ckpt"
    positions = sorted(set(rng.sample(range(len(blob)), 60)) | set(range(0, HEADER_BYTES, 7)))
    for pos in positions:
        damaged = bytearray(blob)
        damaged[pos] ^= 1 << rng.randrange(8)
        bad.write_bytes(bytes(damaged))
        with pytest.raises(ValueError, match=r"bad\.ckpt"):
            checkpoint.load(bad, "Thing")
    for cut in sorted(set([0, 1, HEADER_BYTES - 1, HEADER_BYTES, HEADER_BYTES + 1, len(blob) - 1]
                          + rng.sample(range(len(blob)), 20))):
        bad.write_bytes(blob[:cut])
        with pytest.raises(ValueError, match=r"bad\.ckpt"):
            checkpoint.load(bad, "Thing")
    bad.write_bytes(blob + b"\0")
    with pytest.raises(ValueError, match="truncated or extended"):
        checkpoint.load(bad, "Thing")
    bad.write_bytes(os.urandom(5000))
    with pytest.raises(ValueError, match="no checkpoint header"):
        checkpoint.load(bad, "Thing")
    torch.save(_state(1), bad)
    with pytest.raises(ValueError, match="predates checkpoint format 1"):
        checkpoint.load(bad, "Thing")
    torch.save(_state(1), bad, _use_new_zipfile_serialization=False)
    with pytest.raises(ValueError, match="predates checkpoint format 1"):
        checkpoint.load(bad, "Thing")
    with pytest.raises(ValueError, match="no such checkpoint file"):
        checkpoint.load(tmp_path / "missing.ckpt", "Thing")
    with pytest.raises(ValueError, match="is a folder"):
        checkpoint.load(tmp_path, "Thing")


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_a_state_that_needs_code_to_load_is_refused(tmp_path):
    """A payload that unpickles into arbitrary objects (with a valid header and checksum) is refused
    by the weights-only loader, never executed."""
    path = tmp_path / "evil.ckpt"
    checkpoint.save(path, "Thing", {"x": _Evil()})
    with pytest.raises(ValueError, match="the state cannot be read"):
        checkpoint.load(path, "Thing")


def _save_step(path, i):
    checkpoint.save(path, "Thing", _state(i, 400_000))


def test_a_writer_killed_at_random_points_leaves_the_old_or_the_new_state(tmp_path):
    """A process rewriting a 1.6 MB checkpoint in a loop is killed with SIGKILL at random instants,
    24 times: every load afterwards gives a whole state of some step (never a torn one), and the next
    save sweeps the temporaries the killed writer left."""
    path = tmp_path / "state.ckpt"
    checkpoint.save(path, "Thing", _state(0, 400_000))

    def check():
        state, _ = checkpoint.load(path, "Thing")
        assert _same(state, _state(state["step"], 400_000))
        return state["step"]

    steps = kill_writer(__file__, "_save_step", [str(path)], check, kills=24, max_delay=0.4)
    assert len(set(steps)) > 1  # the kills did land between saves of different steps
    checkpoint.save(path, "Thing", _state(-1))
    assert sorted(os.listdir(tmp_path)) == ["state.ckpt"]


def test_a_failed_write_leaves_nothing_behind(tmp_path):
    path = tmp_path / "x.ckpt"
    checkpoint.save(path, "Thing", _state(1))

    def boom(fh):
        fh.write(b"partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        checkpoint.atomic_write(path, boom)
    assert sorted(os.listdir(tmp_path)) == ["x.ckpt"] and _same(checkpoint.load(path, "Thing")[0], _state(1))


def test_stored_paths_stay_inside_their_folder(tmp_path):
    (tmp_path / "streams" / "a").mkdir(parents=True)
    assert checkpoint.inside(tmp_path, "streams/a") == tmp_path / "streams" / "a"
    os.symlink("/", tmp_path / "escape")
    for bad in ("../../..", "/etc", "streams/../../x", "escape", "", None, 3):
        with pytest.raises(ValueError, match="stored path"):
            checkpoint.inside(tmp_path, bad)


def test_state_reader_names_the_path_and_the_field():
    state = {"emb": torch.tensor([[1.0, float("nan")]]), "count": -1, "t": float("nan"), "kind": "x",
             "sub": {"ids": torch.tensor([0, 5])}}
    reader = StateReader("/ckpt", "Thing", state)
    with pytest.raises(ValueError, match=r"/ckpt: Thing checkpoint field 'emb' must be finite"):
        reader.tensor("emb", dtype=torch.float32, ndim=2, finite=True)
    with pytest.raises(ValueError, match="'emb' must have shape \\(\\*, 3\\)"):
        reader.tensor("emb", shape=(None, 3))
    with pytest.raises(ValueError, match="'emb' must be torch.int64"):
        reader.tensor("emb", dtype=torch.int64)
    with pytest.raises(ValueError, match="'count' must lie in \\[0, None\\]"):
        reader.int("count", low=0)
    with pytest.raises(ValueError, match="'t' must be a finite number"):
        reader.real("t")
    with pytest.raises(ValueError, match="'kind' must be one of"):
        reader.str("kind", choices=("a", "b"))
    with pytest.raises(ValueError, match="'missing' is missing"):
        reader.get("missing")
    with pytest.raises(ValueError, match="'sub.ids' must be <= 3"):
        reader.sub("sub").tensor("ids", high=3)


def test_nested_readers_name_the_whole_field_and_lists_name_the_entry():
    state = {"outer": {"inner": {"times": [0.0, float("nan")], "ids": [1, "2"], "names": ["a", 3]}}}
    inner = StateReader("/ckpt", "Thing", state).sub("outer").sub("inner")
    with pytest.raises(ValueError, match=r"'outer\.inner\.times\[1\]' must be a finite number"):
        inner.reals("times")
    with pytest.raises(ValueError, match=r"'outer\.inner\.ids\[1\]' must be an int"):
        inner.ints("ids")
    with pytest.raises(ValueError, match=r"'outer\.inner\.names\[1\]' must be a string"):
        inner.strs("names")
    with pytest.raises(ValueError, match=r"'outer\.inner\.ids' holds a duplicate"):
        inner.require(False, "ids", "holds a duplicate")
    assert checkpoint.reader_for(inner, "Thing") is inner
    with pytest.raises(ValueError, match="state_dict: a Thing state must be a dict"):
        checkpoint.reader_for([1], "Thing")


def test_ensure_folder_creates_the_missing_parents(tmp_path):
    folder = checkpoint.ensure_folder(tmp_path / "a" / "b" / "c")
    assert folder.is_dir() and checkpoint.ensure_folder(folder) == folder


def test_state_reader_spans_refuse_an_end_before_its_start():
    reader = StateReader("/ckpt", "Thing", {"t_start": [0.0, 2.0], "t_end": [1.0, 1.5]})
    with pytest.raises(ValueError, match=r"/ckpt.*t_end\[1\].*must be >= t_start \(2\.0\), got 1\.5"):
        reader.spans("t_start", "t_end", length=2)
    assert StateReader("/ckpt", "Thing", {"a": [0.0], "b": [0.0]}).spans("a", "b", length=1) == ([0.0], [0.0])
