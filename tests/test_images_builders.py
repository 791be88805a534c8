"""Image builds: BuildKit where the engine has it (Dockerfiles only BuildKit reads build), the classic builder as
the fallback, and failures that name the builder, why that one, and what to change. Builds run on the real
engine, offline, FROM the local base image."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from sandbox_support import client_fixture  # noqa: F401

from terminus_env.config import ConfigError
from terminus_env.sandbox import BASE_IMAGE, ImageBuildError, ensure_image
from terminus_env.sandbox import buildkit as buildkit_module
from terminus_env.sandbox.builders import (
    Builder,
    BuilderChoice,
    BuilderSetting,
    builder_setting,
    choose_builder,
    failure_reason,
)
from terminus_env.sandbox.buildkit import BuildkitRefused, BuildLog
from terminus_env.sandbox.images import CONTEXT_LABEL, IMAGE_LABEL

ENGINE_20_10 = {"ApiVersion": "1.41", "Os": "linux", "Version": "20.10.24+dfsg1"}
BUILDKIT_ONLY = f"""\
FROM {BASE_IMAGE}
WORKDIR /app
COPY server.py persona.md .
RUN --mount=type=cache,target=/var/cache/compat echo cached > /var/cache/compat/seen && cp /var/cache/compat/seen /app/
"""
HEREDOC = f"""\
FROM {BASE_IMAGE}
RUN <<EOT
echo from-a-heredoc > /heredoc.txt
EOT
"""


@pytest.fixture
def context(tmp_path: Path) -> Path:
    """A sidecar's build context as real tasks write it: two files copied into the WORKDIR in one COPY."""
    (tmp_path / "server.py").write_text(f"print('serving {time.time_ns()}')\n")
    (tmp_path / "persona.md").write_text("# A patient support agent\n")
    (tmp_path / "Dockerfile").write_text(BUILDKIT_ONLY)
    return tmp_path


def built(client: docker.DockerClient, context: Path, name: str) -> Iterator[str]:
    tag = ensure_image(context, name)
    try:
        yield tag
    finally:
        client.images.remove(tag, force=True)


# --- on the engine -------------------------------------------------------------------------------


