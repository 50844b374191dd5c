# Two entry points: `make demo` (set up, run the main job) and `make test` (set up, run the tests).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# CPU build of torch (a plain `torch` requirement would pull a multi-GB CUDA build).
TORCH ?= torch==2.13.0
OPEN_CLIP ?= open_clip_torch==3.3.0 ftfy wcwidth torchvision==0.16.2 requests urllib3 charset-normalizer certifi

.PHONY: setup demo test bench experiments clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e '.[test]'
	# open_clip for the open_clip encoder path. It needs only torchvision's pure-Python
	# transforms, so a torchvision without compiled ops is installed beside the CPU torch.
	$(PIP) install -q --no-deps $(OPEN_CLIP)
	# Debian's Chromium for the browser tests of `anchordiv serve` (Playwright drives it).
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium)
	# Emoji pictures (npm packs of pinned emoji-datasource-google/-twitter, outside git) for
	# `anchordiv demo --images`, scripts/emoji_experiments.py and the real-emoji test.
	command -v npm >/dev/null && $(PY) -m anchordiv.emoji || echo "npm missing: emoji pictures not fetched"
	touch $@

demo: setup
	$(VENV)/bin/anchordiv demo

test: setup
	$(PY) -m pytest -q

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
	rm -rf $(VENV) build *.egg-info src/*.egg-info
