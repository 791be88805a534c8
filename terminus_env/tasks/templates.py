"""``${VAR}`` templates in task files, resolved from given variables (pure: the caller passes the environment).

Two dialects share one grammar:
- task.toml (Harbor): ``${VAR}``, ``${VAR:-default}`` and the other braced forms; a lone ``$`` stays as written,
  and a variable that is unset with no default is an error, since the task cannot mean an empty value.
- compose files: also ``$VAR`` and ``$$`` (a literal ``$``); an unset variable is empty, as Docker Compose does.

Braced forms: ``${VAR:-word}`` (``word`` if VAR is unset or empty), ``${VAR-word}`` (if unset), ``${VAR:?message}`` /
``${VAR?message}`` (an error if unset or empty / unset), ``${VAR:+word}`` / ``${VAR+word}`` (``word`` if set and
non-empty / set, else empty). ``word`` may itself hold templates.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPERATORS = (":-", ":?", ":+", "-", "?", "+")


class TemplateError(ValueError):
    """A template that cannot be resolved; the message says which variable and what to do."""


def substitute(text: str, variables: Mapping[str, str], *, compose: bool) -> str:
    """``text`` with every template replaced (``compose`` picks the compose dialect, see the module's docstring)."""
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        following = text[i + 1 : i + 2]
        if char != "$":
            out.append(char)
            i += 1
        elif compose and following == "$":
            out.append("$")
            i += 2
        elif following == "{":
            end = _closing_brace(text, i + 2)
            if end < 0:
                raise TemplateError(f"{text!r} has a '${{' with no closing '}}'")
            out.append(_expression(text[i + 2 : end], variables, compose))
            i = end + 1
        elif compose and (name := _NAME.match(text, i + 1)):
            out.append(variables.get(name.group(), ""))
            i = name.end()
        else:
            out.append(char)
            i += 1
    return "".join(out)


def _closing_brace(text: str, start: int) -> int:
    depth = 1
    i = start
    while i < len(text):
        if text.startswith("${", i):
            depth += 1
            i += 2
            continue
        if text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def _expression(body: str, variables: Mapping[str, str], compose: bool) -> str:
    name = _NAME.match(body)
    if name is None:
        raise TemplateError(f"'${{{body}}}' does not start with a variable name")
    rest = body[name.end() :]
    value = variables.get(name.group())
    if not rest:
        if value is None and not compose:
            raise TemplateError(
                f"${{{name.group()}}} is not set in the host's environment: export it before loading the task, or "
                f"give a default (${{{name.group()}:-default}})"
            )
        return value or ""
    operator = next((op for op in _OPERATORS if rest.startswith(op)), None)
    if operator is None:
        raise TemplateError(f"'${{{body}}}': expected one of {', '.join(_OPERATORS)} after {name.group()}")

    def word() -> str:  # resolved only when used, so an unused ${X:?...} in it raises nothing
        return substitute(rest[len(operator) :], variables, compose=compose)

    empty_counts = operator.startswith(":")
    missing = value is None or (empty_counts and value == "")
    if operator.endswith("-"):
        return word() if missing else value or ""
    if operator.endswith("?"):
        if missing:
            raise TemplateError(f"${{{name.group()}}} is required: {word() or 'set it in the environment'}")
        return value or ""
    return "" if missing else word()
