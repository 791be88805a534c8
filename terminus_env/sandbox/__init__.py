"""Sandboxes: one hardened container per episode with a fast tmux terminal, a warm pool, images and a reaper."""

from terminus_env.sandbox.errors import DockerUnavailable, ImageBuildError, SandboxError, TerminalGone
from terminus_env.sandbox.images import BASE_IMAGE, ensure_base_image, ensure_image
from terminus_env.sandbox.pool import SandboxPool
from terminus_env.sandbox.reaper import reap
from terminus_env.sandbox.sandbox import ExecResult, Sandbox
from terminus_env.sandbox.spec import SandboxSpec
from terminus_env.sandbox.terminal import Terminal, TerminalOutput

__all__ = [
    "BASE_IMAGE", "DockerUnavailable", "ExecResult", "ImageBuildError", "Sandbox", "SandboxError", "SandboxPool",
    "SandboxSpec", "Terminal", "TerminalGone", "TerminalOutput", "ensure_base_image", "ensure_image", "reap",
]  # fmt: skip
