"""Fixtures of the adapter tests: the tiny task, and a ChatML tokenizer trained on it (see adapter_support)."""

from __future__ import annotations

import pytest
from adapter_support import chatml_tokenizer

from terminus_env import load_task


@pytest.fixture(scope="module")
def task(tiny_task_dir):
    return load_task(tiny_task_dir)


@pytest.fixture(scope="module")
def tokenizer(task):
    return chatml_tokenizer([task])
