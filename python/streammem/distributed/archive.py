"""``index_archive``: one ``StreamMemory`` per video of an archive, on Ray or on this machine.

One video is the unit of work: decode (``VideoSource`` at ``fps`` and ``size``)
-> motion gate -> frame encoder -> memory -> ``StreamMemory.save``.  Each
result is written to a temporary directory beside its final place, with a
``result.json`` naming the source file (size and modification time) and the
run's settings, then renamed into ``out_dir/videos/<id>``: a video directory
either is complete or does not exist, whatever crashed.

``out_dir/manifest.json`` indexes the results (rewritten atomically after each
video).  With ``resume=True`` a video whose directory holds a ``result.json``
for the same source file and settings is skipped, whether or not the manifest
recorded it (a driver that died after the rename loses nothing); a video whose
worker crashed has no such directory and is redone.  Running twice is
idempotent.  Settings other than those of an existing ``out_dir`` raise
``ValueError`` instead of mixing two kinds of memories.

Backends (same result, tested equal):

* ``"ray"``: ``num_workers`` actors, each loading the models once in its
  constructor (``num_cpus_per_worker`` CPUs and as many torch / OpenMP
  threads, ``num_gpus_per_worker`` GPUs), fed one video at a time; a worker
  that dies is restarted and its video retried (``max_restarts``);
* ``"local"``: ``num_workers`` = 1 runs the loop in this process; more runs
  spawned processes, each loading the models once.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import time
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np

from ..checkpoint import inside, load_json, save_json
from ..config import MemoryConfig
from ..models.encoders import encoder_spec, resolve_encoder
from ..stream.context import Context
from ..stream.memory import StreamMemory
from ._threads import configure_threads

__all__ = ["index_archive", "index_video", "ArchiveResult", "VideoMemory", "video_id"]

_MANIFEST = "manifest.json"
_RESULT = "result.json"
_MANIFEST_KIND = "streammem.Archive"
_RESULT_KIND = "streammem.VideoResult"
_VIDEO_EXTENSIONS = (".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".mpg", ".mpeg")


def video_id(path) -> str:
    """Directory name of a video's memory: its file stem and a hash of its absolute path."""
    path = Path(path).resolve()
    digest = hashlib.blake2b(str(path).encode(), digest_size=5).hexdigest()
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in path.stem)[:40]
    return f"{stem}-{digest}"


def _source_info(path: Path) -> dict:
    st = path.stat()
    return {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _settings(config: MemoryConfig, fps, size, gate_batch, frame_spec, text_spec) -> dict:
    return {"config": config.to_dict(), "fps": fps, "size": size, "gate_batch": gate_batch,
            "frame_encoder": frame_spec, "text_encoder": text_spec}


# --------------------------------------------------------------------------
# One video
# --------------------------------------------------------------------------
def index_video(path, out_dir, config: MemoryConfig, frame_encoder, text_encoder, *, fps: float | None = None,
                size: int | None = 320, gate_batch: int = 16, settings: dict | None = None) -> dict:
    """Index one video into ``out_dir`` (replaced atomically); returns its ``result.json`` content.

    Seconds are reported per stage (decode, gate + encode + form = memory, save).
    """
    from ..io.video import VideoSource

    path = Path(path).resolve()
    out_dir = Path(out_dir)
    t0, cpu0 = time.perf_counter(), time.process_time()
    source = VideoSource(path, fps=fps, size=size)
    memory = StreamMemory(config, frame_encoder, text_encoder)
    decode_s = 0.0
    times, frames = [], []
    it = iter(source)
    while True:
        t1 = time.perf_counter()
        item = next(it, None)
        decode_s += time.perf_counter() - t1
        if item is not None:
            times.append(item[0])
            frames.append(item[1])
        if frames and (item is None or len(frames) == gate_batch):
            memory.push(times, np.stack(frames))
            times, frames = [], []
        if item is None:
            break
    memory.finish()
    t2 = time.perf_counter()
    tmp = out_dir.with_name(f".{out_dir.name}.{uuid.uuid4().hex[:8]}.tmp")
    memory.save(tmp)
    s = memory.summary()
    result = {"id": out_dir.name, "source": _source_info(path), "settings": settings,
              "frames": s["frames_seen"], "kept": s["frames_kept"], "nodes": s["tree_nodes"],
              "events": s["events"], "seconds": {"total": None, "decode": round(decode_s, 4),
                                                  "memory": round(t2 - t0 - decode_s, 4)}}
    result["seconds"]["save"] = round(time.perf_counter() - t2, 4)
    result["seconds"]["total"] = round(time.perf_counter() - t0, 4)
    result["seconds"]["cpu"] = round(time.process_time() - cpu0, 4)  # every thread of this process
    save_json(tmp / _RESULT, _RESULT_KIND, result)
    _replace_dir(tmp, out_dir)
    return result


def _replace_dir(tmp: Path, final: Path) -> None:
    if final.exists():
        old = final.with_name(f".{final.name}.{uuid.uuid4().hex[:8]}.old")
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)


