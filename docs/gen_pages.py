"""Build-time pages of the documentation site, run by the mkdocs-gen-files plugin (see mkdocs.yml).

Generated rather than listed by hand, so the site follows the code: every module of the package gets an
API reference page, every design note in docs/notes/ is in the navigation, CHANGELOG.md is a page, and the
configuration page lists terminus_env.config.VARIABLES, every environment variable the package reads.
"""

from __future__ import annotations

from pathlib import Path

import mkdocs_gen_files

from terminus_env.config import VARIABLES

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "terminus_env"
NOTES = ROOT / "docs" / "notes"
SECURITY_NOTE = "notes/security.md"  # a design note that is also a guide page
GUIDE = (
    ("Home", "index.md"),
    ("Getting started", "getting-started.md"),
    ("The environment's contract", "environment.md"),
    ("Strict and lenient", "strictness.md"),
    ("Tasks", "tasks.md"),
    ("Evaluation", "evaluation.md"),
    ("RL integrations", "integrations.md"),
    ("Serving and routing", "serving.md"),
    ("The sandbox", "sandbox.md"),
    ("The sandbox's security model", SECURITY_NOTE),
    ("Benchmarks", "benchmarks.md"),
    ("Configuration", "configuration.md"),
    ("Working on terminus-env", "development.md"),
)


def modules() -> list[tuple[tuple[str, ...], bool]]:
    """(dotted name parts, is a package) for every public module of the package, parents before children."""
    found = []
    for source in (ROOT / PACKAGE).rglob("*.py"):
        parts = source.relative_to(ROOT).with_suffix("").parts
        package = parts[-1] == "__init__"
        if package:
            parts = parts[:-1]
        if any(part.startswith("_") for part in parts):  # private modules and __main__
            continue
        found.append((parts, package))
    return sorted(found)


def reference_page(parts: tuple[str, ...], package: bool) -> str:
    """Write the module's API page; a package's page holds its docstring, its modules have their own pages."""
    path = Path("reference", *parts, "index.md") if package else Path("reference", *parts[:-1], f"{parts[-1]}.md")
    options = "\n    options:\n      members: false" if package else ""
    with mkdocs_gen_files.open(path.as_posix(), "w") as page:
        page.write(f"::: {'.'.join(parts)}{options}\n")
    return path.as_posix()


def note_title(note: Path) -> str:
    first = note.read_text(encoding="utf-8").splitlines()[:1]
    return first[0].lstrip("#").strip() if first and first[0].startswith("# ") else note.stem


def navigation() -> list[str]:
    lines = [f"* [{title}]({page})" for title, page in GUIDE]
    lines.append("* Design notes")
    for note in sorted(NOTES.glob("*.md")):
        if f"notes/{note.name}" != SECURITY_NOTE:
            lines.append(f"    * [{note_title(note)}](notes/{note.name})")
    lines.append("* API reference")
    for parts, package in modules():
        indent = "    " * len(parts)
        lines.append(f"{indent}* [{parts[-1]}]({reference_page(parts, package)})")
    lines.append("* [Changelog](changelog.md)")
    return lines


def configuration_page() -> str:
    rows = [f"| `{v.name}` | {v.values} | {v.default} | {v.meaning} |" for v in VARIABLES]
    return "\n".join([
        "# Configuration",
        "",
        "Every environment variable terminus-env reads, made from `terminus_env.config.VARIABLES`; nothing else in "
        "the package reads the environment. An argument given in code wins over the variable (`TerminusEnv("
        "strict_format=...)`, `terminus-env eval --strict`). A value it cannot use is an error that names the "
        "variable. The tasks' own `${VAR}` templates (in `[environment.env]` and compose files) take the host's "
        "variables, as Harbor and Docker Compose do.",
        "",
        "| variable | values | default | what it does |",
        "| --- | --- | --- | --- |",
        *rows,
        "",
    ])


with mkdocs_gen_files.open("configuration.md", "w") as configuration:
    configuration.write(configuration_page())
with mkdocs_gen_files.open("changelog.md", "w") as changelog:
    changelog.write((ROOT / "CHANGELOG.md").read_text(encoding="utf-8"))
with mkdocs_gen_files.open("SUMMARY.md", "w") as summary:
    summary.write("\n".join(navigation()) + "\n")
