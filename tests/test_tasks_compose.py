"""Compose files, ${VAR} templates and refusals by name, read without Docker."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_tasks_loader import harbor_task, tb1_task, write

from terminus_env.tasks import TaskError, load_task
from terminus_env.tasks.compose import read_compose
from terminus_env.tasks.templates import TemplateError, substitute
from terminus_env.utils.sidecars import Condition, Dependency, Healthcheck, Services, Sidecar

# --- templates -----------------------------------------------------------------------------------

VARIABLES = {"HOST": "db.internal", "EMPTY": "", "PORT": "5432"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("${HOST}:${PORT}", "db.internal:5432"),
        ("${MISSING:-fallback}", "fallback"),
        ("${EMPTY:-fallback}|${EMPTY-kept}", "fallback|"),
        ("${MISSING-x}", "x"),
        ("${HOST:+set}|${EMPTY:+set}|${EMPTY+set}|${MISSING+set}", "set||set|"),
        ("${MISSING:-${HOST}-${PORT:-1}}", "db.internal-5432"),
        ("${HOST:?never used}", "db.internal"),
        ("cost: $5 and $HOST", "cost: $5 and $HOST"),  # task.toml: a lone $ stays as written
    ],
)
def test_task_file_templates(text: str, expected: str) -> None:
    assert substitute(text, VARIABLES, compose=False) == expected


def test_compose_templates_know_bare_names_escapes_and_empty_unset() -> None:
    assert substitute("$HOST:$PORT $$HOME ${MISSING}|$MISSING|", VARIABLES, compose=True) == "db.internal:5432 $HOME ||"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("${MISSING}", r"\$\{MISSING\} is not set in the host's environment.*\$\{MISSING:-default\}"),
        ("${EMPTY:?give a password}", r"\$\{EMPTY\} is required: give a password"),
        ("${HOST", "no closing"),
        ("${1X}", "does not start with a variable name"),
        ("${HOST/x/y}", "expected one of"),
    ],
)
def test_template_errors_say_what_to_do(text: str, message: str) -> None:
    with pytest.raises(TemplateError, match=message):
        substitute(text, VARIABLES, compose=False)


@given(st.text(alphabet=st.characters(blacklist_characters="$"), max_size=40))
def test_text_without_templates_is_unchanged(text: str) -> None:
    assert substitute(text, VARIABLES, compose=False) == text == substitute(text, VARIABLES, compose=True)


def test_environment_templates_come_from_the_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    toml = textwrap.dedent(
        """\
        [environment.env]
        API_KEY = "${E11_KEY}"
        REGION = "${E11_REGION:-eu-west-1}"
        LITERAL = "$HOME stays"
        [verifier.env]
        JUDGE = "${E11_KEY}-judge"
        """
    )
    monkeypatch.setenv("E11_KEY", "k-123")
    monkeypatch.delenv("E11_REGION", raising=False)
    task = load_task(harbor_task(tmp_path, toml=toml))
    assert dict(task.env) == {"API_KEY": "k-123", "REGION": "eu-west-1", "LITERAL": "$HOME stays"}
    assert dict(task.verifier_env) == {"JUDGE": "k-123-judge"}
    monkeypatch.delenv("E11_KEY")
    with pytest.raises(TaskError, match=r"task\.toml: field 'environment\.env\.API_KEY' cannot be resolved"):
        load_task(tmp_path / "demo")


# --- refusals by name ----------------------------------------------------------------------------


def test_multi_step_tasks_are_refused_before_anything_else(tmp_path: Path) -> None:
    folder = harbor_task(tmp_path, toml='[[steps]]\nname = "one"\n')
    (folder / "instruction.md").unlink()  # real multi-step tasks keep their instructions in steps/
    with pytest.raises(TaskError, match=r"\[\[steps\]\] in task\.toml\); multi-step tasks are not supported"):
        load_task(folder)
    folder = harbor_task(tmp_path, name="with-steps-folder")
    (folder / "steps" / "one").mkdir(parents=True)
    with pytest.raises(TaskError, match=r"steps folder\); multi-step tasks are not supported"):
        load_task(folder)


def test_an_environment_other_than_docker_is_refused_by_name(tmp_path: Path) -> None:
    folder = harbor_task(tmp_path, toml='[environment]\ntype = "cloudlab"\n')
    (folder / "environment" / "Dockerfile").unlink()
    with pytest.raises(TaskError, match=r"'environment\.type' is 'cloudlab'; terminus-env runs only Docker"):
        load_task(folder)
    assert load_task(harbor_task(tmp_path, toml='[environment]\ntype = "docker"\n', name="plain")).name == "plain"


def test_a_compose_only_environment_is_refused_by_name(tmp_path: Path) -> None:
    folder = harbor_task(tmp_path)
    (folder / "environment" / "Dockerfile").unlink()
    write(folder / "environment" / "docker-compose.yaml", "services:\n  main:\n    image: x\n")
    with pytest.raises(TaskError, match="an environment given only as a compose file"):
        load_task(folder)
    legacy = tb1_task(tmp_path)
    (legacy / "Dockerfile").unlink()
    write(legacy / "docker-compose.yaml", "services:\n  client:\n    build: ./client\n")
    with pytest.raises(TaskError, match=r"client/Dockerfile: missing; .* the folder its docker-compose.yaml builds"):
        load_task(legacy)


def test_a_tb1_client_built_from_a_folder_of_its_own(tmp_path: Path) -> None:
    """Terminal-Bench 1's harness builds the client where its compose file says, as simple-web-scraper's does."""
    legacy = tb1_task(tmp_path)
    (legacy / "Dockerfile").unlink()
    for service in ("client", "server"):
        write(legacy / service / "Dockerfile", "FROM terminus-env/base:bookworm\n")
    compose = textwrap.dedent(
        """\
        services:
          client:
            build: {context: client, dockerfile: Dockerfile}
            image: ${T_BENCH_TASK_DOCKER_CLIENT_IMAGE_NAME}
            container_name: ${T_BENCH_TASK_DOCKER_CLIENT_CONTAINER_NAME}
            networks: [app-network]
            depends_on: {server: {condition: service_healthy}}
          server:
            build: {context: server}
            image: ${T_BENCH_TASK_DOCKER_NAME_PREFIX}__server
            networks: [app-network]
        networks:
          app-network: {driver: bridge}
        """
    )
    write(legacy / "docker-compose.yaml", compose)
    task = load_task(legacy)
    assert task.build_context == legacy / "client" and task.services is not None
    assert [s.name for s in task.services.sidecars] == ["server"]
    assert task.services.main_depends_on == (Dependency("server", Condition.HEALTHY),)
    write(legacy / "docker-compose.yaml", compose.replace("dockerfile: Dockerfile}", "dockerfile: Dockerfile.dev}"))
    with pytest.raises(TaskError, match=r"'build.dockerfile' 'Dockerfile.dev' of the agent's service 'client' .*"
                       r"rename the file to Dockerfile\) is not supported"):  # fmt: skip
        load_task(legacy)
    write(legacy / "docker-compose.yaml", compose.replace("dockerfile: Dockerfile}", "args: {V: '1'}}"))
    with pytest.raises(TaskError, match=r"'build.args' of the agent's service 'client' \(write the values"):
        load_task(legacy)


# --- compose files -------------------------------------------------------------------------------


def test_only_docker_compose_yaml_is_a_compose_file_as_in_harbor_and_terminal_bench_1(tmp_path: Path) -> None:
    """Harbor reads environment/docker-compose.yaml, Terminal-Bench 1 the task's docker-compose.yaml, and nothing
    else: a file by another name is data in the build context (a real task ships a broken one for the agent)."""
    folder = harbor_task(tmp_path)
    broken = 'services:\n  app:\n    image: "registry.local/app:${TAG"\n    volumes: [appdata:/data]\n'
    write(folder / "environment" / "docker-compose.yml", broken)
    write(folder / "environment" / "compose.yaml", broken)
    task = load_task(folder)
    assert task.services is None and task.build_context == folder / "environment"
    assert [note.split(" is not read")[0] for note in task.notes] == [
        str(folder / "environment" / "docker-compose.yml"), str(folder / "environment" / "compose.yaml")
    ]
    assert "(Harbor reads only docker-compose.yaml): it is a file like any other in the build context" in task.notes[0]
    write(folder / "environment" / "docker-compose.yaml", "services:\n  main:\n    environment: {FROM: yaml}\n")
    assert load_task(folder).env["FROM"] == "yaml"  # beside it, the .yaml one is read
    (folder / "environment" / "Dockerfile").unlink()
    (folder / "environment" / "docker-compose.yaml").unlink()
    with pytest.raises(TaskError, match=r"Dockerfile: missing and \[environment\] docker_image unset"):
        load_task(folder)  # a .yml is no environment definition either, as Harbor says

    legacy = tb1_task(tmp_path)
    write(legacy / "docker-compose.yml", "services:\n  client:\n    working_dir: /ignored\n    privileged: true\n")
    task = load_task(legacy)
    assert task.workdir is None and task.services is None
    assert any("(Terminal-Bench 1 reads only docker-compose.yaml)" in note for note in task.notes)


def harbor_compose(tmp_path: Path, compose: str, toml: str = 'version = "1.0"\n'):
    folder = harbor_task(tmp_path, toml=toml)
    write(folder / "environment" / "docker-compose.yaml", textwrap.dedent(compose))
    for service in ("db", "cache", "web"):
        write(folder / "environment" / service / "Dockerfile", "FROM terminus-env/base:bookworm\n")
    return folder


def test_harbor_compose_main_settings_and_a_sidecar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("E11_DB_PASSWORD", "s3cret")
    folder = harbor_compose(
        tmp_path,
        """\
        services:
          main:
            environment: {APP_MODE: compose, DB_URL: "postgres://db:5432"}
            working_dir: /srv
            shm_size: 1g
            tmpfs: /scratch:size=8m
            extra_hosts: ["api.example:10.0.0.7"]
            deploy: {resources: {limits: {cpus: "2", memory: 3G}}}
            depends_on: {db: {condition: service_healthy}}
            image: ${MAIN_IMAGE_NAME}
            command: ["sleep", "infinity"]
          db:
            build: {context: ./db, args: {VERSION: "16"}}
            environment: ["POSTGRES_PASSWORD=${E11_DB_PASSWORD}", E11_DB_PASSWORD, NOT_SET_ANYWHERE]
            command: postgres -c 'max_connections=20'
            hostname: database
            mem_limit: 512m
            cpus: 0.5
            pids_limit: 200
            cap_add: [CAP_SYS_CHROOT]
            healthcheck: {test: pg_isready, interval: 1m30s, timeout: 500ms, retries: 5, start_period: 2s}
            ports: ["5432:5432"]
            restart: always
            x-notes: ignored
        """,
        toml='[environment]\ncpus = 1\nmemory_mb = 1024\nworkdir = "/app"\nenv = { APP_MODE = "toml" }\n',
    )
    task = load_task(folder)
    assert dict(task.env) == {"APP_MODE": "toml", "DB_URL": "postgres://db:5432"}  # task.toml's env wins
    assert task.workdir == "/app"  # and its workdir
    assert (task.cpus, task.memory_mb) == (2.0, 3072)  # Harbor lays the task's compose file over its limits
    assert (task.shm_size_mb, task.tmpfs, task.extra_hosts) == (1024, (("/scratch", "size=8m"),),
                                                                (("api.example", "10.0.0.7"),))  # fmt: skip
    assert task.services is not None
    (db,) = task.services.sidecars
    assert task.services.main_name == "main" and task.services.main_depends_on == (Dependency("db", Condition.HEALTHY),)
    assert db.build is not None and db.build.context == folder / "environment" / "db"
    assert (db.build.args, db.build.name) == ((("VERSION", "16"),), "demo-db")
    assert db.env == (("POSTGRES_PASSWORD", "s3cret"), ("E11_DB_PASSWORD", "s3cret"))
    assert db.command == ("postgres", "-c", "max_connections=20") and db.aliases == ("database",)
    assert (db.memory_mb, db.cpus, db.pids_limit, db.cap_add) == (512, 0.5, 200, ("SYS_CHROOT",))
    assert db.healthcheck == Healthcheck(("CMD-SHELL", "pg_isready"), 90.0, 0.5, 5, 2.0)
    spec = task.sandbox_spec("image")
    assert spec.services == task.services and spec.shm_size_mb == 1024 and hash(spec)


def test_tb1_compose_sets_the_clients_settings(tmp_path: Path) -> None:
    folder = tb1_task(tmp_path)
    write(folder / "docker-compose.yaml", textwrap.dedent(
        """\
        services:
          client:
            build:
              dockerfile: Dockerfile
            image: ${T_BENCH_TASK_DOCKER_CLIENT_IMAGE_NAME}
            container_name: ${T_BENCH_TASK_DOCKER_CLIENT_CONTAINER_NAME}
            command: [ "sh", "-c", "sleep infinity" ]
            environment:
              - TEST_DIR=${T_BENCH_TEST_DIR}
              - LANG=C.UTF-8
            working_dir: /app
            network_mode: none
            volumes:
              - ${T_BENCH_TASK_LOGS_PATH}:${T_BENCH_CONTAINER_LOGS_PATH}
              - ${T_BENCH_TASK_AGENT_LOGS_PATH}:${T_BENCH_CONTAINER_AGENT_LOGS_PATH}
            deploy: {resources: {limits: {memory: 4g, cpus: "1.5", pids: 300}}}
        """
    ))  # fmt: skip
    task = load_task(folder)
    assert dict(task.env) == {"TEST_DIR": "/tests", "LANG": "C.UTF-8"} and task.workdir == "/app"
    assert (task.memory_mb, task.cpus, task.pids_limit, task.allow_internet) == (4096, 1.5, 300, False)
    assert task.services is None and task.sandbox_spec("image").pids_limit == 300


def test_tb1_services_by_container_name_and_dependency_order(tmp_path: Path) -> None:
    folder = tb1_task(tmp_path)
    for service in ("api", "worker", "store"):
        write(folder / service / "Dockerfile", "FROM terminus-env/base:bookworm\n")
    write(folder / "docker-compose.yaml", textwrap.dedent(
        """\
        services:
          agent-box:
            build: .
            container_name: ${T_BENCH_TASK_DOCKER_CLIENT_CONTAINER_NAME}
            depends_on: [api]
          api:
            build: ./api
            container_name: ${T_BENCH_TASK_DOCKER_NAME_PREFIX}__api
            depends_on: {worker: {condition: service_started}, store: {condition: service_completed_successfully}}
          worker:
            build: ./worker
            depends_on: [store]
          store:
            build: ./store
        """
    ))  # fmt: skip
    services = load_task(folder).services
    assert isinstance(services, Services) and services.main_name == "agent-box"
    assert services.main_aliases == ("tb__legacy__client",)
    assert [s.name for s in services.start_order()] == ["store", "worker", "api"]
    api = next(s for s in services.sidecars if s.name == "api")
    assert api.aliases == ("tb__legacy__api",) and Dependency("store", Condition.COMPLETED) in api.depends_on


def compose_error(tmp_path: Path, compose: str) -> str:
    with pytest.raises(TaskError) as error:
        load_task(harbor_compose(tmp_path, compose))
    return str(error.value)


@pytest.mark.parametrize(
    ("compose", "named"),
    [
        ("services:\n  db:\n    build: ./db\n    privileged: true\n", "setting 'privileged' of service 'db'"),
        ("services:\n  db:\n    build: ./db\n    volumes: [data:/var/lib/db]\n", "volume 'data:/var/lib/db'"),
        ("services:\n  db:\n    build: ./db\n    cap_add: [SYS_ADMIN]\n", "cap_add SYS_ADMIN of service 'db'"),
        ("services:\n  db:\n    build: ./db\n    network_mode: host\n", "network_mode 'host' of service 'db'"),
        ("services:\n  db:\n    build: {context: ./db, target: dev}\n", "'build.target' of service 'db'"),
        ("services:\n  main:\n    entrypoint: [x]\n  db:\n    build: ./db\n", "setting 'entrypoint' of service 'main'"),
        ("services:\n  main:\n    user: app\n", "setting 'user' of service 'main'"),
        ("services:\n  main:\n    command: [/usr/local/bin/run-connector.sh]\n",
         "command '/usr/local/bin/run-connector.sh' of the agent's service 'main' (its container runs the harness's"),
        ("services:\n  db:\n    build: ./db\nsecrets:\n  s: {file: x}\n", "top-level 'secrets'"),
        ("services:\n  db:\n    build: ./db\n    deploy: {replicas: 3}\n", "deploy.replicas of service 'db'"),
    ],
)
def test_settings_that_cannot_be_honoured_are_refused_by_name(tmp_path: Path, compose: str, named: str) -> None:
    message = compose_error(tmp_path, compose)
    assert named in message and "is not supported by terminus-env" in message


@pytest.mark.parametrize(
    ("compose", "message"),
    [
        ("services:\n  db:\n    build: ./nowhere\n", r"nowhere/Dockerfile, which does not exist"),
        ("services:\n  db:\n    environment: {A: b}\n", "neither 'build' nor 'image'"),
        ("services:\n  main:\n    depends_on: [cache]\n  db:\n    build: ./db\n", "unknown service 'cache'"),
        ("services:\n  db:\n    build: ./db\n    depends_on: [main]\n", "depends on 'main', the agent's container"),
        (
            "services:\n  db:\n    build: ./db\n    depends_on: [cache]\n  cache:\n    build: ./cache\n"
            "    depends_on: [db]\n",
            "in a circle: db -> cache -> db",
        ),
        (
            "services:\n  db:\n    build: ./db\n    depends_on: {cache: {condition: ready}}\n  cache:\n"
            "    build: ./cache\n",
            "use one of service_started, service_healthy, service_completed_successfully",
        ),
        ("services:\n  db:\n    build: ./db\n    mem_limit: lots\n", "'db.memory' must be a size"),
        ("services:\n  db:\n    build: ./db\n    mem_limit: 1k\n", "outside the usable range 16 MB"),
        ("services:\n  db:\n    build: ./db\n    healthcheck: {test: x, interval: soon}\n", "must be a duration"),
        ("services:\n  db:\n    build: ./db\n    healthcheck: {test: [curl, x]}\n", "list starting with CMD"),
        ("services:\n  main:\n    build: ./db\n", "the agent's container is built from"),
        ("services:\n  main:\n    network_mode: none\n  db:\n    build: ./db\n", "network_mode none, yet it has"),
        ("services: {}\n", "needs a 'services' table"),
        ("services:\n  bad name:\n    build: ./db\n", "not a valid host name"),
    ],
)
def test_broken_compose_files_say_what_to_fix(tmp_path: Path, compose: str, message: str) -> None:
    assert re.search(message, compose_error(tmp_path, compose))


def test_sidecar_settings_in_other_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("E11_FROM_HOST", "host-value")
    folder = harbor_compose(
        tmp_path,
        """\
        services:
          web:
            image: nginx:1.27
            entrypoint: /docker-entrypoint.sh
            env_file: [web.env, {path: missing.env, required: false}]
            environment: {FROM_FILE_OVERRIDDEN: compose, FROM_HOST: $E11_FROM_HOST, UNSET: null}
            tmpfs: [/run, "/cache:size=1m,mode=1777"]
            extra_hosts: {upstream: 10.1.1.1}
            shm_size: 67108864
            healthcheck: {disable: true}
            init: "true"
        """,
    )
    env_file = "# settings\nFROM_FILE=a b\nexport QUOTED='x y'\nFROM_FILE_OVERRIDDEN=file\n"
    write(folder / "environment" / "web.env", env_file)
    (web,) = load_task(folder).services.sidecars  # type: ignore[union-attr]
    assert web == Sidecar(
        name="web", image="nginx:1.27", entrypoint=("/docker-entrypoint.sh",),
        env=(("FROM_FILE", "a b"), ("QUOTED", "x y"), ("FROM_FILE_OVERRIDDEN", "compose"), ("FROM_HOST", "host-value")),
        tmpfs=(("/run", ""), ("/cache", "size=1m,mode=1777")), extra_hosts=(("upstream", "10.1.1.1"),),
        shm_size_mb=64, healthcheck=Healthcheck(("NONE",)), init=True,
    )  # fmt: skip


def test_read_compose_takes_the_harness_variables_first(tmp_path: Path) -> None:
    file = write(tmp_path / "docker-compose.yaml", "services:\n  main:\n    environment: ['WHERE=${CONTEXT_DIR}']\n")
    read = read_compose(
        file, main="main", main_build=tmp_path, variables={"CONTEXT_DIR": "/ctx"}, image_prefix="t", build_timeout_s=1
    )
    assert read.env == (("WHERE", "/ctx"),) and read.services is None


def test_services_built_by_hand_must_depend_on_their_own_sidecars() -> None:
    cache = Sidecar("cache", image="redis")
    with pytest.raises(ValueError, match="'main' depends on 'db', which is no sidecar here"):
        Services((cache,), main_depends_on=(Dependency("db"),))
    with pytest.raises(ValueError, match="'web' depends on 'db'"):
        Services((cache, Sidecar("web", image="nginx", depends_on=(Dependency("db"),))))
    assert Services((cache,), main_depends_on=(Dependency("cache", Condition.HEALTHY),)).start_order() == (cache,)