class _Indexer:
    """Models loaded once; indexes videos one after another (the body of a worker)."""

    def __init__(self, config_dict: dict, frame_encoder, text_encoder, fps, size, gate_batch, settings,
                 num_threads: int = 1):
        configure_threads(num_threads)
        t0 = time.perf_counter()
        self.config = MemoryConfig.from_dict(config_dict)
        self.frame_encoder = resolve_encoder(frame_encoder, "frame")
        self.text_encoder = resolve_encoder(text_encoder, "text")
        self.model_load_s = time.perf_counter() - t0
        self.fps, self.size, self.gate_batch, self.settings = fps, size, gate_batch, settings

    def ready(self) -> dict:
        import os as _os

        return {"model_load_s": self.model_load_s, "pid": _os.getpid()}

    def index(self, path: str, out_dir: str) -> dict:
        try:
            return index_video(path, out_dir, self.config, self.frame_encoder, self.text_encoder, fps=self.fps,
                               size=self.size, gate_batch=self.gate_batch, settings=self.settings)
        except Exception as exc:  # a video that cannot be indexed is reported, not fatal to the worker
            return {"id": Path(out_dir).name, "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc(limit=5), "source": {"path": str(path)}}


_WORKER: _Indexer | None = None


def _process_init(*args) -> None:
    global _WORKER
    _WORKER = _Indexer(*args)


def _process_index(path: str, out_dir: str) -> dict:
    return _WORKER.index(path, out_dir)


# --------------------------------------------------------------------------
# The archive
# --------------------------------------------------------------------------
@dataclass
class ArchiveResult:
    """What ``index_archive`` did: per video its result (or error), and the run's timings.

    ``videos`` maps video id -> result dict (``frames``, ``kept``, ``nodes``,
    ``events``, ``seconds``, ``source``; ``error`` for a failed video).
    ``indexed`` / ``skipped`` / ``failed`` list the ids of this run.  Timings:
    ``setup_s`` (``ray.init`` when this call started Ray), ``startup_s``
    (workers created -> all ready: process start, imports, model load),
    ``model_load_s`` (per worker, inside ``startup_s``), ``wall_s`` (steady
    state: first video dispatched -> last result).
    """

    out_dir: Path
    videos: dict = field(default_factory=dict)
    indexed: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    failed: list = field(default_factory=list)
    backend: str = "local"
    num_workers: int = 1
    setup_s: float = 0.0
    startup_s: float = 0.0
    model_load_s: list = field(default_factory=list)
    wall_s: float = 0.0

    def load(self, vid: str, **kwargs) -> "VideoMemory":
        """The memory of one video (by id)."""
        return VideoMemory.load(inside(self.out_dir / "videos", vid), **kwargs)

    @property
    def frames(self) -> int:
        return sum(self.videos[v].get("frames", 0) for v in self.indexed)


class VideoMemory:
    """One indexed video: its ``StreamMemory``, its source and its indexing result."""

    def __init__(self, memory: StreamMemory, result: dict, directory: Path):
        self.memory = memory
        self.result = result
        self.directory = Path(directory)

    @classmethod
    def load(cls, directory, frame_encoder=None, text_encoder=None, **hooks) -> "VideoMemory":
        """Open ``out_dir/videos/<id>`` (encoders rebuilt from their saved spec unless passed)."""
        directory = Path(directory)
        result_path = directory / _RESULT
        if not result_path.is_file():
            raise FileNotFoundError(f"{directory} is not an indexed video (missing {_RESULT})")
        memory = StreamMemory.load(directory, frame_encoder, text_encoder, **hooks)
        return cls(memory, _read_json(result_path, _RESULT_KIND), directory)

    @property
    def source(self) -> str:
        return self.result["source"]["path"]

    def ask(self, question: str) -> Context:
        return self.memory.ask(question)

    def summary(self) -> dict:
        return self.memory.summary()


def _read_json(path: Path, kind: str) -> dict:
    """The data of the index file ``path`` (``checkpoint.load_json``: kind, version and checksum checked);
    a damaged one is one ``ValueError`` naming ``path``."""
    data, _ = load_json(path, kind)
    return data


def _expand(paths) -> list[Path]:
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            out.extend(sorted(q for q in p.iterdir() if q.suffix.lower() in _VIDEO_EXTENSIONS))
        elif p.is_file():
            out.append(p.resolve())
        else:
            raise FileNotFoundError(f"video file not found: {p}")
    ids = [video_id(p) for p in out]
    if len(set(ids)) != len(ids):
        raise ValueError("paths must not name the same video twice")
    return out


def _done(video_dir: Path, source: dict, settings: dict) -> dict | None:
    path = video_dir / _RESULT
    if not path.is_file() or not (video_dir / "state.pt").is_file():
        return None
    result = _read_json(path, _RESULT_KIND)
    return result if result.get("source") == source and result.get("settings") == settings else None


def index_archive(paths: Iterable | str | os.PathLike, out_dir, *, preset: str = "base",
                  config: MemoryConfig | None = None, fps: float | None = None, size: int | None = 320,
                  encoder="auto", text_encoder="auto", num_workers: int | None = None, num_gpus_per_worker: float = 0,
                  num_cpus_per_worker: int = 1, resume: bool = True, backend: str = "ray", gate_batch: int = 16,
                  on_error: str = "raise", max_restarts: int = 2) -> ArchiveResult:
    """Index every video of ``paths`` into ``out_dir`` (see the module docstring).

    Parameters
    ----------
    paths : path, directory or iterable of paths
        A directory contributes its video files (by extension), sorted.
    out_dir : path
        ``manifest.json`` and ``videos/<id>/`` (``StreamMemory.save`` + ``result.json``).
    preset, config
        ``config`` (a ``MemoryConfig``) wins over ``preset``.
    fps, size
        Decoding rate (None: native) and working size (long side).
    encoder, text_encoder
        Frame / text encoder: "auto", a built-in name, a spec dict, or an
        encoder object with a ``spec()``.
    num_workers : int, optional
        Parallel workers (default: the CPUs Ray or this machine offers, divided
        by ``num_cpus_per_worker``; local default 1).
    resume : bool
        Skip videos already indexed with the same settings (False: redo all).
    backend : {"ray", "local"}
    on_error : {"raise", "record"}
        A video that fails (unreadable file...) is recorded in the manifest
        either way; "raise" raises ``RuntimeError`` listing them at the end.
    """
    if backend not in ("ray", "local"):
        raise ValueError(f"backend must be 'ray' or 'local', got {backend!r}")
    if on_error not in ("raise", "record"):
        raise ValueError(f"on_error must be 'raise' or 'record', got {on_error!r}")
    config = config if config is not None else MemoryConfig.from_preset(preset)
    frame_spec = _spec_of(encoder, "encoder")
    text_spec = _spec_of(text_encoder, "text_encoder")
    settings = _settings(config, fps, size, gate_batch, frame_spec, text_spec)
    out_dir = Path(out_dir)
    (out_dir / "videos").mkdir(parents=True, exist_ok=True)
    manifest_path = out_dir / _MANIFEST
    manifest = _read_json(manifest_path, _MANIFEST_KIND) if manifest_path.is_file() else None
    if manifest is not None and not isinstance(manifest.get("videos"), dict):
        raise ValueError(f"{manifest_path}: field 'videos' must map video ids to their entries")
    if manifest is not None and manifest.get("settings") != settings:
        if resume:
            raise ValueError(f"out_dir {out_dir} was indexed with other settings (config, fps, size or encoders); "
                             "use another out_dir, or resume=False to redo every video")
        manifest = None
    manifest = manifest or {"format": "streammem.archive", "version": 1, "settings": settings, "videos": {}}

    result = ArchiveResult(out_dir=out_dir, backend=backend)
    todo: list[tuple[Path, Path]] = []
    for path in _expand(paths):
        vid = video_id(path)
        video_dir = out_dir / "videos" / vid
        done = _done(video_dir, _source_info(path), settings) if resume else None
        if done is not None:
            manifest["videos"][vid] = _manifest_entry(done)
            result.videos[vid] = done
            result.skipped.append(vid)
        else:
            todo.append((path, video_dir))
    _write_manifest(manifest_path, manifest)
    if todo:
        run = _run_ray if backend == "ray" else _run_local
        run(todo, config, encoder, text_encoder, fps, size, gate_batch, settings, num_workers, num_cpus_per_worker,
            num_gpus_per_worker, max_restarts, result, manifest, manifest_path)
    if result.failed and on_error == "raise":
        errors = "; ".join(f"{v}: {result.videos[v]['error']}" for v in result.failed)
        raise RuntimeError(f"{len(result.failed)} of {len(todo)} videos failed (recorded in {manifest_path}): {errors}")
    return result


def _spec_of(encoder, name: str):
    if encoder == "auto" or isinstance(encoder, (str, dict)):
        return encoder if not isinstance(encoder, str) or encoder == "auto" else {"name": encoder}
    spec = encoder_spec(encoder)
    if spec is None:
        raise ValueError(f"{name} must be 'auto', a built-in name, a spec dict, or an encoder with spec()")
    return spec


def _manifest_entry(result: dict) -> dict:
    keep = ("source", "frames", "kept", "nodes", "events", "seconds", "error")
    return {k: result[k] for k in keep if k in result} | {"status": "failed" if "error" in result else "done"}


def _write_manifest(path: Path, manifest: dict) -> None:
    save_json(path, _MANIFEST_KIND, manifest)


def _record(result: ArchiveResult, manifest: dict, manifest_path: Path, out: dict) -> None:
    vid = out["id"]
    result.videos[vid] = out
    (result.failed if "error" in out else result.indexed).append(vid)
    manifest["videos"][vid] = _manifest_entry(out)
    _write_manifest(manifest_path, manifest)


def _run_local(todo, config, encoder, text_encoder, fps, size, gate_batch, settings, num_workers, num_cpus,
               num_gpus, max_restarts, result, manifest, manifest_path) -> None:
    n = 1 if num_workers is None else int(num_workers)
    if n < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers!r}")
    n = min(n, len(todo))
    result.num_workers = n
    args = (config.to_dict(), encoder, text_encoder, fps, size, gate_batch, settings, num_cpus)
    if n == 1:
        t0 = time.perf_counter()
        worker = _Indexer(*args)
        result.startup_s = time.perf_counter() - t0
        result.model_load_s = [worker.model_load_s]
        t0 = time.perf_counter()
        for path, video_dir in todo:
            _record(result, manifest, manifest_path, worker.index(str(path), str(video_dir)))
        result.wall_s = time.perf_counter() - t0
        return
    import multiprocessing as mp

    t0 = time.perf_counter()
    with _process_pool(n, mp.get_context("spawn"), args) as pool:
        futures = [pool.submit(_process_index, str(p), str(d)) for p, d in todo]
        for fut in futures:
            _record(result, manifest, manifest_path, fut.result())
    result.wall_s = time.perf_counter() - t0


