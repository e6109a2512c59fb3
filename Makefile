# The README's two commands: `make demo` (the main job) and `make test` (the whole suite).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: install demo test lint lab clean

# torch first, pinned: the CPU build on local disk (an unpinned torch pulls a CUDA build).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/python examples/run_notebook.py examples/quickstart.ipynb
	$(BIN)/python examples/run_notebook.py examples/tiny_gpt.ipynb
	@echo "The local Ray head and MLflow server keep running; stop them with: $(BIN)/jupyter trainfactory services stop"

lint: install
	$(BIN)/ruff check jupyter_trainfactory ray_backend tests examples benchmarks
	$(BIN)/ruff format --check jupyter_trainfactory ray_backend tests examples benchmarks

test: install lint
	$(BIN)/python -m pytest

lab: install
	$(BIN)/jupyter lab examples

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache examples/*.out.ipynb
