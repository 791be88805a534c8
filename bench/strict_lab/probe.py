"""The policy's own probability of a broken opening: 1 - P(the reply starts with ``<response>``), by teacher forcing
the first prompt of each task. Unlike the sampled error rate it has no sampling noise, so a drift of a few points shows
from one step to the next."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

OPENING = "<response>"


def broken_opening_probability(model: Any, tokenizer: Any, first_prompts: Sequence[str]) -> float:
    """The mean over ``first_prompts`` of the probability that the reply does not open with ``<response>``."""
    import torch

    target = tokenizer(OPENING, add_special_tokens=False)["input_ids"]
    was_training = model.training
    model.eval()
    probabilities = []
    with torch.no_grad():
        for prompt in first_prompts:
            context = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
            ids = torch.tensor([list(context) + target], device=model.device)
            logits = model(input_ids=ids).logits[0, len(context) - 1 : -1].float()
            logp = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(target, device=model.device)[:, None]).sum()
            probabilities.append(1.0 - float(logp.exp()))
    model.train(was_training)
    return sum(probabilities) / len(probabilities)
