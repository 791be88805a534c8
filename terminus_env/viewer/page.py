"""One trial as a static, self-contained HTML page: how it ended and what was flagged, then turn by turn what the
model thought (analysis and plan), what it typed, and what the terminal showed after; last, the verifier's output.

No script, no external file: the page opens from disk, in any browser, offline, and can be attached to an
issue as it is. Every text from the run is escaped. Pure: a :class:`Trial` in, the page's text out.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from typing import Any

from terminus_env.protocol import parse_reply
from terminus_env.records.atif import COMPLETE_TOOL, keystroke_calls
from terminus_env.records.timeline import epoch
from terminus_env.viewer.source import Trial

_STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 72rem; padding: 1.5rem; color: #1d1d1f;
       background: #fafafa; }
h1 { font-size: 1.5rem; margin: 0 0 .75rem; } h1 .trial { color: #666; font-weight: normal; }
h2 { font-size: 1.15rem; margin: 0 0 .5rem; } h3 { font-size: .8rem; text-transform: uppercase; letter-spacing: .05em;
     color: #555; margin: .9rem 0 .3rem; }
.outcome { display: flex; flex-wrap: wrap; gap: .5rem 1.5rem; margin: 0 0 1rem; padding: 0; list-style: none; }
.outcome .label { color: #666; margin-right: .35rem; }
.reward { font-weight: bold; padding: .05rem .6rem; border-radius: .3rem; color: #fff; font-size: 1.05rem; }
.reward.solved { background: #1a7f37; } .reward.unsolved { background: #cf222e; } .reward.none { background: #777; }
section.turn { background: #fff; border: 1px solid #ddd; border-radius: .5rem; padding: 1rem 1.25rem;
               margin: 1rem 0; }
.when { color: #666; font-weight: normal; font-size: .9rem; margin-left: .5rem; }
.tokens { color: #666; font-size: .85rem; }
pre { white-space: pre-wrap; word-break: break-word; margin: 0; font: 13px/1.35 ui-monospace, monospace; }
pre.terminal { background: #111; color: #e6e6e6; padding: .75rem; border-radius: .4rem; max-height: 40rem;
               overflow: auto; }
ol.keys { margin: 0; padding-left: 1.5rem; } ol.keys li { margin: .25rem 0; }
ol.keys pre { background: #f0f3f6; padding: .3rem .5rem; border-radius: .3rem; display: inline-block; }
.wait { color: #666; font-size: .85rem; margin-left: .5rem; }
.format-error, .problem { background: #ffebe9; border: 1px solid #ff8182; border-radius: .4rem;
                          padding: .5rem .75rem; margin: .5rem 0; }
.warnings { background: #fff8c5; border: 1px solid #d4a72c; border-radius: .4rem; padding: .5rem .75rem .5rem 2rem; }
.complete { color: #1a7f37; font-weight: bold; }
details { margin: .5rem 0; } summary { cursor: pointer; color: #0969da; }
footer { color: #555; margin-top: 1.5rem; }
.back { margin: 0 0 .5rem; } .tampered { background: #1f2328; color: #fff; border-radius: .4rem; padding: .5rem .75rem;
                                            margin: .5rem 0; } .tampered code { color: #ffd8b5; }
"""


