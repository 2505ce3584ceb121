# The two commands a newcomer needs: `make demo` (see it work) and `make test` (what CI runs).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The test and development environment, exactly: every package pinned with its hashes, resolved
# by uv from pyproject.toml's `dev` extra. Refreshed on purpose by `make lock`, never by a release.
LOCK   := requirements/dev.txt
UV_VERSION := 0.13.9

.PHONY: venv lock system-deps e2e-deps lint test test-release test-unit test-integration test-e2e release-checks \
	test-fast test-floor test-beside-official test-newest demo clean

$(BIN)/uv:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

# The locked environment (exactly the lock, nothing else), then the package itself, editable.
venv: $(BIN)/uv
	$(BIN)/uv pip sync --quiet --python $(BIN)/python --require-hashes $(LOCK)
	$(BIN)/uv pip install --quiet --python $(BIN)/python --no-deps -e .

# Re-resolve the lock from pyproject.toml's ranges (newest releases), for every Python the package
# supports. Review the diff like code: it is what every test run installs from then on.
lock: $(BIN)/uv
	$(BIN)/uv pip compile --quiet pyproject.toml --extra dev --universal --python-version 3.10 \
	  --generate-hashes --no-emit-package airflow-deferrable-kit --upgrade -o $(LOCK)

# PostgreSQL server binaries for the throw-away test cluster (Debian/Ubuntu, as root).
system-deps:
	bash scripts/install-system-deps.sh
# ... and Chromium, which the e2e tier's browser test drives.
e2e-deps:
	bash scripts/install-system-deps.sh chromium

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Lint and the release checks, then the tiers in order, stopping at the first that fails:
# unit (nothing running) -> integration (real services) -> e2e (a real Airflow).
test: e2e-deps lint release-checks
	$(MAKE) --no-print-directory test-unit
	$(MAKE) --no-print-directory test-integration
	$(MAKE) --no-print-directory test-e2e

test-release: venv
	bash scripts/test-tier.sh release
test-unit: venv
	bash scripts/test-tier.sh unit
test-integration: venv system-deps
	bash scripts/test-tier.sh integration
test-e2e: venv e2e-deps
	bash scripts/test-tier.sh e2e

# The release tier (layout, packaging, docs, compose) beside the floor and beside-official checks
# (each installs into venvs of its own), on one wheel built as a release would be (the sdist, then
# the wheel from it) before any starts.
release-checks: venv
	rm -rf .dist-check && $(BIN)/uv build --quiet --out-dir .dist-check .
	KIT_DIST=$(CURDIR)/.dist-check $(MAKE) --no-print-directory -j3 --output-sync=target \
	  test-release test-floor test-beside-official
	rm -rf .dist-check

# The lowest apache-airflow in pyproject.toml, proven: the built wheel installed next to exactly that
# version in a throw-away venv, every sensor and trigger imported, the unit tier run there.
test-floor: venv
	bash scripts/check-airflow-floor.sh

# The kit with every extra installed beside the official providers (amazon, http, apache-kafka,
# standard, common-sql, postgres), in either order, on the floor and on 3.3.2: `pip check` clean.
test-beside-official: venv
	bash scripts/check-beside-official.sh

# The unit and integration tiers while developing: no real Airflow.
test-fast: venv system-deps
	bash scripts/test-tier.sh unit
	bash scripts/test-tier.sh integration

# Drift found on purpose, not by surprise (not part of CI): the unit and integration tiers in a
# venv of the newest releases pyproject.toml allows, ignoring the lock.
test-newest: $(BIN)/uv system-deps
	$(BIN)/uv venv --quiet --python $(BIN)/python .venv-newest
	$(BIN)/uv pip install --quiet --python .venv-newest/bin/python --upgrade -e ".[dev]"
	PYTEST=.venv-newest/bin/pytest bash scripts/test-tier.sh unit
	PYTEST=.venv-newest/bin/pytest bash scripts/test-tier.sh integration

# Runs the showcase DAG on a real Airflow against local services and prints what each wait cost.
# `make demo ARGS=--keep` leaves Airflow up afterwards (until Ctrl-C) to browse and audit the run.
demo: system-deps venv
	$(BIN)/python scripts/demo.py $(ARGS)

clean:
	rm -rf $(VENV) .venv-newest .mypy_cache .ruff_cache .pytest_cache .dist-check .test-reports
