"""Policies: where a rollout's replies come from (a served model, or a task's own solution)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import shlex
import tarfile
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from terminus_env.env import Reply
from terminus_env.tasks import Task

if TYPE_CHECKING:
    from terminus_env.serving import ServingPool


@dataclass(frozen=True)
class Rollout:
    """Identifies one rollout to its policy: sticky routing and group affinity key on these ids."""

    rollout_id: str
    group_id: str
    task: Task


@dataclass(frozen=True)
class PolicyOutput:
    """A reply and what the engine said about it: the tokens, where and under which weights it was sampled."""

    reply: Reply
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    replica: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    policy_version: Any = None

    def record_fields(self) -> dict[str, Any]:
        """What a trajectory keeps of it, by the field names :class:`~terminus_env.rollout.trajectory.TurnRecord`
        and :class:`~terminus_env.rollout.trajectory.SummaryCall` share: one place, so the two cannot drift."""
        reply = self.reply
        return {
            "reply": reply.text, "finish_reason": reply.finish_reason, "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens, "prompt_token_ids": self.prompt_token_ids,
            "token_ids": self.token_ids, "logprobs": self.logprobs, "replica": self.replica,
            "sampling": dict(self.sampling), "policy_version": self.policy_version,
        }  # fmt: skip


class Policy(Protocol):
    def session(self, rollout: Rollout) -> contextlib.AbstractAsyncContextManager[None]:
        """Held for the rollout's whole life: admission control and sticky-session release live here."""

    async def act(self, rollout: Rollout, messages: list[dict[str, str]]) -> PolicyOutput: ...


class ServingPolicy:
    """Replies from a model behind a :class:`terminus_env.serving.ServingPool`.

    Every turn records the version of the weights that produced it, with its sampling parameters: the
    pool's (``ServingPool.sync_weights`` names it, and a request in flight during a sync keeps the old
    one), unless a trainer that syncs weights its own way sets ``policy_version`` here.

    A ``seed`` in ``sampling`` is the base of per-request seeds, not one seed for every request: each turn is
    sent with :func:`request_seed` of it, the rollout and the turn, so the rollouts of a GRPO group (one prompt,
    many samples) differ, and a rollout with the same id, prompt and weights draws the same tokens again.
    """

    def __init__(
        self,
        pool: ServingPool,
        *,
        max_tokens: int = 16384,
        sampling: Mapping[str, Any] | None = None,
        policy_version: Any = None,
    ) -> None:
        self._pool = pool
        self._max_tokens = max_tokens
        self._sampling = dict(sampling or {})
        self.policy_version = policy_version

    def session(self, rollout: Rollout) -> contextlib.AbstractAsyncContextManager[None]:
        return self._pool.session(rollout.rollout_id, rollout.group_id)

    async def act(self, rollout: Rollout, messages: list[dict[str, str]]) -> PolicyOutput:
        from terminus_env.serving import ContextLengthExceeded

        version = self.policy_version
        sent = dict(self._sampling)
        if sent.get("seed") is not None:
            sent["seed"] = request_seed(sent["seed"], rollout.rollout_id, _turn(messages))
        sampling = {"max_tokens": self._max_tokens, **sent}
        try:
            completion = await self._pool.chat(
                rollout.rollout_id, messages, max_tokens=self._max_tokens, group_id=rollout.group_id, **sent
            )
        except ContextLengthExceeded:
            version = self._pool.policy_version if version is None else version
            return PolicyOutput(
                reply=Reply(text="", finish_reason="context_length"), sampling=sampling, policy_version=version
            )
        return PolicyOutput(
            reply=Reply(
                text=completion.text,
                finish_reason=completion.finish_reason,
                completion_tokens=completion.completion_tokens,
                prompt_tokens=completion.prompt_tokens,
                max_model_len=completion.max_model_len,
            ),
            prompt_token_ids=completion.prompt_token_ids,
            token_ids=completion.token_ids,
            logprobs=completion.logprobs,
            replica=completion.replica,
            sampling=sampling,
            policy_version=completion.policy_version if version is None else version,
        )


class _ScriptedPolicy:
    """A policy that needs no model: no admission to hold, and replies written from the task."""

    def __init__(self, command_duration: float = 60.0) -> None:
        self._duration = command_duration

    @contextlib.asynccontextmanager
    async def session(self, rollout: Rollout) -> AsyncIterator[None]:
        yield


class OraclePolicy(_ScriptedPolicy):
    """Types each task's reference solution into the terminal, then confirms completion.

    It checks the whole pipeline (prompt, parser, tmux, grading) without a model: every task
    should earn reward 1.
    """

    async def act(self, rollout: Rollout, messages: list[dict[str, str]]) -> PolicyOutput:
        return PolicyOutput(reply=Reply(text=oracle_reply(rollout.task, _turn(messages), self._duration)))


class NopPolicy(_ScriptedPolicy):
    """Declares the task done at once, without a command: the episode a validity check expects to earn 0."""

    async def act(self, rollout: Rollout, messages: list[dict[str, str]]) -> PolicyOutput:
        return PolicyOutput(reply=Reply(text=nop_reply(self._duration)))