def render(trial: Trial, *, job_page: str | None = None) -> str:
    """The page of one trial; ``job_page`` links back to its job's page (a path relative to this one)."""
    trajectory = trial.trajectory or {}
    result = trial.result or {}
    steps: Sequence[Mapping[str, Any]] = trajectory.get("steps") or []
    start = _start(steps)
    task = result.get("task_name") or (trajectory.get("extra") or {}).get("task") or trial.name
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(task)} · {_e(trial.name)}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f'<p class="back"><a href="{_e(job_page)}">← the job</a></p>' if job_page else "",
        f'<h1>{_e(task)} <span class="trial">{_e(trial.name)}</span></h1>',
        _outcome(trial, trajectory, result, steps),
        _tampering(result),
    ]
    if not steps:
        parts.append('<p class="problem">This trial has no trajectory: it never reached its first observation, or its '
                     "agent writes none (Harbor's oracle does not).</p>")  # fmt: skip
    last_turn = max((i for i, step in enumerate(steps) if step.get("source") == "agent"), default=None)
    for index, step in enumerate(steps):
        if step.get("source") == "agent":
            parts.append(_turn(step, start, last=index == last_turn))
        elif step.get("step_id") == 1:
            parts.append("<details><summary>The first observation: the instructions, the task and the screen"
                         f"</summary><pre>{_e(_text(step.get('message')))}</pre></details>")  # fmt: skip
        elif _is_summarization(step):
            parts.append(_summarization(step))
        else:
            parts.append(f"<section class=\"turn\"><h2>{_e(step.get('source', ''))} message</h2>"
                         f"<pre>{_e(_text(step.get('message')))}</pre></section>")  # fmt: skip
    parts.append(_verifier(trial.verifier, _reward(result)))
    parts.append(f"<footer><p>{_e(_ending(trial, trajectory, result))}</p></footer>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _outcome(
    trial: Trial, trajectory: Mapping[str, Any], result: Mapping[str, Any], steps: Sequence[Mapping[str, Any]]
) -> str:
    """The header: reward, end reason, turns, format errors, the agent, tokens and time, and what went wrong."""
    summary = (result.get("agent_result") or {}).get("metadata") or {}
    reward = _reward(result)
    if reward is None:
        badge = '<span class="reward none">no reward</span>'
    else:
        badge = f'<span class="reward {"solved" if reward >= 1 else "unsolved"}">{reward:g}</span>'
    agent = trajectory.get("agent") or (result.get("agent_info") or {})
    model = agent.get("model_name") or ((agent.get("model_info") or {}).get("name"))
    turns = sum(1 for step in steps if step.get("source") == "agent")
    metrics = trajectory.get("final_metrics") or {}
    items = [
        ("reward", badge),
        ("end reason", _e(_end_reason(trial, trajectory, result))),
        ("turns", str(turns)),
        ("format errors", _e(summary.get("format_errors", "-"))),
        ("agent", _e(f"{agent.get('name', '-')} {agent.get('version', '')}".strip())
         + (f" · model {_e(model)}" if model else "")),
        ("tokens", _e(f"{metrics['total_prompt_tokens']} in · {metrics.get('total_completion_tokens', '-')} out"
                      if "total_prompt_tokens" in metrics else "not reported")),
        ("time", _e(_duration(result))),
    ]  # fmt: skip
    rows = [f'<li><span class="label">{name}</span> {value}</li>' for name, value in items]
    lines = ['<ul class="outcome">', *rows, "</ul>"]
    why = summary.get("detail") or summary.get("failure") or summary.get("error")
    exception = result.get("exception_info")
    if exception:
        why = f"{exception.get('exception_type')}: {exception.get('exception_message')}"
    if why:
        lines.append(f'<div class="problem"><strong>Why it earned less than 1:</strong> <pre>{_e(why)}</pre></div>')
    return "\n".join(lines)


def _ending(trial: Trial, trajectory: Mapping[str, Any], result: Mapping[str, Any]) -> str:
    reward = _reward(result)
    return f"Ended: {_end_reason(trial, trajectory, result)}; reward {'none' if reward is None else f'{reward:g}'}."


def _end_reason(trial: Trial, trajectory: Mapping[str, Any], result: Mapping[str, Any]) -> str:
    """Ours, from the episode summary the trial's result keeps (Harbor's own trials have none)."""
    summary = (result.get("agent_result") or {}).get("metadata") or {}
    found = summary.get("end_reason") or (trajectory.get("extra") or {}).get("end_reason") or trial.end_reason
    return str(found or "unknown")


def _tampering(result: Mapping[str, Any]) -> str:
    """What the verifier ran that the agent had changed: the findings the sandbox's tamper check reported."""
    summary = (result.get("agent_result") or {}).get("metadata") or {}
    findings = [f for f in summary.get("tampering") or () if isinstance(f, Mapping)]
    if not findings:
        return ""
    rows = "".join(f"<li><strong>{_e(f.get('kind', '-'))}</strong> <code>{_e(f.get('path', ''))}</code>"
                   + (f": {_e(f['detail'])}" if f.get("detail") else "")
                   + ("" if f.get("certain", True) else " (uncertain)") + "</li>" for f in findings)  # fmt: skip
    return ('<div class="tampered"><strong>Flagged for tampering:</strong> the verifier ran what the agent changed '
            f"in its runtime.<ul>{rows}</ul></div>")  # fmt: skip


def _reward(result: Mapping[str, Any]) -> float | None:
    """Harbor's reward of the trial (the ``reward`` key, else its only one); None when no verifier result counts."""
    rewards = (result.get("verifier_result") or {}).get("rewards") or {}
    return rewards.get("reward", next(iter(rewards.values()), None)) if rewards else None


