"""Sandboxes: one hardened container per episode with a fast tmux terminal, a warm pool, images and a reaper."""

from terminus_env.sandbox.errors import (
    AgentCaused,
    BrokenByAgent,
    DaemonFailed,
    DaemonUnanswered,
    DiskLimitExceeded,
    DockerUnavailable,
    ImageBuildError,
    ResourcesExhausted,
    SandboxError,
    SandboxLost,
    TerminalGone,
)
from terminus_env.sandbox.images import (
    BASE_IMAGE,
    ensure_base_image,
    ensure_image,
    ensure_prebuilt,
    ensure_sidecar_image,
)
from terminus_env.sandbox.pool import SandboxPool
from terminus_env.sandbox.reaper import reap
from terminus_env.sandbox.sandbox import ExecResult, Sandbox, VerifierRun
from terminus_env.sandbox.spec import SandboxSpec
from terminus_env.sandbox.terminal import Terminal, TerminalOutput

__all__ = [
    "BASE_IMAGE", "AgentCaused", "BrokenByAgent", "DaemonFailed", "DaemonUnanswered", "DiskLimitExceeded",
    "DockerUnavailable", "ExecResult", "ImageBuildError", "ResourcesExhausted", "Sandbox", "SandboxError",
    "SandboxLost", "SandboxPool", "SandboxSpec", "Terminal", "TerminalGone", "TerminalOutput", "VerifierRun",
    "ensure_base_image", "ensure_image", "ensure_prebuilt", "ensure_sidecar_image", "reap",
]  # fmt: skip
