"""The supervised start: a causal LM taught the recorded demonstrations, with a set share of broken openings.

By default the model is made here (``terminus_env.cli.tiny_model``'s Qwen2, wider and deeper, and a byte-level BPE
trained on the demonstrations' text); given ``base`` (a folder or Hugging Face name) it fine-tunes that model and
keeps its tokenizer and chat template instead (the GPU recipe). Only the assistant turns are trained.

The broken-opening rate is set by loss weights, not by sampling: each step holds both demonstrations of each of its
tasks, the first turn of the broken one weighted ``broken_rate`` and that of the clean one ``1 - broken_rate``. The
two share the first prompt, so the loss's minimum is a first token that opens without ``<response>`` with
probability ``broken_rate``, for every task. Every later turn weighs 1: the recovery after a rejected opening is
learned as firmly as the clean episode (weighting the whole broken episode by ``broken_rate`` left a start model
that solved 25% of its episodes after a rejected first turn, against 72% after an accepted one). Drawing the broken
demonstration at that rate instead of weighting left a 0.6M model, after 500 steps of 4, opening broken with
probability 0.03 on some tasks and 0.998 on others: it ends where its last few batches pushed it.

Every container has its own hostname, which the prompt's shell prompt shows (``root@942b0081d848:/app#``); each
example gets fresh random ones, so the model learns that they do not matter rather than the two it was shown.
"""

from __future__ import annotations

import json
import math
import random
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from strict_lab.demos import Demo
from terminus_env.cli.tiny_model import TinyModelConfig, chatml_tokenizer, random_qwen2

# The tiny model's shape (2 layers, hidden 128) with room for more merges: on 2 shared cores a wider, deeper model (4
# layers, hidden 256, 2.8M parameters) took 15 s per step of 8 demonstrations, this one about 3 s per step of 4.
MADE_HERE = TinyModelConfig(vocab_size=2048)
HOSTNAME = re.compile(r"(?<=@)[0-9a-f]{12}(?=:)")  # Docker's short container id, the sandbox's hostname


@dataclass(frozen=True)
class SftConfig:
    broken_rate: float = 0.1
    steps: int = 160
    tasks_per_step: int | None = None
    """Tasks in each step, both demonstrations of each; None: every task (full-batch steps)."""
    learning_rate: float = 4e-3
    warmup_steps: int = 20
    seed: int = 0
    base: str | None = None
    """A model to fine-tune (folder or Hugging Face name); None makes one here from ``model``."""
    model: TinyModelConfig = field(default_factory=lambda: MADE_HERE)


@dataclass(frozen=True)
class SftResult:
    directory: str
    parameters: int
    vocab: int
    examples: int
    tokens_per_example: tuple[int, int]
    seconds: float
    losses: list[float]


def train(demos: Sequence[Demo], directory: Path, config: SftConfig) -> SftResult:
    """Fit the model to the demonstrations and save it (untied output layer: vLLM's reload needs it)."""
    import torch

    started = time.perf_counter()
    torch.manual_seed(config.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer, model = _start(demos, config)
    model.to(device)
    clean = {d.task: d for d in demos if not d.broken_opening}
    broken = {d.task: d for d in demos if d.broken_opening}
    if set(clean) != set(broken):
        raise ValueError("every task needs a clean and a broken demonstration (strict_lab.demos.record makes both)")
    tasks = sorted(clean)
    rng = random.Random(config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _warmup_cosine(s, config))
    losses = []
    model.train()
    for step in range(1, config.steps + 1):
        chosen = rng.sample(tasks, config.tasks_per_step) if config.tasks_per_step else tasks
        weighted = [(clean[task], 1 - config.broken_rate) for task in chosen]
        weighted += [(broken[task], config.broken_rate) for task in chosen]
        batch = [(_example(tokenizer, _fresh_hosts(demo, rng)), weight) for demo, weight in weighted]
        loss = _weighted_loss(model, tokenizer.pad_token_id, batch, device)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        losses.append(round(loss.item(), 4))
        if step % 10 == 0 or step == config.steps:
            print(f"   SFT step {step}/{config.steps}: loss {losses[-1]:.3f} ({time.perf_counter() - started:.0f} s)",
                  flush=True)  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True)
    model.to("cpu").save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    lengths = [len(_example(tokenizer, d)[0]) for d in demos]
    result = SftResult(
        directory=str(directory), parameters=sum(p.numel() for p in model.parameters()), vocab=len(tokenizer),
        examples=len(demos), tokens_per_example=(min(lengths), max(lengths)),
        seconds=round(time.perf_counter() - started, 1), losses=losses,
    )  # fmt: skip
    (directory / "sft.json").write_text(json.dumps({"config": asdict(config), "result": asdict(result)}, indent=1))
    return result


