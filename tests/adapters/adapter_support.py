"""What every adapter test needs: a small ChatML tokenizer built here (no hub download) and served replies.

The tokenizer is a byte-level BPE trained in a fraction of a second on the task's own text, with
Qwen's ChatML template: ``<|im_end|>`` ends a turn and is followed by a newline the model never
generates. The simulated vLLM replica renders every prompt with it, as vLLM's chat endpoint does.
"""

from __future__ import annotations

from collections.abc import Sequence

from terminus_env.cli import tiny_model
from terminus_env.protocol import prompts
from terminus_env.rollout.policy import OracleReplies, oracle_reply
from terminus_env.serving.sim.engine import SimConfig
from terminus_env.serving.sim.server import ServerConfig, SimServer
from terminus_env.serving.sim.tokenizer import TemplateTokenizer
from terminus_env.tasks import Task


def chatml_tokenizer(tasks: Sequence[Task], vocab_size: int = 1024):
    """A ``PreTrainedTokenizerFast`` with Qwen's ChatML template, trained on the tasks' prompts and oracle replies."""
    corpus = []
    for task in tasks:
        screen = "root@box:/app# "
        corpus += [prompts.initial_prompt(task.instruction, screen), oracle_reply(task, 0), oracle_reply(task, 1)]
    corpus.append(HalfRight.WRONG)
    corpus += [prompts.output_feedback("root@box:/app# ls\nhello.txt\n", [], is_screen=False)] * 2
    return tiny_model.chatml_tokenizer(corpus, vocab_size)


class HalfRight:
    """Every other episode's first reply types the solution; the others write the wrong word.

    A GRPO group then has rewards 1 and 0, so advantages are not all zero and a step moves weights.
    """

    WRONG = (
        "<response><analysis>Guess.</analysis><plan>Write a word.</plan><commands>"
        '<keystrokes duration="5">echo goodbye > /app/hello.txt\n</keystrokes></commands></response>'
    )

    def __init__(self, tasks: Sequence[Task]) -> None:
        self._oracle = OracleReplies(tasks)
        self._first_turns = 0

    def __call__(self, messages: list[dict]) -> str:
        if sum(1 for m in messages if m.get("role") == "assistant") == 0:
            self._first_turns += 1
            if self._first_turns % 2 == 0:
                return self.WRONG
        return self._oracle(messages)


def oracle_server(tasks: Sequence[Task], tokenizer, replies=None) -> SimServer:
    """A simulated replica whose 'model' types each task's solution, tokenized with ``tokenizer``."""
    config = ServerConfig(model="sim", time_scale=0.0, engine=SimConfig(max_model_len=32768))
    return SimServer(config, replies or OracleReplies(tasks), tokenizer=TemplateTokenizer(tokenizer))
