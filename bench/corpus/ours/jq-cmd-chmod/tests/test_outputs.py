import json
import subprocess
from pathlib import Path

REPORT = Path("/app/active_users_report.json")
USERS = json.loads(Path("/app/users.json").read_text())


def expected():
    rows = [{"user_id": u["id"], "username": u["username"], "email": u["email"],
             "last_login": u["last_login"].split("T")[0], "role_count": len(u["roles"])}
            for u in USERS if u["status"] == "active"]  # fmt: skip
    return sorted(rows, key=lambda row: row["username"])


def test_the_report_holds_the_active_users():
    assert json.loads(REPORT.read_text()) == expected()


def test_the_report_is_indented_by_two_spaces():
    lines = REPORT.read_text().splitlines()
    assert lines[1] == "  {" and lines[2].startswith('    "user_id"')


def test_cmd_sh_uses_jq_only():
    command = Path("/app/cmd.sh").read_text()
    assert "jq" in command and "users.json" in command
    assert not any(word in command for word in ("python", "perl", "ruby", "node"))


def test_cmd_sh_reproduces_the_report():
    before = REPORT.read_text()
    subprocess.run(["chmod", "+x", "/app/cmd.sh"], check=True)
    subprocess.run("/app/cmd.sh", shell=True, check=True, cwd="/app")  # no #! line: the shell reads it
    assert REPORT.read_text() == before
