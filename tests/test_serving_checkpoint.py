"""Reading a checkpoint's tensors from its safetensors headers, as the weight-sync check does: shards and their
index, a shard the index names but the folder lacks, and a served model named by a Hugging Face name not cached."""

from __future__ import annotations

import json

import pytest
from serving_support import TINY_SHAPES, write_checkpoint

from terminus_env.serving.checkpoint import CheckpointError, check_replaces, read_checkpoint
from terminus_env.serving.weight_sync import served_folder


def sharded(folder, shapes=TINY_SHAPES):
    """The checkpoint split in two shards with save_pretrained's index (``model.safetensors.index.json``)."""
    names = list(shapes)
    first = {n: shapes[n] for n in names[:2]}
    second = {n: shapes[n] for n in names[2:]}
    write_checkpoint(folder / "a", first)
    write_checkpoint(folder / "b", second)
    folder.joinpath("model-00001-of-00002.safetensors").write_bytes((folder / "a" / "model.safetensors").read_bytes())
    folder.joinpath("model-00002-of-00002.safetensors").write_bytes((folder / "b" / "model.safetensors").read_bytes())
    folder.joinpath("config.json").write_text((folder / "a" / "config.json").read_text())
    weight_map = {**{n: "model-00001-of-00002.safetensors" for n in first},
                  **{n: "model-00002-of-00002.safetensors" for n in second}}  # fmt: skip
    folder.joinpath("model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return folder


def test_a_sharded_checkpoint_reads_as_one_and_may_replace_a_single_file(tmp_path):
    shards = sharded(tmp_path / "sharded")
    assert read_checkpoint(shards).shapes == TINY_SHAPES
    assert check_replaces(shards, write_checkpoint(tmp_path / "served")).shapes == TINY_SHAPES
    (shards / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="the index names model-00002-of-00002.safetensors, which the folder"):
        check_replaces(shards, tmp_path / "served")


def test_a_served_model_that_is_neither_a_folder_nor_cached_says_to_name_a_reference(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-cache"))
    with pytest.raises(CheckpointError, match=r"reference=FOLDER"):
        served_folder("some-org/some-model-not-cached")
    assert served_folder(str(tmp_path)) == tmp_path
