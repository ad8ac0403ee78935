"""Shard checkpoints: the index may not point outside its folder, a damaged index is one ValueError,
and a shard restarted before its first checkpoint keeps every stream it acknowledged."""
import pytest

from streammem import HashingTextEncoder, PixelEncoder
from streammem.checkpoint import load_json, save_json
from streammem.distributed import ShardMemory
from test_distributed import CONFIG, _batch, stream_items


def _shard(folder, **kwargs):
    return ShardMemory(CONFIG, PixelEncoder(), HashingTextEncoder(), checkpoint_dir=folder, **kwargs)


@pytest.mark.parametrize("dirname", ["../../..", "/etc", "../elsewhere", "a/../../../x"])
def test_shard_json_pointing_outside_its_checkpoint_dir_is_refused(tmp_path, dirname):
    """shard.json could point a stream at a folder outside the checkpoint directory (../../..): even a
    crafted index with a valid checksum is refused."""
    folder = tmp_path / "ckpt"
    shard = _shard(folder)
    shard.add_stream("cam")
    index, version = load_json(folder / "shard.json", "streammem.ShardMemory")
    index["streams"]["cam"] = dirname
    save_json(folder / "shard.json", "streammem.ShardMemory", index, version=version)
    with pytest.raises(ValueError, match=r"shard\.json.*leaves the folder|shard\.json.*relative"):
        _shard(folder)


@pytest.mark.parametrize("content", [b"", b"{", b"\xff\xfe", b"[1, 2]", b'{"format": "streammem.ShardMemory"}',
                                     b"[" * 100_000])
def test_damaged_shard_json_is_one_value_error_naming_it(tmp_path, content):
    folder = tmp_path / "ckpt"
    _shard(folder).add_stream("cam")
    (folder / "shard.json").write_bytes(content)
    with pytest.raises(ValueError, match=r"shard\.json"):
        _shard(folder)


def test_every_flipped_byte_or_truncation_of_shard_json_is_refused_or_loads_identical(tmp_path):
    """The stream list is checksummed like a checkpoint: a damaged shard.json never restores another list."""
    folder = tmp_path / "ckpt"
    shard = _shard(folder)
    for sid in ("cam0", "cam1"):
        shard.add_stream(sid)
    raw = (folder / "shard.json").read_bytes()
    for i in range(0, len(raw), max(1, len(raw) // 60)):
        for damaged in (raw[:i] + bytes([raw[i] ^ 0x04]) + raw[i + 1:], raw[:i]):
            (folder / "shard.json").write_bytes(damaged)
            try:
                restored = _shard(folder)
            except ValueError as exc:
                assert "shard.json" in str(exc)
            else:
                assert sorted(restored.streams()) == ["cam0", "cam1"]


def test_a_shard_restarted_before_its_first_checkpoint_keeps_its_streams_and_counts_the_lost_frames(tmp_path):
    """A restart before the first checkpoint came back with no streams: acknowledged frames were lost
    uncounted and every later push raised "not on this shard".  The stream list is durable before a
    stream is acknowledged: the restarted shard holds the streams, and the next push counts exactly
    the frames it cannot replay as missing."""
    folder = tmp_path / "ckpt"
    streams = {f"cam{i}": stream_items(i) for i in range(2)}
    shard = _shard(folder)
    for sid in streams:
        assert shard.add_stream(sid)
    shard.push([(sid, 0, *_batch(items[:20])) for sid, items in streams.items()])  # acknowledged, then lost
    restarted = _shard(folder)
    assert sorted(restarted.streams()) == sorted(streams) and restarted.restored_streams == 2
    acks = restarted.push([(sid, 20, *_batch(items[20:])) for sid, items in streams.items()])
    for sid, items in streams.items():
        assert acks[sid]["frames_missing"] == 20 and acks[sid]["frames_seen"] == len(items)
        assert restarted.ask(sid, "what colour?").stream_time == pytest.approx(items[-1][0])


def test_an_attached_stream_is_durable_before_attach_returns(tmp_path):
    source = _shard(tmp_path / "a")
    source.add_stream("cam")
    items = stream_items(0)
    source.push([("cam", 0, *_batch(items[:15]))])
    target = _shard(tmp_path / "b")
    target.attach_stream("cam", source.remove_stream("cam"))
    restarted = _shard(tmp_path / "b")
    assert restarted.memory_state("cam")["counters"]["frames_seen"] == 15


def test_archive_indexes_are_checked_and_never_leave_their_folder(tmp_path):
    """The archive's manifest.json and result.json are index files too: damaged ones are one
    ValueError naming them, and a video id cannot reach outside out_dir/videos."""
    from streammem.distributed import index_archive
    from test_distributed import ARCHIVE, write_clip

    clip = write_clip(tmp_path / "clip0.avi", 0, n=12)
    out = tmp_path / "index"
    res = index_archive([clip], out, backend="local", **ARCHIVE)
    with pytest.raises(ValueError, match="leaves the folder"):
        res.load("../../..")
    (vid,) = res.indexed
    (out / "videos" / vid / "result.json").write_bytes(b"\x00{")
    with pytest.raises(ValueError, match="result.json"):
        res.load(vid)
    (out / "manifest.json").write_bytes(b"[" * 50_000)
    with pytest.raises(ValueError, match="manifest.json"):
        index_archive([clip], out, backend="local", **ARCHIVE)
    index_archive([clip], tmp_path / "again", backend="local", **ARCHIVE)
    manifest = tmp_path / "again" / "manifest.json"
    text = manifest.read_text()
    manifest.write_text(text.replace('"frames": 12', '"frames": 13'))  # a flipped digit: the checksum refuses it
    with pytest.raises(ValueError, match="manifest.json.*checksum"):
        index_archive([clip], tmp_path / "again", backend="local", **ARCHIVE)
