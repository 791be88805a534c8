"""vLLM 0.32's context-length rules for a chat request, as pure functions: what the simulator grants or refuses.

The order and the words are vLLM's, since clients parse them (:mod:`terminus_env.serving.context_refusal`):

1. a ``max_tokens`` above ``max_model_len`` is refused (``TokenizeParams``, before the prompt is read);
2. a prompt longer than the context is refused; vLLM tokenizes at most ``max_model_len + 1`` tokens, so the count
   it reports is capped there, and then says "at least";
3. ``max_tokens`` is cut to the room the prompt leaves (``get_max_tokens``); no ``max_tokens`` asks for all of it;
4. what is left must be at least 1 (``SamplingParams``): a prompt of exactly the context leaves 0, and is refused
   as "max_tokens must be at least 1, got 0", not as a context error.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Refusal:
    """A 400 in vLLM's words: the message (with vLLM's ``(parameter=..., value=...)`` suffix) and the parameter."""

    message: str
    param: str


def granted_tokens(prompt_len: int, max_tokens: object, max_model_len: int) -> int | Refusal:
    """The tokens a request may generate, or vLLM's refusal of it."""
    asked = None if max_tokens is None else max_tokens
    if isinstance(asked, bool) or not (asked is None or isinstance(asked, int)):
        return _refusal(f"max_tokens must be an integer, got {asked!r}.", "max_tokens", asked)
    if asked is not None and asked > max_model_len:
        return _refusal(
            f"max_tokens={asked} cannot be greater than max_model_len={max_model_len}. Please request fewer output "
            "tokens.", "max_tokens", asked,
        )  # fmt: skip
    if prompt_len > max_model_len:
        counted = min(prompt_len, max_model_len + 1)
        qualifier = "at least " if counted == max_model_len + 1 else ""
        return _refusal(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains "
            f"{qualifier}{counted} input tokens, which exceeds this limit even without any output tokens. Please "
            "reduce the length of the input prompt.", "input_tokens", counted,
        )  # fmt: skip
    room = max_model_len - prompt_len
    granted = room if asked is None else min(asked, room)
    if granted < 1:
        return _refusal(f"max_tokens must be at least 1, got {granted}.", "max_tokens", granted)
    return granted


def _refusal(message: str, param: str, value: object) -> Refusal:
    return Refusal(f"{message} (parameter={param}, value={value})", param)
