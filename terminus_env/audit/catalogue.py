"""The exploits the audit plays, in the order the report lists them. Add the next one found here."""

from __future__ import annotations

from terminus_env.audit.exploits import (
    Exploit,
    collect_only_config,
    env_addopts,
    exit_at_import,
    noop_tests,
    nothing,
    passing_conftest,
    program_exits,
    program_rewrites_tests,
    program_writes_reward,
    reward_path,
    workdir_config,
)

CONTROL = nothing.EXPLOIT
CATALOGUE: tuple[Exploit, ...] = (
    CONTROL,
    exit_at_import.EXPLOIT,
    noop_tests.EXPLOIT,
    program_exits.EXPLOIT,
    program_rewrites_tests.EXPLOIT,
    program_writes_reward.EXPLOIT,
    workdir_config.EXPLOIT,
    collect_only_config.EXPLOIT,
    passing_conftest.EXPLOIT,
    env_addopts.EXPLOIT,
    reward_path.EXPLOIT,
)
BY_NAME = {exploit.name: exploit for exploit in CATALOGUE}


def exploit_named(name: str) -> Exploit:
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"no exploit named {name!r}; the catalogue has {', '.join(BY_NAME)}") from None