def _process_pool(n, context, args):
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(n, mp_context=context, initializer=_process_init, initargs=args)


def _run_ray(todo, config, encoder, text_encoder, fps, size, gate_batch, settings, num_workers, num_cpus,
             num_gpus, max_restarts, result, manifest, manifest_path) -> None:
    from ._ray import require_ray

    ray = require_ray()
    t0 = time.perf_counter()
    if not ray.is_initialized():
        ray.init()
    result.setup_s = time.perf_counter() - t0
    if num_workers is None:
        num_workers = max(1, int(ray.available_resources().get("CPU", 1) // num_cpus))
    n = min(int(num_workers), len(todo))
    if n < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers!r}")
    result.num_workers = n
    remote = ray.remote(_Indexer).options(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=max_restarts,
                                          max_task_retries=max_restarts)
    args = (config.to_dict(), encoder, text_encoder, fps, size, gate_batch, settings, num_cpus)
    t1 = time.perf_counter()
    workers = [remote.remote(*args) for _ in range(n)]
    result.model_load_s = [r["model_load_s"] for r in ray.get([w.ready.remote() for w in workers])]
    result.startup_s = time.perf_counter() - t1
    t1 = time.perf_counter()
    queue = list(todo)
    running = {}
    for w in workers:  # one video per worker at a time: a slow video never holds others back
        if queue:
            path, video_dir = queue.pop(0)
            running[w.index.remote(str(path), str(video_dir))] = w
    while running:
        ready, _ = ray.wait(list(running), num_returns=1)
        w = running.pop(ready[0])
        _record(result, manifest, manifest_path, ray.get(ready[0]))
        if queue:
            path, video_dir = queue.pop(0)
            running[w.index.remote(str(path), str(video_dir))] = w
    result.wall_s = time.perf_counter() - t1
    for w in workers:
        ray.kill(w)
