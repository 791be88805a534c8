"""What the model reads each turn, in Terminus 2's format and with Terminus 2's information.

The wording is ours; the facts it states (reply format, durations, key names, completion
confirmation, the output cap) match Terminus 2, so a model trained on these prompts meets no
surprise under Terminal-Bench.
"""

from __future__ import annotations

from collections.abc import Sequence

from terminus_env.protocol.parser import MAX_COMMAND_DURATION, ParsedReply
from terminus_env.utils.output_cap import OUTPUT_LIMIT_BYTES as OUTPUT_LIMIT_BYTES  # re-exported
from terminus_env.utils.output_cap import cap_text

_FORMAT_RULES = f"""\
You are working in a Linux terminal to complete the task below. Each turn you see what the \
terminal printed, and you answer with keystrokes to send to it.

Answer with exactly one XML block and nothing outside it:

<response>
<analysis>
What the terminal shows, what is already done, and what remains.
</analysis>
<plan>
The next steps: which commands you will run and what you expect from each.
</plan>
<commands>
<keystrokes duration="0.1">cd /app && ls -la
</keystrokes>
<keystrokes duration="5.0">make test
</keystrokes>
</commands>
<task_complete>false</task_complete>
</response>

Sections:
- <analysis>, <plan> and <commands> are required, in that order.
- <task_complete> is optional. Write <task_complete>true</task_complete> only when the task is \
done; false, an empty tag or leaving it out all mean not done.

Keystrokes:
- The text of each <keystrokes> element is typed into the terminal exactly as written. Do not \
escape it: write <, >, & and quotes as they are (&amp; would be typed as the five characters \
&amp;). Add no spaces or blank lines you do not mean to type.
- End a command with a newline to press Enter; without it, the next keystrokes continue the \
same line.
- To send a special key, make it the whole content of a <keystrokes> element, in tmux \
notation: <keystrokes>C-c</keystrokes> for Ctrl+C, <keystrokes>C-d</keystrokes> for Ctrl+D.
- duration is how many seconds to wait after sending the keys before the next keystrokes or \
before you see the output (default 1.0). Use about 0.1 for instant commands (cd, ls, cat, \
echo), 1 for quick ones (grep, gcc on one file) and more for slow ones (make, pip install, \
long scripts). Waits stop at {MAX_COMMAND_DURATION:g} seconds: prefer short waits and check \
again, e.g. with <keystrokes duration="10"></keystrokes>, which sends nothing and just waits.

Finishing: after you mark the task complete you will be asked to confirm, because the solution \
is then graded and cannot be changed. Confirm by answering <task_complete>true</task_complete> \
again."""


def initial_prompt(instruction: str, screen: str) -> str:
    """The first observation: how to reply, the task, and the terminal as it is now."""
    return f"{_FORMAT_RULES}\n\nTask:\n{instruction}\n\nCurrent terminal screen:\n{screen}"


def rejected_feedback(reply: ParsedReply) -> str:
    """After a rejected turn (lenient mode): what was wrong; nothing was executed."""
    parts = [
        "Your previous response had parsing errors, so none of its commands ran.",
        f"ERROR: {reply.error}",
    ]
    if reply.warnings:
        parts.append(_warning_list(reply.warnings))
    parts.append("Please answer again with one well-formed <response> block as described at the start.")
    return "\n\n".join(parts)


def output_feedback(output: str, warnings: Sequence[str], *, is_screen: bool = False) -> str:
    """A normal observation: any parser warnings, then the terminal output (capped: see cap_output)."""
    parts = [_warning_list(warnings)] if warnings else []
    parts.append(_terminal(output, is_screen))
    return "\n\n".join(parts)


def confirm_completion_prompt(output: str, *, is_screen: bool = False) -> str:
    """Asked after the first task_complete=true: grading is final, so the model confirms."""
    return (
        f"{_terminal(output, is_screen)}\n\n"
        "You marked the task as complete. Are you sure? Your solution will now be graded and you "
        "will not be able to change anything afterwards. If it is finished, answer with "
        "<task_complete>true</task_complete> again; otherwise keep working."
    )


def truncated_feedback(max_tokens: int) -> str:
    """After a reply cut off by the per-turn token limit that could not be salvaged."""
    return (
        f"Your previous response went over the limit of {max_tokens} tokens and was cut off, so "
        "none of its actions ran. Answer again with a shorter <response>: keep the analysis and "
        "plan brief, and split long file contents over several turns."
    )


# --- context summarization (lenient evaluation): three requests, as Terminus 2 makes them --------------------------


def summary_request(instruction: str) -> str:
    """Asked at the end of the conversation so far: a summary for whoever carries on."""
    return (
        "Another agent will take over this task from you now and will not see this conversation. Write a thorough "
        f"account of your work so far.\n\nThe task:\n{instruction}\n\nCover:\n"
        "1. The commands you ran that mattered, and what each one showed.\n"
        "2. What you found out: files and their locations, settings, error messages, the state of the system.\n"
        "3. The problems you met and how you got past them.\n"
        "4. Where the task stands now: what is done and what is left.\n\n"
        "Leave nothing out that the next agent needs in order to carry on."
    )


def questions_request(instruction: str, summary: str, screen: str) -> str:
    """Asked of a fresh context: the questions the summary leaves open."""
    return (
        f"You are taking over a task that another agent started.\n\nThe task:\n{instruction}\n\n"
        f"The other agent's summary of its work:\n{summary}\n\nThe terminal's screen now:\n{screen}\n\n"
        "Before you start, ask the questions about the state of the work that the summary does not answer: at "
        "least five, more if you need them. You will not be able to ask anything afterwards."
    )


def answers_request(questions: str) -> str:
    """Asked at the end of the conversation and its summary: answer the next agent's questions."""
    return f"The agent taking over has these questions. Answer each of them, one by one and in detail:\n\n{questions}"


def handoff(answers: str) -> str:
    """The message the model answers next, after the summarized conversation: the answers, and carry on."""
    return (
        f"The previous agent answered your questions:\n\n{answers}\n\nCarry on with the task from where it left "
        "off. You cannot ask anything more; answer in the format described at the start to use the terminal."
    )


def short_summary_request(instruction: str, screen_tail: str) -> str:
    """The fallback when the three requests could not be made: a few sentences from the task and the screen."""
    return (
        f"In two or three sentences, say how to carry on with this task.\n\nThe task:\n{instruction}\n\n"
        f"The end of the terminal's screen:\n{screen_tail}"
    )


def short_summary_handoff(instruction: str, summary: str) -> str:
    return f"{instruction}\n\nA summary of the work so far: {summary}"


def screen_handoff(instruction: str, screen_tail: str) -> str:
    """The last fallback, with no model: the task again and the end of the screen."""
    return f"{instruction}\n\nThe end of the terminal's screen now:\n{screen_tail}"


def cap_output(text: str, limit: int = OUTPUT_LIMIT_BYTES) -> str:
    """Keep the first and last limit/2 bytes (UTF-8) of a long output, with a marker saying how much was cut.

    Both ends matter: the start shows what ran, the end shows how it finished. The sandbox's
    terminal caps its captures with the same function, so output from it is already capped.
    """
    return cap_text(text, limit)[0]


def _warning_list(warnings: Sequence[str]) -> str:
    return "WARNINGS about your previous response:\n" + "\n".join(f"- {warning}" for warning in warnings)


def _terminal(output: str, is_screen: bool) -> str:
    if is_screen:
        return f"Current terminal screen (no new output could be isolated):\n{output}"
    return f"New terminal output:\n{output}"
