# The documented commands (docs/commands.md). `make test` is what CI runs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# Environment: offline models, no telemetry, patient Prefect start-up. Ray keeps its token auth (for clusters other
# machines join; a local Ray listens on 127.0.0.1 only); only the tests' throwaway local clusters disable it.
export HF_HUB_OFFLINE := 1
export MLFLOW_DISABLE_TELEMETRY := true
export RAY_USAGE_STATS_ENABLED := 0
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 120
export DO_NOT_TRACK := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false

.PHONY: install test test-fast lint format clean demo serve ui-check gpu-check wheelhouse docs

install: $(STAMP)

# torch==2.13.0 first: a CPU wheel where one is provided locally, the CUDA build from the registry elsewhere.
# Then the project, editable, with dev extras, through the pins in constraints.txt. Re-runs only when those change.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	@touch $@

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Two pytest workers (pytest-xdist), one test file per worker at a time: the tiny models train on one thread, so the
# second worker uses the core the first leaves idle (pytest 22:40 -> 15:45 on an idle 2-core machine).
TEST_WORKERS ?= 2
test: lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

# docs/: the generated pages (README -> index, the CLI and recipe references), then the site in strict mode (site/).
docs: install
	$(BIN)/python tools/docs.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# The quick loop: every test that starts no service (no Prefect harness, no Ray, no `unirl serve`), without the lint.
test-fast: install
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not slow"

# The whole pipeline on this machine's CPU: synthetic data -> ingest -> precache -> warm-up -> RL rounds.
demo: install
	$(BIN)/unirl demo

# Prefect server + UI, MLflow server + UI and a worker on 127.0.0.1; Ctrl-C stops them.
serve: install
	$(BIN)/unirl serve

# The demo in a scratch workspace against both servers, then headless Chromium (Debian's chromium package) checks
# its pages show their data and link each other; screenshots in $UNIRL_HOME/ui-check/ (.unirl/ui-check/).
# UI_CHECK_ARGS: e.g. --served (a live `unirl serve`'s demo, nothing run), --break mlflow-run-charts (see it fail).
ui-check: install
	$(BIN)/python tools/ui_check.py $(UI_CHECK_ARGS)

# The GPU acceptance run (tools/gpu_check.py): GPU tests, a CUDA round resumed and repeated bitwise, SD3.5-medium and
# FLUX.1-dev steps vs the bare pipeline and `unirl plan`; reports in gpu-check/. Without CUDA every check is skipped and it exits 0.
GPU_CHECK_ARGS ?=
gpu-check: install
	$(BIN)/python tools/gpu_check.py $(GPU_CHECK_ARGS)

# Every wheel unirl needs on an offline target into wheelhouse/ (tools/wheelhouse.py, docs/offline-gpu-install.md):
# WHEELHOUSE_ARGS="--python-version 3.12 --platform manylinux_2_28_x86_64 --have base-packages.txt".
WHEELHOUSE_ARGS ?=
wheelhouse: install
	$(BIN)/python tools/wheelhouse.py --out wheelhouse $(WHEELHOUSE_ARGS)

# Removes the virtualenv and caches. Never the workspace (.unirl): it holds your runs, data and checkpoints.
clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