class FlakyOraclePolicy(_ScriptedPolicy):
    """A scripted policy that solves some tasks sometimes, so eval statistics have something to show.

    Each task gets a success rate drawn from ``seed`` and its name; each rollout, a draw from
    ``seed`` and its rollout id decides whether it applies the solution or declares the task done
    without doing anything (which the validity check guarantees earns 0). One rollout in three
    opens with a reply in no format at all, as a careless model would, to exercise lenient
    format-error handling. Every draw is a hash, so a rerun or a resumed run gives the same results.
    """

    def __init__(self, seed: int, command_duration: float = 60.0) -> None:
        super().__init__(command_duration)
        self._seed = seed

    async def act(self, rollout: Rollout, messages: list[dict[str, str]]) -> PolicyOutput:
        turn = _turn(messages)
        if draw(self._seed, "careless", rollout.rollout_id) < 1 / 3:
            if turn == 0:
                return PolicyOutput(reply=Reply(text="Let me look at the task first."))
            turn -= 1
        if draw(self._seed, "solve", rollout.rollout_id) < draw(self._seed, "rate", rollout.task.name):
            return PolicyOutput(reply=Reply(text=oracle_reply(rollout.task, turn, self._duration)))
        return PolicyOutput(reply=Reply(text=nop_reply(self._duration, plan="Give up.")))


def request_seed(base: int, rollout_id: str, turn: int) -> int:
    """The seed of one request: fixed by the base seed, the rollout and the turn, distinct across them (vLLM takes
    seeds below 2**63; 31 bits keep every engine's generator content)."""
    digest = hashlib.sha256(f"{base}:{rollout_id}:{turn}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def draw(*key: object) -> float:
    """A number in [0, 1) fixed by ``key``: the same on every run and every machine."""
    digest = hashlib.sha256(":".join(map(str, key)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class OracleReplies:
    """The oracle as a simulated server's reply source: it recognises the task by its instruction."""

    def __init__(self, tasks: Sequence[Task], command_duration: float = 60.0) -> None:
        self._tasks = sorted(tasks, key=lambda t: len(t.instruction), reverse=True)  # most specific first
        self._duration = command_duration

    def __call__(self, messages: list[dict[str, str]]) -> str:
        first = next((str(m.get("content", "")) for m in messages if m.get("role") == "user"), "")
        for task in self._tasks:
            if task.instruction.strip() in first:
                return oracle_reply(task, _turn(messages), self._duration)
        raise LookupError("oracle replies: no known task instruction appears in the first user message")


def oracle_reply(task: Task, turn: int, duration: float = 60.0) -> str:
    """Turn 0 unpacks and runs the solution; later turns wait for it and confirm completion."""
    if turn == 0:
        return xml_reply(solution_keystrokes(task), duration, complete=False, plan="Apply the reference solution.")
    return xml_reply("", duration, complete=True, plan="Wait for the solution, then confirm.")


def nop_reply(duration: float = 60.0, plan: str = "Declare the task done without doing anything.") -> str:
    """No command, and the task declared done (each turn, so a confirmation is answered the same way)."""
    return xml_reply("", duration, complete=True, plan=plan)


def _turn(messages: list[dict[str, str]]) -> int:
    return sum(1 for m in messages if m.get("role") == "assistant")


def solution_keystrokes(task: Task) -> str:
    """The solution folder travels as one base64 line: a heredoc typed into an interactive shell
    would trigger tab completion on the tabs of a Makefile. It goes to /solution, where Harbor puts it,
    or to a fresh temporary folder when the agent's user cannot write there (``[agent] user``)."""
    if task.solution_path is None or not task.solution_path.exists():
        return "echo 'this task ships no solution'\n"
    whole_folder = task.source_format == "harbor"  # Harbor copies solution/ whole; TB1 has one script
    payload = base64.b64encode(_tar_gz(task.solution_path.parent if whole_folder else task.solution_path)).decode()
    script = task.solution_path.name
    return (
        "S=/solution; { mkdir -p $S && test -w $S; } 2>/dev/null || S=$(mktemp -d);"
        f" echo {payload} | base64 -d | tar -xz -C $S && {_env_prefix(task.solution_env)}bash $S/{script}\n"
    )


def _env_prefix(variables: Mapping[str, str]) -> str:
    """``env NAME=value ...`` for the task's ``[solution.env]``, which solve.sh gets as Harbor's oracle gives it.
    A value that is not one printable line is quoted as bash's ``$'...'``: typed raw, a newline ends the command."""
    if not variables:
        return ""
    words = []
    for name, value in variables.items():
        if value.isprintable():
            words.append(shlex.quote(f"{name}={value}"))
        else:
            words.append(shlex.quote(f"{name}=") + "$'" + "".join(map(_ansi_c, value)) + "'")
    return "env " + " ".join(words) + " "


def _ansi_c(char: str) -> str:
    if char in "\\'":
        return "\\" + char
    if char.isprintable():
        return char
    return "".join(f"\\x{byte:02x}" for byte in char.encode())  # bytes, whatever the shell's locale


def _tar_gz(path: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        if path.is_dir():
            for child in sorted(path.iterdir()):
                archive.add(child, arcname=child.name)
        else:
            archive.add(path, arcname=path.name)
    return buffer.getvalue()


def xml_reply(keystrokes: str, duration: float, *, complete: bool, plan: str, analysis: str = "Oracle run.") -> str:
    """A well-formed Terminus 2 reply with one command (empty keystrokes still wait, until the shell is idle)."""
    commands = f'<keystrokes duration="{duration}">{keystrokes}</keystrokes>'
    done = "<task_complete>true</task_complete>" if complete else ""
    return (
        f"<response>\n<analysis>{analysis}</analysis>\n"
        f"<plan>{plan}</plan>\n<commands>{commands}</commands>\n{done}\n</response>"
    )
