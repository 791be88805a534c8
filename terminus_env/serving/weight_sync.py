"""How a trainer's new weights reach a replica: the sources :meth:`ServingPool.sync_weights` applies.

A source is first checked against the model the replicas serve, before any replica pauses, then loads weights
into one paused replica. The pool does the rest around it: it holds new requests, lets those in flight finish on
the old weights, pauses each replica, applies the source, resets the prefix cache (its KV was computed with the
old weights), records the version and resumes. A replica that fails to load is given back the last good weights;
one that cannot take them either is tagged :data:`BROKEN_TAG` on ``/weight_info`` and left paused, which
``terminus-env serve`` answers by starting it again.

:class:`CheckpointReload` is the one that works everywhere, the CPU included: the trainer saves the
model (``save_pretrained``) where every replica can read it, and vLLM reloads it in place
(``reload_weights`` through ``/collective_rpc``). On GPUs, vLLM's NCCL and IPC transfer engines
(``/init_weight_transfer_engine``, ``/update_weights``) move tensors without the disk; a source for
them fits the same protocol but is not written yet (docs/serving.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from terminus_env.serving.checkpoint import CheckpointError, check_replaces
from terminus_env.serving.client import FRESH_WEIGHT_VERSION, ReplicaClient, ServingError

log = logging.getLogger(__name__)

# The weight version a replica is tagged with when it failed to load and could not be given back the last good
# weights: it must not serve again before it is restarted (``terminus-env serve`` restarts it when it reads this).
BROKEN_TAG = "terminus-env:broken"


class WeightSource(Protocol):
    """New weights for a paused replica."""

    async def check(self, served: str) -> None:
        """Raise when these weights cannot replace ``served`` (the folder or name the replicas started from)
        whole; called before any replica pauses."""

    async def load(self, replica: ReplicaClient) -> None: ...


@dataclass(frozen=True)
class CheckpointReload:
    """Weights saved by the trainer in Hugging Face format (``model.save_pretrained(path)``) on a shared disk.

    vLLM reads every tensor the model has from ``path``, so the checkpoint must hold the whole model
    with the architecture the replicas serve; the tokenizer stays the one they started with.

    A model whose output layer is tied to its embeddings (``tie_word_embeddings``, as in the small
    Qwen2.5 and Qwen3 models) is refused: vLLM 0.32 reloads the embeddings in place but leaves the tied
    output layer with the old weights, so the replicas would serve a model that exists nowhere
    (``tests/real_vllm/test_weight_sync.py`` shows it).

    Before any replica pauses, the checkpoint is compared with the model the replicas started from (their
    ``/v1/models`` ``root``, a folder or a name in this machine's Hugging Face cache) or with ``reference``, a
    folder holding that model: every tensor, by name and shape (:mod:`terminus_env.serving.checkpoint`).
    """

    path: str
    reference: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", str(Path(self.path).resolve()))
        if _tied_embeddings(Path(self.path)):
            raise ValueError(
                f"{self.path}: the model ties its output layer to its embeddings, which vLLM 0.32's in-place reload "
                "leaves with the old weights; train and serve it untied (tie_word_embeddings=False, the output "
                "layer a copy of the embeddings), or restart the replicas on each checkpoint"
            )

    async def check(self, served: str) -> None:
        reference = self.reference or served
        await asyncio.to_thread(lambda: check_replaces(self.path, served_folder(reference)))

    async def load(self, replica: ReplicaClient) -> None:
        await replica.collective_rpc("reload_weights", {"weights_path": self.path})


@dataclass(frozen=True)
class InitialWeights:
    """The weights a replica started with, reloaded from where it loaded them (its ``/v1/models`` ``root``, a
    folder or a Hugging Face name the replica resolves): the last good weights before any sync."""

    root: str

    async def check(self, served: str) -> None:
        if self.root != served:
            raise CheckpointError(f"the replicas serve {served}, not {self.root}")

    async def load(self, replica: ReplicaClient) -> None:
        await replica.collective_rpc("reload_weights", {"weights_path": self.root})


def served_folder(root: str) -> Path:
    """The folder holding the served model: ``root`` itself, or a Hugging Face name's snapshot in the local cache."""
    if Path(root).is_dir():
        return Path(root)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(root, local_files_only=True))
    except Exception as exc:  # not installed, not a repository name, or not in the cache: each says so
        raise CheckpointError(
            f"the served model {root!r} is neither a folder here nor in this machine's Hugging Face cache ({exc}), "
            "so a checkpoint cannot be checked against it: pass CheckpointReload(path, reference=FOLDER) with a "
            "folder holding the served model"
        ) from exc


