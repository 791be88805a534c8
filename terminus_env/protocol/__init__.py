"""The Terminus 2 protocol: parse the model's XML replies, word the observations, choose strictness."""

from terminus_env.protocol.parser import (
    DEFAULT_DURATION,
    MAX_COMMAND_DURATION,
    Command,
    Issue,
    ParsedReply,
    parse_reply,
    salvage_truncated,
)
from terminus_env.protocol.prompts import (
    OUTPUT_LIMIT_BYTES,
    cap_output,
    confirm_completion_prompt,
    initial_prompt,
    output_feedback,
    rejected_feedback,
    truncated_feedback,
)
from terminus_env.protocol.strictness import Strictness

__all__ = [
    "DEFAULT_DURATION",
    "MAX_COMMAND_DURATION",
    "OUTPUT_LIMIT_BYTES",
    "Command",
    "Issue",
    "ParsedReply",
    "Strictness",
    "cap_output",
    "confirm_completion_prompt",
    "initial_prompt",
    "output_feedback",
    "parse_reply",
    "rejected_feedback",
    "salvage_truncated",
    "truncated_feedback",
]