def _turn(step: Mapping[str, Any], start: float | None, *, last: bool) -> str:
    number = int(step.get("step_id", 1)) - 1
    extra = step.get("extra") or {}
    when = _offset(step.get("timestamp"), start)
    metrics = step.get("metrics") or {}
    tokens = ""
    if metrics.get("prompt_tokens") is not None or metrics.get("completion_tokens") is not None:
        tokens = (f'<span class="tokens">{_e(metrics.get("prompt_tokens", "-"))} tokens in · '
                  f'{_e(metrics.get("completion_tokens", "-"))} out</span>')  # fmt: skip
    parts = [f'<section class="turn" id="turn-{number}">',
             f'<h2>Turn {number}{f"<span class=when>{_e(when)}</span>" if when else ""}</h2>{tokens}']  # fmt: skip
    if extra.get("format_error"):
        parts.append(f'<div class="format-error"><strong>Format error</strong> (nothing ran): '
                     f'{_e(extra["format_error"])}</div>')  # fmt: skip
    if extra.get("warnings"):
        parts.append('<ul class="warnings">' + "".join(f"<li>{_e(w)}</li>" for w in extra["warnings"]) + "</ul>")
    message = _text(step.get("message"))
    parsed = parse_reply(message)
    if parsed.analysis is not None or parsed.plan is not None:
        parts.append(f'<h3>Analysis</h3><p class="analysis">{_e(parsed.analysis or "-")}</p>')
        parts.append(f'<h3>Plan</h3><p class="plan">{_e(parsed.plan or "-")}</p>')
        parts.append(f"<details><summary>The whole reply</summary><pre>{_e(message)}</pre></details>")
    else:
        parts.append(f"<h3>Reply</h3><pre>{_e(message) or '(empty)'}</pre>")
    calls = keystroke_calls(step)
    if calls:
        parts.append('<h3>Keystrokes</h3><ol class="keys">')
        for call in calls:
            arguments = call.get("arguments") or {}
            wait = f"waits up to {_number(arguments.get('duration'))} s"
            parts.append(f"<li><pre>{_e(_visible(arguments.get('keystrokes', '')))}</pre>"
                         f'<span class="wait">{_e(wait)}</span></li>')  # fmt: skip
        parts.append("</ol>")
    if any(call.get("function_name") == COMPLETE_TOOL for call in step.get("tool_calls") or []):
        parts.append('<p class="complete">Marked the task complete.</p>')
    observed = [_text(r.get("content")) for r in (step.get("observation") or {}).get("results") or []]
    if observed:
        heading = "The screen at the end" if last else "The screen after (what the model read next)"
        screen = _e("\n".join(observed))
        parts.append(f'<h3>{heading}</h3><pre class="terminal">{screen}</pre>')
    parts.append("</section>")
    return "\n".join(parts)


def _is_summarization(step: Mapping[str, Any]) -> bool:
    return ((step.get("extra") or {}).get("context_management") or {}).get("type") == "compaction"


def _summarization(step: Mapping[str, Any]) -> str:
    """A context summarization: why, how it went, and the requests' own trajectories (files beside this one)."""
    extra = step.get("extra") or {}
    free = extra.get("free_tokens")
    why = f"{extra.get('trigger', '-')}" + (f", {free} tokens free" if free is not None else "")
    refs = [ref for result in (step.get("observation") or {}).get("results") or []
            for ref in result.get("subagent_trajectory_ref") or []]  # fmt: skip
    items = "".join(f"<li>{_e(ref.get('trajectory_path', '-'))}</li>" for ref in refs)
    return (f'<section class="turn summarization"><h2>Context summarized</h2><p>{_e(_text(step.get("message")))} '
            f"({_e(why)}; {_e(extra.get('outcome', '-'))})</p>"
            + (f"<h3>The requests' trajectories</h3><ul>{items}</ul>" if items else "") + "</section>")  # fmt: skip


def _verifier(files: Mapping[str, str], reward: float | None) -> str:
    """The verifier's reward file and output, open when the trial earned less than 1: what a person reads first when
    it fails."""
    output = files.get("test-stdout.txt")
    others = [name for name in ("reward.txt", "reward.json") if name in files]
    if output is None and not others:
        return ""
    rows = "".join(f"<li>{_e(name)}: <code>{_e(files[name].strip()[:200])}</code></li>" for name in others)
    state = "" if reward is not None and reward >= 1 else " open"
    shown = "" if output is None else (f'<details{state}><summary>Its output (test-stdout.txt)</summary>'
                                       f'<pre class="terminal">{_e(output)}</pre></details>')  # fmt: skip
    return '<section class="turn verifier"><h2>The verifier</h2>' + (f"<ul>{rows}</ul>" if rows else "") + shown + \
        "</section>"


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) else "-"


def _visible(keystrokes: str) -> str:
    """Keystrokes with their Enter shown, so a command that was not run (no newline) can be told apart."""
    return keystrokes.replace("\n", "⏎\n") if keystrokes else "(no keys: only a wait)"


def _text(content: Any) -> str:
    """An ATIF message or observation: a string, or content parts (their text parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return "" if content is None else json.dumps(content)


def _start(steps: Sequence[Mapping[str, Any]]) -> float | None:
    stamp = steps[0].get("timestamp") if steps else None
    return epoch(stamp) if stamp else None


def _offset(stamp: str | None, start: float | None) -> str | None:
    if stamp is None or start is None:
        return None
    return f"+{epoch(stamp) - start:.1f} s"


def _duration(result: Mapping[str, Any]) -> str:
    started, finished = result.get("started_at"), result.get("finished_at")
    if not started or not finished:
        return "-"
    return f"{epoch(finished) - epoch(started):.1f} s"


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)
