"""The fresh-machine check (scripts/check-fresh-machine.sh, which CI runs) requires every program the set-up runs:
a program added to the base image's build must be added to the check, and so to a script that installs it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHECK = REPO / "scripts" / "check-fresh-machine.sh"
SETUP_CODE = REPO / "terminus_env" / "sandbox" / "images.py"  # what `terminus-env images base` runs
_RUNNERS = {"run", "Popen", "call", "check_call", "check_output"}


def programs_run_by(source: str) -> set[str]:
    """The programs a module starts: the first word of each subprocess call's argument list (written there, or in
    a list assigned to a name in the same function), and each ``shutil.which`` lookup."""
    found: set[str] = set()
    for function in [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.FunctionDef)]:
        lists = {
            target.id: node.value
            for node in ast.walk(function)
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.List)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for call in [node for node in ast.walk(function) if isinstance(node, ast.Call) and node.args]:
            name = call.func.attr if isinstance(call.func, ast.Attribute) else None
            owner = call.func.value.id if name and isinstance(call.func.value, ast.Name) else None  # type: ignore[union-attr]
            argument = call.args[0]
            if owner == "shutil" and name == "which" and isinstance(argument, ast.Constant):
                found.add(argument.value)
            elif owner == "subprocess" and name in _RUNNERS:
                words = lists.get(argument.id) if isinstance(argument, ast.Name) else argument
                if isinstance(words, ast.List) and words.elts and isinstance(words.elts[0], ast.Constant):
                    found.add(words.elts[0].value)
    return found


def checked_programs() -> set[str]:
    match = re.search(r"^tools=\(([^)]*)\)", CHECK.read_text(), re.MULTILINE)
    assert match, f"{CHECK} has no tools=(...) list"
    return set(match.group(1).split())


def test_every_program_the_base_image_build_runs_is_checked_on_a_fresh_machine() -> None:
    run = programs_run_by(SETUP_CODE.read_text())
    assert {"debootstrap", "tar", "umount"} <= run  # the finder sees what is there
    assert run <= checked_programs(), f"add {sorted(run - checked_programs())} to tools=(...) in {CHECK.name}"


def test_the_finder_sees_lists_written_in_the_call_or_named_before_it() -> None:
    source = (
        "import shutil, subprocess\n"
        "def build():\n"
        "    command = ['skopeo', 'copy']\n"
        "    subprocess.run(command, check=True)\n"
        "    subprocess.check_output(['mksquashfs', 'a'])\n"
        "    if shutil.which('zstd') is None: pass\n"
        "    print(['not-run'])\n"
    )
    assert programs_run_by(source) == {"skopeo", "mksquashfs", "zstd"}


def test_ci_runs_the_fresh_machine_check() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    stages = re.findall(r"^stage (.+)$", ci, re.MULTILINE)  # each stage a command, timed
    assert "make fresh-check" in stages and "make test" in stages
    assert "scripts/check-fresh-machine.sh" in (REPO / "Makefile").read_text()
