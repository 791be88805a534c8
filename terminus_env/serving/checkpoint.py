"""What a Hugging Face checkpoint folder holds, read from its safetensors headers (no torch), and whether a new
checkpoint can replace the model a replica serves.

vLLM's in-place reload takes whatever a folder holds: a tensor left out keeps its old values and is only logged
("Following weights were not loaded from checkpoint"), a tensor of the wrong shape fails halfway through and
leaves the engine unable to serve, and a folder that does not exist fails at the replica. So the pool checks a
checkpoint against the served model before any replica pauses: every tensor the served model has, under the same
name and with the same shape, none it lacks, each file as long as its header says, and the same architecture.
Reading a header costs a few kilobytes per file, whatever the model's size.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from terminus_env.serving.client import ServingError

SAFETENSORS_INDEX = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100 << 20  # the safetensors format's own limit on a header
# Buffers some checkpoints carry and vLLM never loads: their presence or absence says nothing about the weights.
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)
LISTED = 5  # names quoted in an error before "and N more"


class CheckpointError(ServingError):
    """A checkpoint cannot replace the served model as it is; the message says what is wrong and what to do."""


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint folder's tensors (name to shape) and the architectures its ``config.json`` names."""

    path: Path
    shapes: dict[str, tuple[int, ...]]
    architectures: tuple[str, ...]


def read_checkpoint(folder: str | Path) -> Checkpoint:
    """The tensors of a folder saved with ``save_pretrained`` (safetensors, one file or shards with their index)."""
    path = Path(folder)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such folder; save the model there first (model.save_pretrained(path))")
    files = _weight_files(path)
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        for name, shape in _header(file).items():
            if name in shapes:
                raise CheckpointError(f"{path}: tensor {name} is in two files; save the checkpoint again")
            shapes[name] = shape
    return Checkpoint(path, shapes, _architectures(path))


def mismatches(new: Checkpoint, served: Checkpoint) -> list[str]:
    """What keeps ``new`` from replacing ``served`` tensor for tensor (empty when nothing does)."""
    problems = []
    if new.architectures and served.architectures and new.architectures != served.architectures:
        problems.append(f"architecture {', '.join(new.architectures)} instead of {', '.join(served.architectures)}")
    ours, theirs = _kept(new.shapes), _kept(served.shapes)
    missing = sorted(theirs.keys() - ours.keys())
    if missing:
        problems.append(f"{len(missing)} tensor(s) missing: {_listed(missing)}")
    extra = sorted(ours.keys() - theirs.keys())
    if extra:
        problems.append(f"{len(extra)} tensor(s) the served model does not have: {_listed(extra)}")
    reshaped = sorted(name for name in ours.keys() & theirs.keys() if ours[name] != theirs[name])
    if reshaped:
        problems.append(f"{len(reshaped)} tensor(s) of another shape: " + _listed(
            [f"{name} {list(ours[name])} (served: {list(theirs[name])})" for name in reshaped]))  # fmt: skip
    return problems


def check_replaces(new: str | Path, served: str | Path) -> Checkpoint:
    """``new`` read and checked against the checkpoint ``served``; a :class:`CheckpointError` says why it cannot."""
    reference = read_checkpoint(served)
    try:
        checkpoint = read_checkpoint(new)
        problems = mismatches(checkpoint, reference)
    except CheckpointError as exc:
        checkpoint, problems = None, [str(exc)]
    if problems or checkpoint is None:
        raise CheckpointError(
            f"{new} cannot replace the served model ({served}): {'; '.join(problems)}. No replica was touched; save "
            "the whole model, with the served model's architecture, where every replica reads it "
            "(model.save_pretrained(path)), then sync again"
        )
    return checkpoint


def _weight_files(path: Path) -> list[Path]:
    """The files vLLM would read: those the index names when there is one, else every ``*.safetensors``."""
    index = path / SAFETENSORS_INDEX
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"{index}: not a safetensors index ({exc}); save the checkpoint again") from exc
        files = [path / name for name in names]
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise CheckpointError(f"{path}: the index names {_listed(absent)}, which the folder lacks")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        others = sorted(p.name for p in path.glob("*.bin")) or sorted(p.name for p in path.iterdir())[:LISTED]
        raise CheckpointError(
            f"{path}: no *.safetensors file (found: {', '.join(others) or 'nothing'}); save with safetensors, "
            "save_pretrained's default (safe_serialization=True)"
        )
    return files


def _header(file: Path) -> dict[str, tuple[int, ...]]:
    """A safetensors file's tensors and shapes; refuses a file shorter than its header says (cut while copying)."""
    try:
        with file.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if size > MAX_HEADER_BYTES:
                raise ValueError(f"a header of {size} bytes")
            header = json.loads(f.read(size))
        data_bytes = file.stat().st_size - 8 - size
    except (OSError, ValueError, struct.error) as exc:
        raise CheckpointError(f"{file}: not a safetensors file ({exc}); save the checkpoint again") from exc
    shapes = {}
    end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            shapes[name] = tuple(int(n) for n in entry["shape"])
            end = max(end, int(entry["data_offsets"][1]))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise CheckpointError(f"{file}: tensor {name}'s header entry is malformed ({exc})") from exc
    if end > data_bytes:
        raise CheckpointError(
            f"{file}: holds {data_bytes} bytes of tensor data where its header needs {end}: the file was cut short "
            "(a save or copy still running, or a full disk); save the checkpoint again"
        )
    return shapes


def _architectures(path: Path) -> tuple[str, ...]:
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return ()
    names = config.get("architectures") if isinstance(config, dict) else None
    return tuple(names) if isinstance(names, list) else ()


def _kept(shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    return {name: shape for name, shape in shapes.items() if not name.endswith(IGNORED_SUFFIXES)}


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:LISTED])
    return shown + (f" and {len(names) - LISTED} more" if len(names) > LISTED else "")
