"""The experiment's supervised start (``bench/strict_lab``): it trains on the assistant's turns and nothing else, and
its broken-opening probe reads the model's own probability. Here because it needs transformers, which .venv-vllm has."""

from __future__ import annotations

import math

import pytest
import torch
from strict_lab import sft
from strict_lab.demos import Demo, broken_opening, confirm_reply, solution_reply
from strict_lab.probe import broken_opening_probability

from terminus_env.cli.tiny_model import TinyModelConfig, chatml_tokenizer, random_qwen2
from terminus_env.protocol import prompts
from terminus_env.tasks import find_task


def _demo() -> Demo:
    task = find_task("hello-world")
    first = prompts.initial_prompt(task.instruction, "root@box:/app# ")
    feedback = "Your previous response had parsing errors, so none of its commands ran."
    messages = [
        {"role": "user", "content": first},
        {"role": "assistant", "content": broken_opening(solution_reply(task))},
        {"role": "user", "content": feedback},
        {"role": "assistant", "content": solution_reply(task)},
        {"role": "user", "content": "You marked the task as complete. Are you sure?"},
        {"role": "assistant", "content": confirm_reply()},
    ]
    return Demo(task.name, True, messages)


def test_only_the_assistant_turns_and_their_end_tokens_are_labelled():
    demo = _demo()
    tokenizer = chatml_tokenizer([m["content"] for m in demo.messages], 1024)
    ids, labels, first = sft._example(tokenizer, demo)
    assert ids == tokenizer.apply_chat_template(demo.messages, tokenize=True, return_dict=True)["input_ids"]
    kept = [i for i, label in zip(ids, labels) if label != -100]
    expected = "".join(m["content"] + "<|im_end|>" for m in demo.messages if m["role"] == "assistant")
    assert tokenizer.decode(kept) == expected
    assert tokenizer.decode([i for i, f in zip(ids, first) if f]) == demo.messages[1]["content"] + "<|im_end|>"


def test_the_probe_is_one_minus_the_probability_of_the_opening_tokens():
    demo = _demo()
    tokenizer = chatml_tokenizer([m["content"] for m in demo.messages], 1024)
    model = random_qwen2(tokenizer, TinyModelConfig(seed=3))
    prompt = demo.messages[0]["content"]
    context = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            tokenize=True, return_dict=True)["input_ids"]  # fmt: skip
    target = tokenizer("<response>", add_special_tokens=False)["input_ids"]
    logp = 0.0
    with torch.no_grad():  # one token at a time, as sampling would
        for i, token in enumerate(target):
            logits = model(input_ids=torch.tensor([context + target[:i]])).logits[0, -1]
            logp += float(torch.log_softmax(logits, -1)[token])
    assert broken_opening_probability(model, tokenizer, [prompt]) == pytest.approx(1 - math.exp(logp), abs=1e-6)


def test_a_tied_base_model_is_untied_with_the_same_outputs():
    demo = _demo()
    tokenizer = chatml_tokenizer([m["content"] for m in demo.messages], 1024)
    tied = random_qwen2(tokenizer, TinyModelConfig(tie_word_embeddings=True))
    ids = torch.tensor([tokenizer(demo.messages[1]["content"])["input_ids"]])
    before = tied(input_ids=ids).logits.detach()
    model = sft.untied(tied)
    assert not model.config.tie_word_embeddings
    assert model.get_output_embeddings().weight is not model.get_input_embeddings().weight
    assert torch.equal(model(input_ids=ids).logits.detach(), before)
    with torch.no_grad():  # trained apart from now on
        model.get_input_embeddings().weight.add_(1.0)
    assert not torch.equal(model.get_output_embeddings().weight, model.get_input_embeddings().weight)


def test_the_weight_applies_to_the_first_turn_and_padding_changes_nothing():
    demo = _demo()
    tokenizer = chatml_tokenizer([m["content"] for m in demo.messages], 1024)
    model = random_qwen2(tokenizer, TinyModelConfig(seed=1))
    long = sft._example(tokenizer, demo)
    short = sft._example(tokenizer, Demo(demo.task, False, demo.messages[:2]))  # its only turn is the first
    with torch.no_grad():
        own = [model(input_ids=torch.tensor([ids]), labels=torch.tensor([labels])).loss.item() for ids, labels, _ in
               (long, short)]  # fmt: skip
        both = sft._weighted_loss(model, tokenizer.pad_token_id, [(long, 1.0), (short, 0.25)], "cpu").item()
    assert both == pytest.approx((own[0] + 0.25 * own[1]) / 2, rel=1e-4)
