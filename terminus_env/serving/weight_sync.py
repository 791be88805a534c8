"""How a trainer's new weights reach a replica: the sources :meth:`ServingPool.sync_weights` applies.

A source loads weights into one paused replica. The pool does the rest around it: it holds new
requests, lets those in flight finish on the old weights, pauses each replica, applies the source,
resets the prefix cache (its KV was computed with the old weights), records the version and resumes.

:class:`CheckpointReload` is the one that works everywhere, the CPU included: the trainer saves the
model (``save_pretrained``) where every replica can read it, and vLLM reloads it in place
(``reload_weights`` through ``/collective_rpc``). On GPUs, vLLM's NCCL and IPC transfer engines
(``/init_weight_transfer_engine``, ``/update_weights``) move tensors without the disk; a source for
them fits the same protocol but is not written yet (docs/serving.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from terminus_env.serving.client import ReplicaClient


class WeightSource(Protocol):
    """New weights for a paused replica."""

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
    """

    path: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", str(Path(self.path).resolve()))
        if _tied_embeddings(Path(self.path)):
            raise ValueError(
                f"{self.path}: the model ties its output layer to its embeddings, which vLLM 0.32's in-place reload "
                "leaves with the old weights; train and serve it untied (tie_word_embeddings=False, the output "
                "layer a copy of the embeddings), or restart the replicas on each checkpoint"
            )

    async def load(self, replica: ReplicaClient) -> None:
        await replica.collective_rpc("reload_weights", {"weights_path": self.path})


def _tied_embeddings(checkpoint: Path) -> bool:
    """What the checkpoint's ``config.json`` says (at the top, or under ``text_config`` for multimodal models)."""
    try:
        config = json.loads((checkpoint / "config.json").read_text())
    except (OSError, ValueError):
        return False  # not readable from here: the replicas will say what is wrong
    return bool(config.get("tie_word_embeddings", (config.get("text_config") or {}).get("tie_word_embeddings")))


@dataclass(frozen=True)
class WeightSync:
    """What one ``sync_weights`` did: the version now served, on which replicas, and how long the pool held requests."""

    version: str
    replicas: tuple[str, ...]
    skipped: tuple[str, ...]  # down at the time; each gets these weights before it takes sessions again
    held_s: float  # new requests waited this long (drain + load + cache reset)
    load_s: float  # of which loading the weights, the slowest replica
