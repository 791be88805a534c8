# Two entry points: `make demo` (the main job) and `make test` (the whole suite).
# Both install what is missing: a virtual environment, a Docker engine, the local base image.

VENV ?= .venv
PY := $(VENV)/bin/python
CLI := $(VENV)/bin/terminus-env
JOBS ?= 4

.PHONY: all venv docker base-image browser demo check lint test unit fast test-adapters test-vllm docs install-check fresh-check bench bench-http corpus-tasks corpus clean

all: demo

$(VENV)/.installed: pyproject.toml
	bash scripts/ensure-python.sh
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,notebooks]'
	touch $@

venv: $(VENV)/.installed

docker:
	bash scripts/ensure-docker.sh

# debootstrap builds the base image when no registry answers; a fresh machine has none.
base-image: venv docker
	bash scripts/ensure-debootstrap.sh
	$(CLI) images base

# The main job: every shipped task through the env, with a results table at the end. The "model" is
# the oracle served from two simulated vLLM replicas, so the whole rollout path runs without a GPU.
demo: base-image
	$(CLI) eval tasks/ --sim 2 --concurrency $(JOBS)

# The validity check: the oracle earns 1 and doing nothing earns 0, on every shipped task.
check: base-image
	$(CLI) tasks check tasks/ --concurrency $(JOBS)

# The headless browser the page tests of `terminus-env view` open (Debian's chromium).
browser:
	bash scripts/ensure-chromium.sh >/dev/null

unit: base-image browser
	$(PY) -m pytest -q

# The edit-test loop: the tests that need neither Docker nor more than a few seconds each (about a minute).
fast: venv
	$(PY) -m pytest -q -m "not docker and not slow"

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The documentation site, into site/; a warning fails the build. The two variables silence notices about
# MkDocs 2 that the theme and a plugin print on every build.
docs: venv
	NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(VENV)/bin/mkdocs build --strict

# What `pip install` gives a user: the sdist and the wheel, each in a fresh virtual environment outside the
# checkout, list the shipped suite, make the env and run a short eval.
install-check: base-image
	bash scripts/check-install.sh $(PY)

# The set-up on a fresh Debian machine: in a clean container of the base image, the scripts above must install
# every program the set-up runs (CI machines keep what an earlier run installed, which would hide a gap).
fresh-check: base-image
	bash scripts/check-fresh-machine.sh

# The linter and the suite check first, then pytest, so the run closes on pytest's summary.
test: lint check unit

# The RL-library adapters against the real libraries, and eval's Harbor job folder against Harbor's own validator
# and viewer, each in its own environment (.venv-trl, .venv-verl, .venv-skyrl, .venv-verifiers, .venv-harbor):
# up to several GB each, so they stay out of `make test`; CI runs both.
test-adapters: base-image
	bash scripts/test-adapters.sh

# Real vLLM replicas on the CPU (.venv-vllm: vLLM's CPU build and TRL, about 4 GB): the launcher, the pool, weight
# sync, the simulator against the engine, token-exact rows and the GRPO example's two steps. CI runs it.
test-vllm: base-image
	bash scripts/test-vllm.sh

bench: base-image
	$(PY) bench/parser.py
	$(PY) bench/sandbox.py
	$(PY) bench/routing.py
	$(PY) bench/fleet.py

# Real routers over real HTTP in front of simulated replicas: about two hours at the default time scale.
bench-http: venv
	$(PY) bench/routing_http.py --json routing-http.json

# The corpus of public tasks (bench/corpus, docs/notes/corpus.md): copied out of the snapshots fetched into
# /work/.mirror and adapted to run offline, into .corpus/ (the target says which snapshot to fetch when one is
# missing); `corpus` then plays each task in train and eval mode and writes the table of false tamper flags
# (.corpus/corpus-runs.md and .json). `make corpus CHECKOUT=/path/to/other/checkout` plays the same tasks with that
# checkout's terminus_env. Images are built on demand; never part of `make test`.
corpus-tasks: base-image
	$(PY) bench/corpus/materialise.py

corpus: corpus-tasks
	$(PY) bench/corpus/run.py --jobs 2 $(if $(CHECKOUT),--checkout $(CHECKOUT))

clean:
	-$(CLI) gc
	rm -rf .corpus $(VENV) .venv-trl .venv-verl .venv-skyrl .venv-verifiers .venv-harbor .pytest_cache .hypothesis .bench-cache site dist .venv-vllm .vllm-tmp test-artifacts
