# Two entry points: `make demo` (set up, run the main job) and `make test` (set up, run the tests).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# CPU build of torch (a plain `torch` requirement would pull a multi-GB CUDA build).
TORCH ?= torch==2.13.0

.PHONY: setup demo test bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e '.[test]'
	touch $@

demo: setup
	$(PY) examples/quickstart.py

test: setup
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
