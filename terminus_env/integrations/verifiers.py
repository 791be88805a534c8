"""verifiers (v1, the API prime-rl uses): ``TerminusTaskset`` and ``TerminusVfEnv``, a ``vf.Env`` playing our episodes.

verifiers drives the model (its harness talks to the policy through its interception server, which
records the tokens for training); this env owns the terminal: each episode is a ``TerminusEnv``
episode in our hardened sandbox, with strict or lenient format semantics, and every turn of the
agent's interaction is one env step, handed to the env with what the engine said about it (its
``finish_reason`` and token counts, from verifiers' record of the model call), so that a reply cut at
``max_tokens`` ends a strict episode ``turn_truncated`` as it does everywhere else. The reward is the
task's verifier's, recorded on the trace with the episode's metrics (format errors, opening streak,
turns, truncated turns, rescued). An env error fails the
episode (an exception in ``run()`` is verifiers' retryable ``EnvError``).

verifiers resolves tasksets and envs by id, importing a top-level module; ours is
``terminus_env_verifiers`` (taskset id ``terminus-env-verifiers``), which re-exports the classes here.

    pip install 'terminus-env[verifiers]'
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import verifiers.v1 as vf

from terminus_env.audit import screen_tasks
from terminus_env.env import Reply, TerminusEnv
from terminus_env.tasks import find_task, load_tasks
from terminus_env.tasks.loader import shipped_tasks_dir


class TerminusTasksetConfig(vf.TasksetConfig):
    """Which tasks: a folder of Harbor / Terminal-Bench tasks (default: the shipped suite), optionally some by name."""

    tasks_dir: str | None = None
    names: list[str] | None = None
    audit_report: str | None = None
    """A report of ``terminus-env tasks audit``: the tasks it found hackable are left out, or kept (``hackable``)."""
    hackable: str = "skip"


class TerminusTaskset(vf.Taskset[vf.Task, TerminusTasksetConfig]):
    """One verifiers task per terminal task; the episode's first prompt comes from the env, not the row."""

    def load(self) -> Iterable[vf.Task]:
        folder = Path(self.config.tasks_dir) if self.config.tasks_dir else shipped_tasks_dir()
        tasks = load_tasks(folder, self.config.names)
        for task in screen_tasks(tasks, self.config.audit_report, self.config.hackable):
            yield vf.Task(vf.TaskData(id=task.name, name=task.name, prompt=None, description=task.instruction))


class TerminusVfEnvConfig(vf.EnvConfig):
    """The env's settings: the semantics (``mode``: train is strict) and its limits."""

    agent: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"}, runtime={"type": "subprocess"})
    mode: str = "train"
    max_turns: int | None = 30
    max_turn_tokens: int = 16384
    tasks_dir: str | None = None


class TerminusVfEnv(vf.Env[TerminusVfEnvConfig]):
    """Plays a terminal task: the env's observation is the user turn, the agent's reply is the env's action."""

    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        folder = [Path(self.config.tasks_dir)] if self.config.tasks_dir else None
        env = TerminusEnv(
            find_task(str(task.data.name), folder),
            mode=self.config.mode,  # type: ignore[arg-type]
            max_turns=self.config.max_turns,
            max_turn_tokens=self.config.max_turn_tokens,
        )
        try:
            obs, _ = await env.areset()
            async with agents.agent.interaction(task) as interaction:
                while True:
                    segment = await interaction.turn(obs)
                    if segment.terminated:  # verifiers' own limit ended the exchange first
                        break
                    reply = engine_reply(segment, interaction.trace)
                    obs, _, terminated, truncated, info = await env.astep(reply)
                    if terminated or truncated:
                        break
                trace = interaction.trace
            summary = env.episode_summary
            if summary is None:
                trace.record_reward("terminus", 0.0)
                trace.record_metric("terminus/ended_by_verifiers", 1.0)
                return
            if summary.masked:  # the infrastructure failed: the reward says nothing of the model
                why = summary.error or f"{summary.end_reason}: {summary.tampering}"
                raise vf.EnvError(f"the episode is not to be learnt from ({summary.end_reason}): {why}")
            trace.record_reward("terminus", summary.reward)
            trace.record_metrics(
                {
                    "terminus/turns": summary.turns,
                    "terminus/format_errors": summary.format_errors,
                    "terminus/opening_streak": summary.format_error_opening_streak,
                    "terminus/rescued": float(summary.rescued),
                    "terminus/graded": float(summary.graded),
                    "terminus/truncated_turns": summary.truncated_turns,
                }
            )
        finally:
            await env.aclose()


def engine_reply(segment: vf.Segment, trace: vf.Trace) -> Reply:
    """The segment's last reply as the engine returned it: its text, ``finish_reason`` and token counts.

    verifiers records each model call (``trace.calls``) with the provider's finish reason and usage;
    the last call that succeeded produced this reply. ``Segment.last_reply`` alone is stripped text.
    """
    text = next((m.content or "" for m in reversed(segment.messages) if isinstance(m, vf.AssistantMessage)), "")
    call = next((c for c in reversed(trace.calls) if c.error is None), None)
    if call is None:
        return Reply(text=text)
    usage = call.usage
    return Reply(
        text=text,
        finish_reason=call.finish_reason or "stop",
        completion_tokens=usage.completion_tokens if usage is not None else None,
        prompt_tokens=usage.input_tokens if usage is not None else None,
    )
