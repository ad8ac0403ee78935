"""One checkpoint format for every object that saves state, written atomically and read back checked.

A checkpoint file is an 80-byte header followed by the payload:

==========  =====  ==========================================================
field       bytes  meaning
==========  =====  ==========================================================
magic       8      ``b"SMKCKPT\\0"``
format      4      this layout's version (:data:`FORMAT_VERSION`), little-endian uint32
kind        24     what saved it (``"CosineTree"``, ``"StreamMemory"``...), ASCII, NUL-padded
version     4      the saving object's own state layout version, uint32
length      8      payload bytes, uint64
sha256      32     SHA-256 of the payload
==========  =====  ==========================================================

The payload is ``torch.save`` of a state of tensors, numbers, strings, lists and dicts, read
back with ``weights_only=True`` (no code runs on load).  :func:`save` writes through a temporary
file in the target's folder (flushed and fsynced), renames it over the target and fsyncs the
folder, so a reader, and a process killed at any instant, sees the old file or the new one,
never a part; a temporary left by a killed writer is removed by the next :func:`save` of that
target.  :func:`load` turns every way a file can be wrong (missing, empty, truncated, another
kind, flipped bits, not a checkpoint at all) into one ``ValueError`` naming the path and what is
wrong; :class:`StateReader` then checks each field of the state (type, dtype, shape, finiteness,
ranges) with errors naming the path and the field.  A file from before this format (a plain
``torch.save`` file) is refused with one error naming the format version this code reads.

``docs/checkpoints.md`` describes the format, what each object saves and how it is validated.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import numbers
import os
import struct
import uuid
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable

import torch

__all__ = ["FORMAT_VERSION", "StateReader", "atomic_write", "ensure_folder", "load", "load_json", "save", "save_json",
           "inside", "reader_for", "sweep_temporaries"]

MAGIC = b"SMKCKPT\0"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sI24sIQ32s")
HEADER_BYTES = _HEADER.size  # 80
# A state larger than this is refused before it is read (a corrupt length field must not allocate).
MAX_PAYLOAD_BYTES = 1 << 40
# How the files of torch.save begin (a zip archive, or a pickle of the legacy format): a checkpoint
# written before this format.
_TORCH_SAVE_MAGICS = (b"PK\x03\x04", b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")


def _temporary_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def sweep_temporaries(path) -> list[Path]:
    """Remove the temporaries that writers of ``path`` left behind when they were killed (those whose
    process no longer runs); returns what was removed."""
    path = Path(path)
    removed = []
    prefix = f".{path.name}."
    try:
        names = os.listdir(path.parent if str(path.parent) else ".")
    except FileNotFoundError:
        return removed
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        pid_text = name[len(prefix):].split(".", 1)[0]
        if pid_text.isdigit() and int(pid_text) != os.getpid() and not _pid_alive(int(pid_text)):
            try:
                os.unlink(path.parent / name)
                removed.append(path.parent / name)
            except FileNotFoundError:
                pass
    return removed


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # a platform without directory handles: the rename is what we can do
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_folder(folder) -> Path:
    """Create ``folder`` and its missing parents, fsyncing the parent of each one created, so that a
    checkpoint written into it is found after a crash (a rename is durable only in a durable folder)."""
    folder = Path(folder)
    missing = []
    probe = folder
    while not probe.is_dir():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for created in reversed(missing):
        created.mkdir(exist_ok=True)
        _fsync_folder(created.parent)
    return folder


def atomic_write(path, write: Callable[[BinaryIO], object]) -> Path:
    """Replace ``path`` atomically by what ``write(fh)`` writes to a binary file handle.

    The bytes go to a temporary file beside ``path``, are flushed and fsynced, the file is
    renamed over ``path`` and the folder is fsynced: a reader sees the old file or the new one,
    never a part.  The temporary is removed if ``write`` raises; temporaries of writers killed
    earlier are swept first.
    """
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    sweep_temporaries(path)
    tmp = _temporary_name(path)
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_folder(folder)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def _kind_field(kind: str) -> bytes:
    if not isinstance(kind, str) or not kind or not kind.isascii() or len(kind) > 24:
        raise ValueError(f"kind must be a non-empty ASCII name of at most 24 characters, got {kind!r}")
    return kind.encode("ascii").ljust(24, b"\0")


def save(path, kind: str, state: dict, *, version: int = 1) -> Path:
    """Write ``state`` as a checkpoint of ``kind`` (state layout ``version``) to ``path``, atomically."""
    kind_bytes = _kind_field(kind)
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version < 2**32:
        raise ValueError(f"version must be an int in [0, 2**32), got {version!r}")
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getbuffer()
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, kind_bytes, version, len(payload), hashlib.sha256(payload).digest())

    def write(fh):
        fh.write(header)
        fh.write(payload)

    return atomic_write(path, write)


def load(path, kind: str, *, versions: Iterable[int] = (1,)) -> tuple[dict, int]:
    """Read a checkpoint of ``kind`` written by :func:`save`; returns ``(state, version)``.

    Raises ``ValueError`` naming ``path`` when the file is missing, empty, truncated, not a
    checkpoint, a checkpoint of another kind or of a state version not in ``versions``, or when
    its payload does not match its checksum or cannot be read as a weights-only state.
    """
    path = Path(path)
    kind_bytes = _kind_field(kind)
    versions = tuple(versions)

    def fail(why: str):
        return ValueError(f"{path}: not a readable {kind} checkpoint: {why}")

    try:
        with open(path, "rb") as fh:
            head = fh.read(HEADER_BYTES)
            if len(head) < HEADER_BYTES:
                raise fail(f"{len(head)} bytes, shorter than the {HEADER_BYTES}-byte header")
            magic, fmt, got_kind, version, length, digest = _HEADER.unpack(head)
            if magic != MAGIC:
                if magic.startswith(_TORCH_SAVE_MAGICS):
                    raise fail(f"it predates checkpoint format {FORMAT_VERSION} (a plain torch.save file, written "
                               f"before every checkpoint carried a header and a checksum); this version reads "
                               f"checkpoint format {FORMAT_VERSION} only: build the state again")
                raise fail(f"no checkpoint header (the file is not a streammem checkpoint of format {FORMAT_VERSION})")
            if fmt != FORMAT_VERSION:
                raise fail(f"checkpoint format {fmt}, this version reads format {FORMAT_VERSION}")
            if got_kind != kind_bytes:
                raise fail(f"it holds a {got_kind.rstrip(bytes(1)).decode('ascii', 'replace')!r} state")
            if version not in versions:
                raise fail(f"state layout version {version}, this version reads {sorted(versions)}")
            size = os.fstat(fh.fileno()).st_size
            if length > MAX_PAYLOAD_BYTES or HEADER_BYTES + length != size:
                raise fail(f"the header announces {length} payload bytes, the file holds {size - HEADER_BYTES} "
                           "(truncated or extended)")
            payload = fh.read(length)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such checkpoint file") from None
    except IsADirectoryError:
        raise ValueError(f"{path}: is a folder, not a checkpoint file") from None
    except PermissionError as exc:
        raise ValueError(f"{path}: cannot be read ({exc.strerror})") from None
    if hashlib.sha256(payload).digest() != digest:
        raise fail("its contents do not match their checksum (the file was damaged)")
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable payload is one error for the caller
        raise fail(f"the state cannot be read ({type(exc).__name__}: {exc})") from None
    if not isinstance(state, dict):
        raise fail(f"the state is a {type(state).__name__}, not a dict")
    return state, version


def _json_digest(kind: str, version: int, data: dict) -> str:
    canonical = json.dumps([kind, version, data], sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def save_json(path, kind: str, data: dict, *, version: int = 1) -> Path:
    """Write the JSON object ``data`` as an index file of ``kind`` to ``path``, atomically.

    Index files (a shard's stream list, an archive's manifest) stay readable JSON:
    ``{"format": kind, "version": version, "sha256": ..., "data": data}``, the SHA-256 taken over
    the canonical JSON of kind, version and data (sorted keys, no spaces), so a damaged file is
    refused by :func:`load_json` like a damaged checkpoint.
    """
    _kind_field(kind)
    if not isinstance(data, dict):
        raise ValueError(f"data must be a dict, got {type(data).__name__}")
    doc = {"format": kind, "version": version, "sha256": _json_digest(kind, version, data), "data": data}
    text = json.dumps(doc, indent=1, allow_nan=False).encode()
    return atomic_write(path, lambda fh: fh.write(text))


def load_json(path, kind: str, *, versions: Iterable[int] = (1,)) -> tuple[dict, int]:
    """Read an index file of ``kind`` written by :func:`save_json`; returns ``(data, version)``.

    Raises ``ValueError`` naming ``path`` when the file is missing, not JSON, too deeply nested, of
    another kind or version, or when its data do not match their checksum.
    """
    path = Path(path)

    def fail(why: str):
        return ValueError(f"{path}: not a readable {kind} index: {why}")

    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{path}: no such index file") from None
    except IsADirectoryError:
        raise ValueError(f"{path}: is a folder, not an index file") from None
    except OSError as exc:
        raise ValueError(f"{path}: cannot be read ({exc.strerror})") from None
    if len(raw) > MAX_PAYLOAD_BYTES:
        raise fail(f"{len(raw)} bytes")
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise fail(f"{type(exc).__name__}: {str(exc)[:200]}") from None
    if not isinstance(doc, dict) or set(doc) != {"format", "version", "sha256", "data"}:
        raise fail("not an index document (format, version, sha256, data)")
    if doc["format"] != kind:
        raise fail(f"it holds a {str(doc['format'])[:40]!r} index")
    version = doc["version"]
    if isinstance(version, bool) or not isinstance(version, int) or version not in tuple(versions):
        raise fail(f"index version {version!r}, this version reads {sorted(versions)}")
    data = doc["data"]
    try:
        ok = isinstance(data, dict) and isinstance(doc["sha256"], str) and \
            doc["sha256"] == _json_digest(kind, version, data)
    except (ValueError, TypeError, RecursionError):
        ok = False
    if not ok:
        raise fail("its contents do not match their checksum (the file was damaged)")
    return data, version


def inside(folder, relative) -> Path:
    """``folder / relative`` when it stays inside ``folder`` (no absolute path, no ``..`` escaping it,
    no symlink pointing out); else ``ValueError``.  For paths an index file stores."""
    folder = Path(folder)
    if not isinstance(relative, str) or not relative or os.path.isabs(relative):
        raise ValueError(f"{folder}: the stored path {relative!r} must be a non-empty path relative to the folder")
    target = (folder / relative).resolve()
    root = folder.resolve()
    if target != root and root not in target.parents:
        raise ValueError(f"{folder}: the stored path {relative!r} leaves the folder")
    return folder / relative


def reader_for(state, kind: str, path=None) -> "StateReader":
    """``state`` as a :class:`StateReader`: a reader is returned as it is; a dict is wrapped (errors
    name ``path``, default ``"state_dict"``, and the field); anything else is a ``ValueError``."""
    if isinstance(state, StateReader):
        return state
    where = "state_dict" if path is None else path
    if not isinstance(state, dict):
        raise ValueError(f"{where}: a {kind} state must be a dict (a state_dict), got {type(state).__name__}")
    return StateReader(where, kind, state)


class StateReader:
    """Checks the fields of a loaded state, each failure a ``ValueError`` naming the path and the field.

    >>> reader = StateReader(path, "CosineTree", state)
    >>> emb = reader.tensor("embeddings", dtype=torch.float32, ndim=2, finite=True)
    >>> count = reader.int("num_nodes", low=0, high=emb.shape[0])

    :meth:`sub` reads a nested state (a component's ``state_dict`` inside its owner's): its errors
    name the whole dotted field (``"long_term.nodes.embedding"``).  :meth:`require` states any
    other consistency rule.
    """

    def __init__(self, path, kind: str, state: dict, prefix: str = ""):
        self.path = path
        self.kind = kind
        self.state = state
        self.prefix = prefix

    def field(self, name: str) -> str:
        """The full name of field ``name`` (with the prefixes of the enclosing states)."""
        return self.prefix + name

    def error(self, name: str, why: str) -> ValueError:
        return ValueError(f"{self.path}: {self.kind} checkpoint field {self.field(name)!r} {why}")

    def require(self, condition, name: str, why: str) -> None:
        """``ValueError`` naming field ``name`` (``why``: what is wrong) unless ``condition`` holds."""
        if not condition:
            raise self.error(name, why)

    def has(self, name: str) -> bool:
        return isinstance(self.state, dict) and name in self.state

    def get(self, name: str) -> Any:
        node: Any = self.state
        for part in name.split("."):
            if not isinstance(node, dict) or part not in node:
                raise self.error(name, "is missing")
            node = node[part]
        return node

    def tensor(self, name: str, *, dtype: torch.dtype | Iterable[torch.dtype] | None = None, ndim: int | None = None,
               shape: tuple | None = None, finite: bool = False, low=None, high=None,
               optional: bool = False) -> torch.Tensor | None:
        """The tensor ``name``, checked: dtype, rank, shape (None entries match any size), every value
        finite, and every value in ``[low, high]``."""
        value = self.get(name)
        if value is None and optional:
            return None
        if not isinstance(value, torch.Tensor):
            raise self.error(name, f"must be a tensor, got {type(value).__name__}")
        if value.layout != torch.strided or value.device.type == "meta":
            raise self.error(name, f"must be a dense tensor holding data, got {value.layout} on {value.device}")
        if dtype is not None:
            allowed = (dtype,) if isinstance(dtype, torch.dtype) else tuple(dtype)
            if value.dtype not in allowed:
                raise self.error(name, f"must be {' or '.join(str(d) for d in allowed)}, got {value.dtype}")
        if ndim is not None and value.dim() != ndim:
            raise self.error(name, f"must have {ndim} dimensions, got shape {tuple(value.shape)}")
        if shape is not None and (value.dim() != len(shape) or any(
                want is not None and got != want for got, want in zip(value.shape, shape))):
            want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
            raise self.error(name, f"must have shape {want}, got {tuple(value.shape)}")
        if value.numel():
            if finite and value.is_floating_point() and not bool(torch.isfinite(value).all()):
                raise self.error(name, "must be finite, found NaN or Inf")
            if low is not None and bool((value < low).any()):
                raise self.error(name, f"must be >= {low}, found {value.min().item()}")
            if high is not None and bool((value > high).any()):
                raise self.error(name, f"must be <= {high}, found {value.max().item()}")
        return value

    def int(self, name: str, *, low: int | None = None, high: int | None = None, optional: bool = False) -> int | None:
        return self._int(name, self.get(name), low, high, optional)

    def _int(self, name, value, low, high, optional):
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise self.error(name, f"must be an int, got {value!r:.80}")
        value = int(value)
        if (low is not None and value < low) or (high is not None and value > high):
            raise self.error(name, f"must lie in [{low}, {high}], got {value}")
        return value

    def real(self, name: str, *, low: float | None = None, high: float | None = None,
             optional: bool = False) -> float | None:
        return self._real(name, self.get(name), low, high, optional)

    def _real(self, name, value, low, high, optional):
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
            raise self.error(name, f"must be a finite number, got {value!r:.80}")
        value = float(value)
        if (low is not None and value < low) or (high is not None and value > high):
            raise self.error(name, f"must lie in [{low}, {high}], got {value}")
        return value

    def str(self, name: str, *, choices: Iterable[str] | None = None, optional: bool = False) -> str | None:
        value = self.get(name)
        if value is None and optional:
            return None
        if not isinstance(value, str):
            raise self.error(name, f"must be a string, got {type(value).__name__}")
        if choices is not None and value not in tuple(choices):
            raise self.error(name, f"must be one of {sorted(choices)}, got {value!r:.80}")
        return value

    def bool(self, name: str) -> bool:
        value = self.get(name)
        if not isinstance(value, bool):
            raise self.error(name, f"must be a bool, got {value!r:.80}")
        return value

    def list(self, name: str, *, length: int | None = None, optional: bool = False) -> list | None:
        value = self.get(name)
        if value is None and optional:
            return None
        if not isinstance(value, (list, tuple)):
            raise self.error(name, f"must be a list, got {type(value).__name__}")
        if length is not None and len(value) != length:
            raise self.error(name, f"must hold {length} entries, got {len(value)}")
        return list(value)

    def ints(self, name: str, *, length: int | None = None, low: int | None = None, high: int | None = None,
             optional_items: bool = False) -> list:
        """A list of ints (each in ``[low, high]``; None entries allowed with ``optional_items``)."""
        values = self.list(name, length=length)
        return [self._int(f"{name}[{i}]", v, low, high, optional_items) for i, v in enumerate(values)]

    def reals(self, name: str, *, length: int | None = None, low: float | None = None, high: float | None = None,
              optional_items: bool = False) -> list:
        """A list of finite numbers (each in ``[low, high]``; None entries allowed with ``optional_items``)."""
        values = self.list(name, length=length)
        return [self._real(f"{name}[{i}]", v, low, high, optional_items) for i, v in enumerate(values)]

    def spans(self, start: str, end: str, *, length: int) -> tuple[list, list]:
        """Two lists of finite numbers, ``start[i] <= end[i]`` for each ``i`` (time spans)."""
        starts, ends = self.reals(start, length=length), self.reals(end, length=length)
        for i, (t0, t1) in enumerate(zip(starts, ends)):
            self.require(t0 <= t1, f"{end}[{i}]", f"must be >= {start} ({t0}), got {t1}")
        return starts, ends

    def strs(self, name: str, *, length: int | None = None, optional_items: bool = False) -> list:
        """A list of strings (None entries allowed with ``optional_items``)."""
        values = self.list(name, length=length)
        for i, v in enumerate(values):
            if not (isinstance(v, str) or (v is None and optional_items)):
                raise self.error(f"{name}[{i}]", f"must be a string, got {type(v).__name__}")
        return values

    def dict(self, name: str) -> dict:
        value = self.get(name)
        if not isinstance(value, dict):
            raise self.error(name, f"must be a dict, got {type(value).__name__}")
        return value

    def all_finite(self, name: str, *, skip: Iterable[str] = ()) -> None:
        """Every floating tensor and every float anywhere under field ``name`` (nested dicts and lists)
        is finite; the first that is not is a ``ValueError`` naming its whole field
        (``"long_term.nodes.embedding"``, ``"timings.caption"``).  Keys in ``skip`` are not visited."""
        skip = set(skip)

        def walk(value, field: str) -> None:
            if isinstance(value, torch.Tensor):
                if value.is_floating_point() and value.numel() and not bool(torch.isfinite(value).all()):
                    raise self.error(field, "must be finite, found NaN or Inf")
            elif isinstance(value, float):
                if not math.isfinite(value):
                    raise self.error(field, f"must be finite, got {value}")
            elif isinstance(value, dict):
                for key, item in value.items():
                    if key not in skip:
                        walk(item, f"{field}.{key}")
            elif isinstance(value, (list, tuple)):
                for i, item in enumerate(value):
                    walk(item, f"{field}[{i}]")

        walk(self.get(name), name)

    def restore(self, name: str, load: Callable[[], Any]) -> Any:
        """``load()`` (a component's ``load_state_dict`` of field ``name``), any error it raises turned
        into one ``ValueError`` naming the path and the field: for the checks a component makes
        itself, after the fields this reader checked."""
        try:
            return load()
        except ValueError as exc:
            if str(exc).startswith(f"{self.path}: "):
                raise
            raise self.error(name, f"is invalid ({exc})") from None
        except (KeyError, IndexError, TypeError, AttributeError, RuntimeError, OverflowError) as exc:
            raise self.error(name, f"is invalid ({type(exc).__name__}: {exc})") from None

    def sub(self, name: str, kind: str | None = None) -> "StateReader":
        """A reader of the sub-state ``name`` (errors name ``name.field``)."""
        return StateReader(self.path, kind or self.kind, self.dict(name), self.field(name) + ".")
