# The two commands a newcomer needs: `make demo` (see it work) and `make test` (what CI runs).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: venv system-deps lint test release-checks test-fast test-floor test-beside-official demo clean

$(BIN)/uv:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check uv

# Installs the package with every extra and the test/dev tools, from pyproject.toml only.
venv: $(BIN)/uv
	$(BIN)/uv pip install --quiet --python $(BIN)/python -e ".[dev]"

# PostgreSQL server binaries for the throw-away test cluster (Debian/Ubuntu, as root).
system-deps:
	bash scripts/install-system-deps.sh

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Unit, integration (real S3 API, HTTP, PostgreSQL, Kafka-protocol broker) and end-to-end
# (a real Airflow scheduler + triggerer) tests. Services start and stop by themselves.
test: system-deps lint release-checks
	$(BIN)/pytest -q -p no:cacheprovider --durations=40 tests

# The floor and beside-official checks side by side (each installs into venvs of its own), on one
# wheel built as a release would be (the sdist, then the wheel from it) before either starts.
release-checks: venv
	rm -rf .dist-check && $(BIN)/uv build --quiet --out-dir .dist-check .
	KIT_DIST=$(CURDIR)/.dist-check $(MAKE) --no-print-directory -j2 --output-sync=target test-floor test-beside-official
	rm -rf .dist-check

# The lowest apache-airflow in pyproject.toml, proven: the built wheel installed next to exactly that
# version in a throw-away venv, every sensor and trigger imported, tests/core run (about a minute).
test-floor: venv
	bash scripts/check-airflow-floor.sh

# The kit with every extra installed beside the official providers (amazon, http, apache-kafka,
# standard, common-sql, postgres), in either order, on the floor and on 3.3.2: `pip check` clean.
test-beside-official: venv
	bash scripts/check-beside-official.sh

# Everything except the real-Airflow end-to-end tests, for a quicker loop while developing.
test-fast: venv
	$(BIN)/pytest -q -p no:cacheprovider -m "not e2e" tests

# Runs the showcase DAG on a real Airflow against local services and prints what each wait cost.
# `make demo ARGS=--keep` leaves Airflow up afterwards (until Ctrl-C) to browse and audit the run.
demo: system-deps venv
	$(BIN)/python scripts/demo.py $(ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .dist-check