Example = tuple[list[int], list[int], list[bool]]  # token ids, labels, whether in the first assistant turn


def _weighted_loss(model: Any, pad: int, batch: Sequence[tuple[Example, float]], device: str) -> Any:
    """The mean over examples of each one's token loss over its labelled tokens, the first assistant turn's tokens
    weighted by the example's weight, every other turn's by 1."""
    import torch

    width = max(len(ids) for (ids, _, _), _ in batch)
    ids = torch.tensor([i + [pad] * (width - len(i)) for (i, _, _), _ in batch], device=device)
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for (_, lab, _), _ in batch], device=device)
    mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for (i, _, _), _ in batch], device=device)
    weights = torch.tensor(
        [[w if first else 1.0 for first in f] + [0.0] * (width - len(f)) for (_, _, f), w in batch], device=device
    )
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    targets = labels[:, 1:]
    token_loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100, reduction="none"
    ).view(targets.shape)
    counted = (targets != -100).float()
    per_example = (token_loss * counted * weights[:, 1:]).sum(1) / counted.sum(1).clamp(min=1)
    return per_example.mean()


def _fresh_hosts(demo: Demo, rng: random.Random) -> Demo:
    """The demonstration with every container hostname replaced by a new random one (one per hostname)."""
    text = json.dumps(demo.messages)
    names = {old: "".join(rng.choice("0123456789abcdef") for _ in range(12)) for old in set(HOSTNAME.findall(text))}
    messages = [{**m, "content": HOSTNAME.sub(lambda h: names[h.group(0)], m["content"])} for m in demo.messages]
    return Demo(demo.task, demo.broken_opening, messages)


def _warmup_cosine(step: int, config: SftConfig) -> float:
    """Warm up, then decay to 0: the last steps average over many batches, so the share of broken openings the model
    ends with is the data's, not that of the last few batches drawn."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def _start(demos: Sequence[Demo], config: SftConfig) -> tuple[Any, Any]:
    import torch

    if config.base is None:
        tokenizer = chatml_tokenizer([m["content"] for d in demos for m in d.messages], config.model.vocab_size)
        return tokenizer, random_qwen2(tokenizer, config.model)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(config.base)
    model = AutoModelForCausalLM.from_pretrained(config.base, dtype=torch.float32)
    return tokenizer, untied(model)


def untied(model: Any) -> Any:
    """The model with its own copy of the embeddings as output layer (vLLM 0.32 reloads a tied one stale)."""
    import torch

    if not model.config.tie_word_embeddings:
        return model
    output = model.get_output_embeddings()
    output.weight = torch.nn.Parameter(model.get_input_embeddings().weight.detach().clone())
    model.config.tie_word_embeddings = False
    return model


def _example(tokenizer: Any, demo: Demo) -> Example:
    """Token ids of the whole conversation, labels that keep the assistant turns (with their end token) only, and
    which tokens belong to the first assistant turn."""
    text = tokenizer.apply_chat_template(demo.messages, tokenize=False)
    spans, cursor = [], 0
    for message in demo.messages:
        start = text.index(message["content"], cursor)
        cursor = start + len(message["content"])
        if message["role"] == "assistant":
            end = cursor + len(tokenizer.eos_token) if text.startswith(tokenizer.eos_token, cursor) else cursor
            spans.append((start, end))
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    labels = [
        token if any(s <= offset[0] < e for s, e in spans) else -100
        for token, offset in zip(encoded["input_ids"], encoded["offset_mapping"])
    ]
    first = [spans[0][0] <= offset[0] < spans[0][1] for offset in encoded["offset_mapping"]]
    return list(encoded["input_ids"]), labels, first
