"""Every field of Harbor's task.toml is honoured, ignored with a reason, or refused by name; docs/tasks.md lists each.
Read without Docker; tests/compat/harbor-newer-fields runs the honoured ones for real."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from test_tasks_loader import harbor_task, tb1_task, write

from terminus_env.rollout.policy import oracle_reply
from terminus_env.tasks import TaskError, load_task
from terminus_env.tasks.harbor_fields import FIELDS, Handling

DOCS = Path(__file__).resolve().parent.parent / "docs" / "tasks.md"
HARBOR_0_26_FIELDS = {
    # harbor 0.26.0, harbor/models/task/config.py: TaskConfig and the models of its tables
    "schema_version", "version", "source", "task", "metadata", "artifacts", "steps", "multi_step_reward_strategy",
    "solution.env",
    "agent.timeout_sec", "agent.user", "agent.network_mode", "agent.allowed_hosts",
    "verifier.timeout_sec", "verifier.env", "verifier.user", "verifier.network_mode", "verifier.allowed_hosts",
    "verifier.environment_mode", "verifier.environment", "verifier.collect",
    "environment.build_timeout_sec", "environment.docker_image", "environment.os", "environment.cpus",
    "environment.memory_mb", "environment.storage_mb", "environment.gpus", "environment.gpu_types",
    "environment.tpu", "environment.mcp_servers", "environment.env", "environment.skills_dir",
    "environment.healthcheck", "environment.workdir", "environment.allow_internet", "environment.network_mode",
    "environment.allowed_hosts", "environment.memory", "environment.storage",
}  # fmt: skip


def test_every_field_of_harbors_schema_has_a_rule_and_a_line_in_the_docs() -> None:
    assert HARBOR_0_26_FIELDS | {"environment.type"} == set(FIELDS)
    rows = dict(re.findall(r"^\| `([a-z_.]+)` \| (honoured|ignored|refused) \|", DOCS.read_text(), re.MULTILINE))
    assert {name: rule.handling.value for name, rule in FIELDS.items()} == rows


@pytest.mark.parametrize(
    ("toml", "named"),
    [
        ('[environment]\ntpu = { type = "v6e", topology = "2x4" }\n', r"'environment\.tpu' .*TPU slice"),
        ('[environment]\nskills_dir = "/skills"\n', r"'environment\.skills_dir' .*told of the skills"),
        ('[environment.healthcheck]\ncommand = "true"\n', r"'environment\.healthcheck' .*ENTRYPOINT wait"),
        ('[verifier]\nenvironment_mode = "separate"\n', r"'verifier\.environment_mode' is 'separate'"),
        ('[verifier.environment]\ncpus = 2\n', r"'verifier\.environment' .*verifier container of its own"),
        ('[[verifier.collect]]\ncommand = "true"\n', r"'verifier\.collect' .*separate verifier"),
        ('[verifier]\nenvironment_mode = "elsewhere"\n', r"'verifier\.environment_mode' is 'elsewhere'; use"),
        ("[environment]\ngpus = 1\n", r"'environment\.gpus' is 1: terminus-env gives containers no GPU"),
        ('[environment]\nos = "Windows"\n', r"'environment\.os' is 'windows': .*Linux containers only"),
        ('[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n', r"'environment\.network_mode'"
         r" is 'allowlist' .*no per-host egress filter"),  # fmt: skip
        ('[agent]\nallowed_hosts = ["pypi.org"]\n', r"'agent\.allowed_hosts' is set, yet no network_mode"),
        ('[environment]\nnetwork_mode = "offline"\n', r"'environment\.network_mode' is 'offline'; use one of public"),
        ('[agent]\nnetwork_mode = "no-network"\n[verifier]\nnetwork_mode = "public"\n',
         r"agent's network is 'no-network' and the verifier's 'public' .*one network policy"),  # fmt: skip
        ('[environment]\nallow_internet = false\n[verifier]\nnetwork_mode = "public"\n',
         r"agent's network is 'no-network' and the verifier's 'public'"),  # fmt: skip
    ],
)
def test_what_cannot_run_as_written_is_refused_by_name(tmp_path: Path, toml: str, named: str) -> None:
    folder = harbor_task(tmp_path, toml=toml)
    (folder / "instruction.md").unlink()  # refused before anything can be reported missing
    with pytest.raises(TaskError, match=named) as refusal:
        load_task(folder)
    assert "instruction.md" not in str(refusal.value)


@pytest.mark.parametrize(
    ("servers", "named"),
    [
        ('[[environment.mcp_servers]]\nname = "docs"\ntransport = "sse"\n', "entry 'docs' needs a url"),
        ('[[environment.mcp_servers]]\ntransport = "stdio"\n', "entry 0 needs a name"),
        ('[environment]\nmcp_servers = "docs"\n', r"must be a list of tables \(\[\[environment.mcp_servers\]\]\)"),
    ],
)
def test_broken_mcp_servers_say_what_to_fix(tmp_path: Path, servers: str, named: str) -> None:
    with pytest.raises(TaskError, match=rf"field 'environment.mcp_servers': {named}"):
        load_task(harbor_task(tmp_path, toml=servers))


@pytest.mark.parametrize(
    ("toml", "allow_internet"),
    [
        ('[environment]\nnetwork_mode = "no-network"\n', False),
        ('[environment]\nnetwork_mode = "public"\nallow_internet = false\n', True),  # the newer field wins
        ("[environment]\nallow_internet = false\n", False),
        ('[agent]\nnetwork_mode = "no-network"\n[verifier]\nnetwork_mode = "no-network"\n', False),
        ('[environment]\nnetwork_mode = "no-network"\n[agent]\nnetwork_mode = "no-network"\n', False),
        ("", True),
    ],
)
def test_network_policies_that_agree_are_honoured(tmp_path: Path, toml: str, allow_internet: bool) -> None:
    assert load_task(harbor_task(tmp_path, toml=toml)).allow_internet is allow_internet


def test_the_newer_fields_that_run_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FIELDS_SEED", "42")
    toml = """\
