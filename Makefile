# Two entry points: `make demo` (set up, run the main job) and `make test` (set up, run the tests).
# pip is the install path (`pip install 'anchordiv[all]'`); these targets only add a venv, a CPU
# build of torch, and what the tests need beyond Python packages.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip -qq
# CPU build of torch (a plain `torch` requirement would pull a multi-GB CUDA build).
TORCH ?= torch==2.13.0
# The float-sensitive tests, rerun under a second SIMD level (generic kernels in torch and faiss).
SIMD_ENV := ATEN_CPU_CAPABILITY=default FAISS_OPT_LEVEL=generic FAISS_SIMD_LEVEL=NONE
CLIP_RETRIEVAL := $(VENV)/clip-retrieval

.PHONY: setup setup-demo demo test test-simd bench experiments clean

setup-demo: $(VENV)/.demo

# The demo's environment: no root, no browser, no network beyond PyPI.
$(VENV)/.demo: pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install $(TORCH)
	$(PIP) install -e '.[demo]'
	touch $@

setup: $(VENV)/.installed

# The tests' environment adds the test tools, a real Milvus server, Debian's Chromium for the
# browser tests (apt-get, as root) and the emoji pictures (npm packs) for the real-emoji test.
$(VENV)/.installed: $(VENV)/.demo
	$(PIP) install -e '.[test]'
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)
	command -v npm >/dev/null && $(PY) -m anchordiv.apps.emoji >/dev/null || echo "npm missing: emoji pictures not fetched"
	# clip-retrieval's own ClipClient for the clip-back tests, unpacked beside the venv: its
	# package pins numpy<2 and imports a server stack, so only its client module is loaded.
	rm -rf $(CLIP_RETRIEVAL) $(CLIP_RETRIEVAL)-wheel
	$(PIP) download --no-deps clip-retrieval==2.45.0 -d $(CLIP_RETRIEVAL)-wheel
	$(PY) -m zipfile -e $(CLIP_RETRIEVAL)-wheel/clip_retrieval-2.45.0-py3-none-any.whl $(CLIP_RETRIEVAL)
	touch $@

demo: setup-demo
	$(VENV)/bin/anchordiv demo

test: setup
	PYTHONPATH=$(CLIP_RETRIEVAL) $(PY) -m pytest -q

test-simd: setup
	$(SIMD_ENV) $(PY) -m pytest -q -m numeric

bench: setup
	$(PY) benchmarks/run.py

# The paper's experiments on offline data (docs/results/); needs Debian's wordnet-base.
experiments: setup
	$(PY) scripts/scene_demo.py
	$(PY) scripts/rotten_tomatoes.py
	$(PY) scripts/wordnet_adaptation.py
	$(PY) scripts/wordnet_adaptation.py --broad-root 00001740 --out docs/results/wordnet_adaptation_all_nouns
	$(PY) scripts/emoji_experiments.py

clean:
	rm -rf $(VENV) build dist *.egg-info src/*.egg-info