@pytest.mark.docker
def test_a_dockerfile_only_buildkit_reads_builds(
    client: docker.DockerClient, context: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TERMINUS_BUILDER", raising=False)
    for tag in built(client, context, "builders-test-buildkit"):
        listing = client.containers.run(tag, ["sh", "-c", "ls /app; cat /app/seen; ls /var/cache/compat"], remove=True)
        assert listing.decode().split() == ["persona.md", "seen", "server.py", "cached"]  # the cache is no layer
        labels = client.images.get(tag).labels
        assert labels[IMAGE_LABEL] == "1" and labels[CONTEXT_LABEL] == str(context.resolve())


@pytest.mark.docker
def test_a_failing_step_names_buildkit_and_keeps_the_steps_output(
    client: docker.DockerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TERMINUS_BUILDER", raising=False)
    (tmp_path / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nRUN echo 'tool.cfg is missing' >&2 && exit 7\n")
    named = r"BuildKit \(the engine's own, Docker .*\) failed: .*exit code: 7"
    with pytest.raises(ImageBuildError, match=named) as failure:
        ensure_image(tmp_path, "builders-test-failing")
    tail = failure.value.log_tail
    assert "=> [2/2] RUN echo 'tool.cfg is missing'" in tail and "\ntool.cfg is missing\n" in tail


@pytest.mark.docker
def test_the_classic_builder_on_request_and_its_error_for_a_buildkit_dockerfile(
    client: docker.DockerClient, context: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TERMINUS_BUILDER", "classic")
    with pytest.raises(ImageBuildError) as refused:
        ensure_image(context, "builders-test-classic")
    message = str(refused.value)
    assert "the classic builder (TERMINUS_BUILDER=classic asks for it) failed" in message
    assert "the destination must be a directory and end with a /" in message  # the engine's own words
    assert "written for BuildKit" in message and "unset TERMINUS_BUILDER" in message
    (context / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nWORKDIR /app\nCOPY server.py persona.md ./\n")
    for tag in built(client, context, "builders-test-classic"):  # a Dockerfile it reads, it builds
        assert client.containers.run(tag, ["ls", "/app"], remove=True).decode().split() == ["persona.md", "server.py"]
        assert client.images.get(tag).labels[CONTEXT_LABEL] == str(context.resolve())


@pytest.mark.docker
def test_an_engine_that_refuses_buildkit_gets_the_classic_builder(
    client: docker.DockerClient, context: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refusal is what an engine without BuildKit answers; the classic build after it is real."""
    monkeypatch.delenv("TERMINUS_BUILDER", raising=False)

    def refuse(*_: object) -> Iterator[dict]:
        raise BuildkitRefused("HTTP 400: buildkit not supported by daemon")
        yield {}  # a generator, as the real one is

    monkeypatch.setattr(buildkit_module, "start_build", refuse)
    with pytest.raises(ImageBuildError, match=r"the classic builder \(the engine refused a BuildKit build: HTTP 400: "
                       r"buildkit not supported by daemon\) failed: .*end with a /"):  # fmt: skip
        ensure_image(context, "builders-test-refused")
    (context / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nCOPY server.py /srv/\n")
    for tag in built(client, context, "builders-test-refused"):
        assert client.containers.run(tag, ["ls", "/srv"], remove=True).decode().split() == ["server.py"]


@pytest.mark.docker
def test_heredocs_need_a_newer_frontend_than_docker_20_10s_and_the_error_says_so(
    client: docker.DockerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Docker 23 and later embed a Dockerfile frontend that reads heredocs; older engines' BuildKit does not."""
    monkeypatch.delenv("TERMINUS_BUILDER", raising=False)
    (tmp_path / "Dockerfile").write_text(HEREDOC)
    major = int(client.version()["Version"].split(".")[0])
    if major >= 23:
        for tag in built(client, tmp_path, "builders-test-heredoc"):
            assert client.containers.run(tag, ["cat", "/heredoc.txt"], remove=True) == b"from-a-heredoc\n"
        return
    with pytest.raises(ImageBuildError) as refused:
        ensure_image(tmp_path, "builders-test-heredoc")
    message = str(refused.value)
    assert "BuildKit (the engine's own" in message and "dockerfile parse error" in message
    assert "heredoc (`RUN <<EOF`), which needs Dockerfile syntax 1.4 or newer" in message
    assert "`# syntax=docker/dockerfile:1.4`" in message and "COPY it" in message


# --- the rules -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "setting", "expected"),
    [
        (ENGINE_20_10, BuilderSetting.AUTO, BuilderChoice(Builder.BUILDKIT)),
        (ENGINE_20_10, BuilderSetting.BUILDKIT, BuilderChoice(Builder.BUILDKIT)),
        (ENGINE_20_10, BuilderSetting.CLASSIC, BuilderChoice(Builder.CLASSIC, "TERMINUS_BUILDER=classic asks for it")),
        (
            {"ApiVersion": "1.38", "Os": "linux"},
            BuilderSetting.AUTO,
            BuilderChoice(
                Builder.CLASSIC,
                "this engine has no BuildKit: the engine's API is 1.38, and BuildKit needs 1.39 (Docker 18.09)",
            ),
        ),
        (
            {"ApiVersion": "1.41", "Os": "windows"},
            BuilderSetting.AUTO,
            BuilderChoice(
                Builder.CLASSIC,
                "this engine has no BuildKit: the engine runs windows containers, for which Docker has no BuildKit",
            ),
        ),
    ],
)
def test_which_builder(version: dict[str, str], setting: BuilderSetting, expected: BuilderChoice) -> None:
    assert choose_builder(setting, version) == expected


def test_asking_for_buildkit_where_there_is_none_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"TERMINUS_BUILDER=buildkit, but this engine has no BuildKit: .*1\.12"):
        choose_builder(BuilderSetting.BUILDKIT, {"ApiVersion": "1.12", "Os": "linux"})


def test_the_setting_is_read_once_and_checked() -> None:
    assert builder_setting({}) is BuilderSetting.AUTO
    assert builder_setting({"TERMINUS_BUILDER": " Classic "}) is BuilderSetting.CLASSIC
    with pytest.raises(ConfigError, match=r"TERMINUS_BUILDER='kaniko' names no builder: set it to one of auto, "):
        builder_setting({"TERMINUS_BUILDER": "kaniko"})


def test_failure_reasons_add_advice_only_where_it_applies() -> None:
    buildkit = BuilderChoice(Builder.BUILDKIT)
    plain = failure_reason(buildkit, "exit code: 2", "FROM x\nRUN false\n", "20.10.24")
    assert plain == "BuildKit (the engine's own, Docker 20.10.24) failed: exit code: 2"
    syntax = "# syntax=docker/dockerfile:1.4\n" + HEREDOC
    fetch = 'failed to solve with frontend gateway.v0: failed to do request: Head "https://registry-1.docker.io/..."'
    both = failure_reason(buildkit, fetch, syntax, "20.10.24")
    assert "drop the line to build with the engine's own frontend" in both and "heredoc (`RUN <<EOF`)" in both
    classic = BuilderChoice(Builder.CLASSIC, "TERMINUS_BUILDER=classic asks for it")
    mount = "the --mount option requires BuildKit. Refer to https://docs.docker.com/go/buildkit/"
    assert "written for BuildKit" in failure_reason(classic, mount, "FROM x\n", "20.10.24")
    assert "written for BuildKit" not in failure_reason(classic, "exit code: 1", "FROM x\n", "20.10.24")


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (lengths here stay under 128, so one byte each)."""
    return bytes([number << 3 | 2, len(payload)]) + payload


def test_the_build_log_reads_buildkits_status_messages() -> None:
    """Output arrives in pieces that cut lines anywhere; a step is named once; its error is kept."""
    step = _field(1, b"sha256:aa") + _field(3, b"[2/2] RUN make")
    log = BuildLog()
    log.feed(base64.b64encode(_field(1, step)).decode())
    log.feed(base64.b64encode(_field(1, step) + _field(3, _field(1, b"sha256:aa") + _field(4, b"cc: err"))).decode())
    log.feed(base64.b64encode(_field(3, _field(1, b"sha256:aa") + _field(4, b"or 1\npartial"))).decode())
    log.feed(base64.b64encode(_field(1, step + _field(7, b"exit code: 2"))).decode())
    log.feed("not base64 at all!")
    log.flush()
    assert log.lines == ["=> [2/2] RUN make", "cc: error 1", "ERROR [2/2] RUN make: exit code: 2", "partial"]