schema_version = "1.4"
source = "registry"
artifacts = ["/app/report.txt", { source = "/app/logs", exclude = ["*.tmp"] }]

[task]
name = "acme/fields"
authors = [{ name = "Ada", email = "ada@example.com" }]

[agent]
user = 1000

[verifier]
user = 0
environment_mode = "shared"

[solution.env]
SEED = "${FIELDS_SEED}"
MODE = "${FIELDS_MODE:-oracle}"

[environment]
os = "Linux"
gpus = 0
gpu_types = ["H100"]
network_mode = "no-network"
mcp_servers = [
  { name = "docs", transport = "streamable-http", url = "http://docs:8000/mcp" },
  { name = "calc", transport = "stdio", command = "python3", args = ["-m", "calc"] },
]
"""
    task = load_task(harbor_task(tmp_path, toml=toml))
    assert (task.agent_user, task.verifier_user, task.allow_internet) == ("1000", "0", False)
    assert dict(task.solution_env) == {"SEED": "42", "MODE": "oracle"}
    assert task.instruction == (
        "Write hello to /app/out.txt.\n\n\nMCP servers available for this task:\n"
        "- docs: streamable-http transport at http://docs:8000/mcp\n"
        "- calc: stdio transport, started with `python3 -m calc`\n"
    )
    assert task.metadata["task"]["name"] == "acme/fields" and task.notes == ()
    assert FIELDS["artifacts"].handling is Handling.IGNORED


@pytest.mark.parametrize("unwritable", [False, True], ids=["solution-folder", "agent-user-cannot-write-it"])
def test_the_typed_oracle_gives_solve_sh_the_solution_env(tmp_path: Path, unwritable: bool) -> None:
    """The oracle policy types its solution into the terminal: [solution.env] must reach solve.sh there as well,
    every value exactly (quotes, `$`, newlines, tabs, non-ASCII), or a correct solution earns 0 in train mode; and
    a non-root agent user who cannot make /solution still runs it (from a temporary folder)."""
    values = {"PLAIN": "tide-pool", "QUOTED": 'it\'s $HOME `x` \\ "q"', "LINES": "a\nb\tc\n\n", "ODD": "\u2028é\x01"}
    table = "".join(f"{name} = {json.dumps(value)}\n" for name, value in values.items())
    folder = harbor_task(tmp_path, toml=f'[task]\nname = "acme/env"\n\n[solution.env]\n{table}')
    dumped = tmp_path / "env.json"
    dump = "import json, os; print(json.dumps(dict(os.environ)))"
    write(folder / "solution" / "solve.sh", f"python3 -c '{dump}' > {dumped}\n")
    keystrokes = re.search(r"<keystrokes[^>]*>(.*)</keystrokes>", oracle_reply(load_task(folder), 0), re.DOTALL)
    assert keystrokes is not None
    target = "/proc/no-such-folder" if unwritable else str(tmp_path / "solution-copy")  # for the container's /solution
    line = keystrokes.group(1).replace("S=/solution", f"S={target}")
    subprocess.run(["bash", "-c", line], check=True, env={"PATH": os.environ["PATH"]})
    seen = json.loads(dumped.read_text())
    assert {name: seen.get(name) for name in values} == values


def test_terminal_bench_1_fields_of_its_newest_harness_are_known(tmp_path: Path) -> None:
    text = (
        "instruction: Do it.\ndisable_asciinema: true\nestimated_duration_sec: 90\njunior_time_estimate_min: 30\n"
        "expert_time_estimate_min: 10\nauthor_name: a\n"
    )
    task = load_task(tb1_task(tmp_path, text))
    assert "unknown_fields" not in task.metadata and task.metadata["disable_asciinema"] is True
