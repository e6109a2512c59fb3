# The README's two commands: `make demo` (the main job) and `make test` (the whole suite).
# `make check` is a contributor's loop after every edit: lint and the tests that start nothing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# The side panel: its sources rebuild the package; ui-tests holds the real-browser test.
PANEL_SRC := labextension/package.json labextension/yarn.lock $(wildcard labextension/src/*.ts labextension/style/*)
UI_STAMP  := labextension/ui-tests/node_modules/.installed-stamp
JLPM      := PATH="$(CURDIR)/$(BIN):$$PATH" $(CURDIR)/$(BIN)/jlpm
CHROMIUM  := /usr/bin/chromium
# The wheel binder/postBuild's check installs (tests/package/test_binder.py).
VERSION   := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
WHEEL     := dist/jupyter_trainfactory-$(VERSION)-py3-none-any.whl
WHEEL_SRC := $(shell find jupyter_trainfactory ray_backend jupyter-config -type f -not -path '*/__pycache__/*' 2>/dev/null)

.PHONY: install demo test check lint lab clean

# torch first, pinned: the CPU build on local disk (an unpinned torch pulls a CUDA build).
# The editable install builds the side panel with Node and jlpm (hatch-jupyter-builder).
# rfc3987-syntax (an optional IRI format checker of jsonschema's format-nongpl extra, which
# jupyter-events asks for) builds ~35 Earley parsers at import: 3 s of CPU in every process
# that imports ray, each job's nine or so (python-jsonschema/jsonschema#1428). No schema
# here or in Jupyter uses the iri formats; without it jsonschema skips them.
$(STAMP): pyproject.toml $(PANEL_SRC)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e ".[test]"
	$(BIN)/python -m pip uninstall --quiet -y rfc3987-syntax
	touch $(STAMP)

# The browser test: Galata/Playwright without Playwright's own browsers, and Debian's chromium.
$(UI_STAMP): labextension/ui-tests/package.json labextension/ui-tests/yarn.lock | $(STAMP)
	cd labextension/ui-tests && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 $(JLPM) install
	touch $@

$(CHROMIUM):
	apt-get update && apt-get install -y chromium

install: $(STAMP) $(UI_STAMP) $(CHROMIUM)

# Built from the tree the editable install already built the side panel into: the
# package's skip-if-exists keeps jlpm from running a second time.
$(WHEEL): $(STAMP) $(WHEEL_SRC)
	rm -f dist/jupyter_trainfactory-*.whl
	$(BIN)/python -m pip wheel --quiet --no-deps -w dist .

demo: $(STAMP)
	$(BIN)/python examples/run_notebook.py examples/quickstart.ipynb
	$(BIN)/python examples/run_notebook.py examples/tiny_gpt.ipynb
	@echo "The local Ray head and MLflow server keep running; stop them with: $(BIN)/jupyter trainfactory services stop"

LINTED := jupyter_trainfactory ray_backend tests examples benchmarks
lint: $(STAMP)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	cd labextension && $(JLPM) lint:check

# The tiers (tests/README.md): tests/unit starts nothing and runs on every CPU (pytest-xdist);
# tests/package, tests/jobs and tests/browser share one Ray head and MLflow server, in turn.
PYTEST := PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 $(BIN)/python -m pytest
check: lint
	cd labextension && $(JLPM) test --silent
	$(PYTEST) tests/unit -n auto -q --durations=10

test: install lint $(WHEEL)
	cd labextension && $(JLPM) test
	$(PYTEST) tests/unit -n auto -q --durations=10
	$(PYTEST) tests/package tests/jobs tests/browser

# LAB_ARGS: more JupyterLab options, e.g. LAB_ARGS="--no-browser --ip 0.0.0.0 --port 8888"
# on a remote or headless machine.
LAB_ARGS ?=
lab: install
	$(BIN)/jupyter lab examples $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

clean:
	rm -rf $(VENV) dist .pytest_cache .ruff_cache examples/*.out.ipynb
	rm -rf labextension/node_modules labextension/ui-tests/node_modules labextension/lib \
		labextension/tsconfig.tsbuildinfo labextension/ui-tests/test-results jupyter_trainfactory/labextension