def _tied_embeddings(checkpoint: Path) -> bool:
    """What the checkpoint's ``config.json`` says (at the top, or under ``text_config`` for multimodal models)."""
    try:
        config = json.loads((checkpoint / "config.json").read_text())
    except (OSError, ValueError):
        return False  # not readable from here: the replicas will say what is wrong
    return bool(config.get("tie_word_embeddings", (config.get("text_config") or {}).get("tie_word_embeddings")))


@dataclass(frozen=True)
class Weights:
    """Weights a replica can be given: where they load from, and the version tag that names them on the replica."""

    source: WeightSource | None  # None: not known here (an earlier trainer's weights, say), so not reloadable
    tag: str | None  # None: the replicas report no version


class LoadFailed(ServingError):
    """A replica did not take new weights. ``restored``: it serves the last good weights again, under their tag;
    otherwise it is tagged :data:`BROKEN_TAG` and left paused until it restarts, or it no longer answers."""

    def __init__(self, message: str, *, restored: bool) -> None:
        super().__init__(message)
        self.restored = restored


async def load_into(replica: ReplicaClient, weights: Weights, good: Weights) -> float:
    """Pause, load, reset the prefix cache, tag, resume; the seconds loading took. A replica that fails on the way
    is given ``good`` back before it serves again (:class:`LoadFailed` says whether that worked)."""
    if weights.source is None or weights.tag is None:
        raise ValueError("load_into needs weights with a source and a tag")
    await replica.pause("wait")
    try:
        started = time.perf_counter()
        await weights.source.load(replica)
        load_s = time.perf_counter() - started
        await replica.reset_prefix_cache()
        await replica.set_weight_version(weights.tag)
    except BaseException as exc:  # a cancelled sync too: the replica must not stay paused with half its weights
        restored = await _restore(replica, good)
        if not isinstance(exc, Exception):
            raise
        outcome = f"it serves version {good.tag} again" if restored else "it is left paused until it restarts"
        raise LoadFailed(f"{replica.base_url}: {exc}; {outcome}", restored=restored) from exc
    try:
        await replica.resume()
    except ServingError as exc:  # it holds the new weights under their tag, paused: taken back once it answers
        raise LoadFailed(f"{replica.base_url}: loaded, then did not resume: {exc}", restored=False) from exc
    return load_s


async def _restore(replica: ReplicaClient, good: Weights) -> bool:
    """The last good weights back into a replica whose load failed, and resume it. When it cannot take them (vLLM
    0.32's reload fails for good after a reload that failed halfway), tag it broken and leave it paused: resumed, it
    would serve weights that exist nowhere, or die of its first request."""
    if good.source is not None:
        try:
            await good.source.load(replica)
            await replica.reset_prefix_cache()
            await replica.set_weight_version(good.tag or FRESH_WEIGHT_VERSION)
            await replica.resume()
            return True
        except ServingError as exc:
            log.warning("replica %s did not take the last good weights (%s) back: %s", replica.base_url, good.tag, exc)
    with contextlib.suppress(ServingError):
        await replica.set_weight_version(BROKEN_TAG)
    return False


def version_of(tag: str) -> Any:
    """A version as a replica's tag spells it: the integer a trainer's step was, else the string."""
    return int(tag) if tag.lstrip("-").isdigit() else tag


@dataclass(frozen=True)
class WeightSync:
    """What one ``sync_weights`` did: the version now served, on which replicas, and how long the pool held requests."""

    version: str
    replicas: tuple[str, ...]
    skipped: tuple[str, ...]  # down at the time, or failed to load: each gets these weights before it serves again
    held_s: float  # new requests waited this long (drain + load + cache reset)
    load_s: float  # of which loading the weights, the slowest replica
