"""`terminus-env images prune` and rebuilds over real Docker, on images only this test makes (unique names)."""

from __future__ import annotations

import io
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from terminus_env.cli import main as cli_main
from terminus_env.cli.image_prune import current_tags
from terminus_env.sandbox.images import BASE_IMAGE, IMAGE_LABEL, ensure_image, prune_task_images
from terminus_env.tasks import load_task

pytestmark = pytest.mark.usefixtures("docker_required")


@pytest.fixture
def client() -> Iterator[docker.DockerClient]:
    client = docker.from_env()
    yield client
    client.close()


@pytest.fixture
def prefix(client: docker.DockerClient) -> Iterator[str]:
    """A task-name prefix no other test or worker uses; whatever image carries it is removed afterwards."""
    prefix = f"prune-test-{uuid.uuid4().hex[:8]}"
    yield prefix
    for image in client.api.images(filters={"label": IMAGE_LABEL}):
        for tag in image.get("RepoTags") or []:
            if tag.startswith(f"terminus-env/task-{prefix}"):
                client.api.remove_image(tag, force=True)


def write_task(root: Path, name: str, version: str) -> Path:
    task = root / name
    for folder in ("environment", "tests"):
        (task / folder).mkdir(parents=True, exist_ok=True)
    (task / "task.toml").write_text('version = "1.0"\n')
    (task / "instruction.md").write_text("Nothing to do.\n")
    (task / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (task / "environment" / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nRUN echo {version} > /version\n")
    return task


def build(task: Path) -> str:
    loaded = load_task(task)
    assert loaded.build_context is not None
    return ensure_image(loaded.build_context, loaded.name)


def tags(client: docker.DockerClient, prefix: str) -> set[str]:
    repository = f"terminus-env/task-{prefix}"
    return {t for i in client.api.images() for t in i.get("RepoTags") or [] if t.startswith(repository)}


def test_a_rebuilt_task_drops_its_old_tag(client: docker.DockerClient, prefix: str, tmp_path: Path) -> None:
    task = write_task(tmp_path, f"{prefix}-a", "v1")
    first = build(task)
    write_task(tmp_path, f"{prefix}-a", "v2")
    second = build(task)
    assert first != second and tags(client, prefix) == {second}
    assert current_tags([tmp_path]) == {f"{prefix}-a": second}


def test_prune_removes_what_no_task_in_the_folders_needs_and_nothing_else(
    client: docker.DockerClient, prefix: str, tmp_path: Path
) -> None:
    suite, elsewhere = tmp_path / "suite", tmp_path / "other-checkout"
    current = build(write_task(suite, f"{prefix}-a", "v1"))
    gone = build(write_task(suite, f"{prefix}-gone", "v1"))
    broken_tag = build(write_task(suite, f"{prefix}-broken", "v1"))
    foreign = build(write_task(elsewhere, f"{prefix}-a", "other-checkout"))
    # An image built before images recorded their folder: tagged like an older build of task a.
    legacy = f"terminus-env/task-{prefix}-a:0123456789abcdef"
    client.images.build(fileobj=io.BytesIO(f"FROM {BASE_IMAGE}\nRUN echo legacy > /v\n".encode()), tag=legacy,
                        labels={IMAGE_LABEL: "1"}, rm=True)  # fmt: skip
    in_use = f"terminus-env/task-{prefix}-a:feedfacefeedface"
    client.images.build(fileobj=io.BytesIO(f"FROM {BASE_IMAGE}\nRUN echo in use > /v\n".encode()), tag=in_use,
                        labels={IMAGE_LABEL: "1"}, rm=True)  # fmt: skip
    # Unlabelled and of no task in the folder: whose it is cannot be told, so it stays.
    stray = f"terminus-env/task-{prefix}-gone:0000000000000000"
    client.api.tag(legacy, f"terminus-env/task-{prefix}-gone", "0000000000000000")
    container = client.containers.create(in_use, "true", labels={"prune-test": prefix})
    try:
        (suite / f"{prefix}-broken" / "task.toml").write_text("not [toml\n")  # broken today, maybe fixed tomorrow
        shutil.rmtree(suite / f"{prefix}-gone")  # a task deleted from the suite

        dry = prune_task_images(current_tags([suite]), [suite], dry_run=True)
        assert set(dry.removed) == {gone, legacy, in_use} and tags(client, prefix) >= {gone, legacy, in_use}

        report = prune_task_images(current_tags([suite]), [suite])
        assert set(report.removed) == {gone, legacy} and report.in_use == (in_use,)
        assert report.undecided == (broken_tag,)
        assert tags(client, prefix) == {current, broken_tag, foreign, in_use, stray}  # another folder's stay
        assert client.images.get(BASE_IMAGE)
    finally:
        container.remove(force=True)


def test_the_command_prints_what_it_removed(
    client: docker.DockerClient, prefix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    task = write_task(tmp_path, f"{prefix}-a", "v1")
    old = build(task)
    (task / "task.toml").unlink()  # no longer a task: its image is not needed
    assert cli_main(["images", "prune", str(tmp_path), "--dry-run"]) == 0
    assert f"would remove {old}" in capsys.readouterr().out and tags(client, prefix) == {old}
    assert cli_main(["images", "prune", str(tmp_path)]) == 0
    assert f"removed {old}" in capsys.readouterr().out and tags(client, prefix) == set()


def test_prune_keeps_the_sidecar_images_a_task_needs(client: docker.DockerClient, prefix: str, tmp_path: Path) -> None:
    task = write_task(tmp_path, f"{prefix}-c", "v1")
    (task / "environment" / "db").mkdir()
    (task / "environment" / "db" / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nRUN echo db-v1 > /db\n")
    (task / "environment" / "docker-compose.yaml").write_text("services:\n  db:\n    build: ./db\n")
    (sidecar,) = load_task(task).services.sidecars  # type: ignore[union-attr]
    assert sidecar.build is not None
    main, db = build(task), ensure_image(sidecar.build.context, sidecar.build.name)
    assert db.startswith(f"terminus-env/task-{prefix}-c-db:")
    assert current_tags([tmp_path]) == {f"{prefix}-c": main, f"{prefix}-c-db": db}
    report = prune_task_images(current_tags([tmp_path]), [tmp_path])
    assert report.removed == () and tags(client, prefix) == {main, db}
    (task / "environment" / "docker-compose.yaml").unlink()  # the task no longer has the sidecar
    rebuilt = build(task)  # its build context changed with it; the rebuild drops the old main tag
    report = prune_task_images(current_tags([tmp_path]), [tmp_path])
    assert report.removed == (db,) and tags(client, prefix) == {rebuilt}
