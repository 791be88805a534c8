"""What an engine's refusal says about the context: exhausted (the episode's context limit), or room left to ask for.

A conversation that fills the model's context is the agent's end (``context_limit``), never the infrastructure's: a
refusal read as a plain error would mask the episode, and a policy that lands on the boundary would escape its 0.
Engines word the boundary differently, and the same engine words it differently on each side of it:

- vLLM 0.32, a prompt longer than the context: "This model's maximum context length is N tokens. However, your
  prompt contains [at least] P input tokens, which exceeds this limit even without any output tokens." A prompt of
  exactly the context passes that check, and vLLM then cuts ``max_tokens`` to the room left, 0, which its sampling
  parameters refuse: "max_tokens must be at least 1, got 0." (``get_max_tokens``, then ``SamplingParams``.)
- vLLM before it cut ``max_tokens``: "This model's maximum context length is N tokens. However, you requested T
  tokens (P in the messages, C in the completion)." Its ``get_max_tokens`` also raised "Input length (P) exceeds
  model's maximum context length (N)."
- SGLang (``TokenizerManager._validate_one_request``): "The input (P tokens) is longer than the model's context
  length (N tokens)." when P >= N, and "Requested token count exceeds the model's maximum context length of N
  tokens. You requested a total of T tokens: P tokens from the input messages and C tokens for the completion."
  when P + C >= N (SGLang never cuts ``max_tokens``; it asks for strictly less than the room).

The words are the fast path. Where they are not recognised, the pool measures the prompt instead (vLLM's
``/tokenize``) and compares it with the context the replica reports: :func:`exhausted_by_measure`.
"""

from __future__ import annotations

import re

_CONTEXT_WORDS = (
    re.compile(r"maximum context length", re.I),  # vLLM, every release; SGLang's total check
    re.compile(r"is longer than the model's context length", re.I),  # SGLang's input check
)
# The engine cut max_tokens to the room the prompt left, and the room was none (vLLM 0.10 and later).
_NO_ROOM = re.compile(r"max_(?:completion_)?tokens must be at least 1, got 0\b")
# Refusals that give the prompt's size, so that the request can be asked again for what fits.
_VLLM_COUNTS = re.compile(r"maximum context length is (\d+) tokens.*?\((\d+) in the messages, \d+ in the", re.S)
_SGLANG_COUNTS = re.compile(r"maximum context length of (\d+) tokens.*?(\d+) tokens from the input messages", re.S)


def context_exhausted(message: str, asked: int) -> bool:
    """Whether an engine's 400 ``message``, answering a request for ``asked`` tokens, refused it for the context.

    "max_tokens must be at least 1, got 0" counts only when at least one token was asked for: then the engine
    itself cut the request to the room left, and found none."""
    if any(words.search(message) for words in _CONTEXT_WORDS):
        return True
    return asked >= 1 and _NO_ROOM.search(message) is not None


def room_left(message: str, asked: int) -> int | None:
    """The tokens a request may ask for after a refusal that counted the prompt and found the prompt itself fits
    (an engine that refuses rather than cuts an overlong ``max_tokens``); None when the message does not say, or the
    prompt leaves nothing (the context is exhausted)."""
    if (match := _VLLM_COUNTS.search(message)) is not None:
        room = int(match.group(1)) - int(match.group(2))  # vLLM allows prompt + completion == context
    elif (match := _SGLANG_COUNTS.search(message)) is not None:
        room = int(match.group(1)) - int(match.group(2)) - 1  # SGLang refuses prompt + completion >= context
    else:
        return None
    return room if 0 < room < asked else None


def exhausted_by_measure(prompt_tokens: int, max_model_len: int) -> bool:
    """A prompt measured at ``prompt_tokens`` leaves no room for one token of reply in a ``max_model_len`` context."""
    return prompt_tokens >= max_model_len
