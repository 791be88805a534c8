import subprocess

REPO = "/app/service"
RESOLVED = "[server]\nport = 8000\nworkers = 8\n\n[cache]\nenabled = true\nbackend = redis\nttl_seconds = 300\n"


def git(*args):
    return subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True, check=True).stdout


def test_main_checked_out_and_clean():
    assert git("symbolic-ref", "--short", "HEAD").strip() == "main"
    assert git("status", "--porcelain", "--untracked-files=no") == ""


def test_merge_commit_with_both_parents():
    parents = git("rev-list", "--parents", "-n", "1", "main").split()[1:]
    assert len(parents) == 2
    assert git("rev-parse", "feature/cache").strip() in parents
    first_parent_subject = git("log", "-1", "--format=%s", parents[0]).strip()
    assert first_parent_subject == "More workers; name the cache backend; 1.1.0"


def test_resolution():
    assert git("show", "main:settings.ini") == RESOLVED
    assert git("show", "main:version.py") == 'VERSION = "1.1.0"\n'
