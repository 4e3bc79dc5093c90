# `make train` runs the embedded default training; `make test` runs the suite. Both create or reuse .venv.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ARGS ?=

export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.cache/torch_extensions
export MUJOCO_GL ?= egl
export RAY_AUTH_MODE ?= disabled
export PYTHONUNBUFFERED := 1

.PHONY: install train test lint clean

$(PY):
	python3 -m venv $(VENV)

$(STAMP): $(PY) setup.py constraints.txt
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

train: $(STAMP)
	$(PY) launch/train.py $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check src launch tests benchmarks

clean:
	rm -rf $(VENV) .cache
