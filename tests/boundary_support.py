"""Conversations on the context's boundary on purpose: a task whose first prompt is any number of tokens.

The task's image gives the shell a fixed prompt (``/app#``, no container id), so the first observation is the same
in every container; its instruction ends in ``padding`` filler words. A test measures the first prompt of the
unpadded task once (``first_messages``, with whatever tokenizer the server uses), then pads the instruction until
the prompt is exactly the context, or one token short of it.
"""

from __future__ import annotations

from pathlib import Path

from task_support import write_task

from terminus_env import TerminusEnv, load_task

FIXED_SHELL_PROMPT = "RUN echo \"PS1='\\\\w# '\" >> /root/.bashrc\n"
FILLER = " a"  # one token with the toy tokenizer and with the tiny model's byte-level BPE
NAME = "boundary"  # the instruction names its task, so every padded copy has the same name
NO_COMMAND = "<response><analysis>Waiting.</analysis><plan>Look again.</plan><commands></commands></response>"
"""A reply that runs nothing: the observation after it is the same in every run, so later prompts are too."""


def boundary_task(root: Path, padding: int) -> Path:
    """The boundary task, its instruction ending in ``padding`` filler words, in ``root``; its folder."""
    task = write_task(root, NAME, dockerfile_extra=FIXED_SHELL_PROMPT)
    instruction = task / "instruction.md"
    instruction.write_text(instruction.read_text().rstrip("\n") + FILLER * padding + "\n")
    return task


def first_messages(task: Path) -> list[dict[str, str]]:
    """The conversation the env opens with for ``task`` (one sandbox started and closed)."""
    env = TerminusEnv(load_task(task), mode="eval")
    try:
        env.reset()
        return [dict(message) for message in env.messages]
    finally:
        env.close()


def padded(messages: list[dict[str, str]], padding: int) -> list[dict[str, str]]:
    """``messages`` (of the unpadded task) as the task padded with ``padding`` words opens them."""
    first = messages[0]["content"]
    marker = "/app/hello.txt."
    assert first.count(marker) == 1, "the instruction's last words are not where the padding goes"
    return [{**messages[0], "content": first.replace(marker, marker + FILLER * padding)}, *messages[1:]]
