"""A deterministic toy tokenizer and chat template, so token counts and prefix reuse mean something.

One token per whitespace-separated chunk (with the whitespace before it), its id a stable hash.
Messages are encoded one by one and concatenated, so a session's next prompt starts with exactly
the tokens of its last prompt and reply: the prefix cache sees the reuse a real server would. A
session resends its whole conversation every turn, so encoded messages are memoised.
"""

from __future__ import annotations

import functools
import hashlib
import re
from typing import Any, Protocol

from terminus_env.serving.client import message_text

VOCAB_SIZE = 151_000
IM_START = 1
IM_END = 2
_FIRST_ORDINARY_ID = 16
_PIECE = re.compile(r"\s*\S+")
_MEMO_MESSAGES = 16_384


def pieces(text: str) -> list[str]:
    """The text cut into token-sized pieces; ``"".join(pieces(t))`` is ``t`` minus trailing space."""
    return _PIECE.findall(text)


def token_id(piece: str) -> int:
    digest = hashlib.blake2b(piece.strip().encode(), digest_size=8).digest()
    return _FIRST_ORDINARY_ID + int.from_bytes(digest, "little") % (VOCAB_SIZE - _FIRST_ORDINARY_ID)


def encode(text: str) -> list[int]:
    return list(_encode(text))


@functools.lru_cache(maxsize=_MEMO_MESSAGES)
def _encode(text: str) -> tuple[int, ...]:
    return tuple(token_id(piece) for piece in pieces(text))


def encode_chat(messages: list[dict]) -> list[int]:
    """The prompt for ``messages``, ending with the assistant's turn opener (the generation prompt)."""
    ids: list[int] = []
    for message in messages:
        if not isinstance(message, dict) or "role" not in message:
            raise ValueError("each message must be an object with a 'role'")
        ids += [IM_START, token_id(str(message["role"])), *_encode(message_text(message)), IM_END]
    return ids + [IM_START, token_id("assistant")]


class ChatTokenizer(Protocol):
    """What the simulated server needs of a tokenizer: a chat prompt's ids and a reply's tokens."""

    end_of_turn: tuple[str, int]  # the token the model generates to end its turn: its text and id

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        """The prompt ids for ``messages``, ending with the assistant's turn opener."""

    def reply(self, text: str) -> list[tuple[str, int]]:
        """The reply's tokens as (text, id); the texts concatenate back to the reply."""


class ToyTokenizer:
    """The default: the toy tokenizer and chat template above."""

    end_of_turn = ("<|im_end|>", IM_END)

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        return encode_chat(messages)

    def reply(self, text: str) -> list[tuple[str, int]]:
        return [(piece, token_id(piece)) for piece in pieces(text)]


class TemplateTokenizer:
    """A Hugging Face tokenizer with a chat template, so the server returns the ids a real server would.

    Prompts are rendered whole each turn, as vLLM's chat endpoint does; whether they extend the
    previous prompt and completion is then up to the template, which is what drift tests need.
    """

    def __init__(self, tokenizer: Any, end_of_turn: str | None = None) -> None:
        self._tokenizer = tokenizer
        text = end_of_turn or tokenizer.eos_token
        token = tokenizer.convert_tokens_to_ids(text)
        if not isinstance(token, int) or token == tokenizer.unk_token_id:
            raise ValueError(f"the tokenizer has no end-of-turn token {text!r}")
        self.end_of_turn = (text, token)

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        rendered = self._tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(self._tokenizer.encode(rendered, add_special_tokens=False))

    def reply(self, text: str) -> list[tuple[str, int]]:
        ids = self._tokenizer.encode(text, add_special_tokens=False)
        return [(self._tokenizer.decode([i]), i) for i in ids]
