import subprocess
from pathlib import Path

REPO = "/app/shop"


def git(*args):
    return subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True, check=True).stdout.strip()


def test_main_checked_out():
    assert git("symbolic-ref", "--short", "HEAD") == "main"


def test_history_restored_in_order():
    assert git("log", "--format=%s", "main").splitlines() == ["Add payment module", "Add README", "Add cart"]


def test_payment_module_content():
    assert git("show", "main:payments.py").startswith("def charge(card, cents):")
    assert Path(REPO, "payments.py").read_text() == git("show", "main:payments.py") + "\n"


def test_working_tree_clean_and_notes_kept():
    assert git("status", "--porcelain", "--untracked-files=no") == ""
    assert Path(REPO, "NOTES.tmp").read_text() == "scratch notes\n"
