# Two commands on a fresh machine: `make table20` and `make test`. Each sets itself up.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch lies on these machines' disk; any other spec pulls a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
PROFILE ?= tiny
PYTEST_ARGS ?=
LM_TABLES := table1 table20 table21 table22 table23 table24

.PHONY: setup test $(LM_TABLES) tiny-models tokenizer clean-venv help

help:
	@echo "make table20   Table 20 (profile $(PROFILE)) as LaTeX and plots; also table1, table21 ... table24"
	@echo "make test      the test suite (CPU)"
	@echo "make setup     create $(VENV) and install the project (idempotent)"

setup: $(VENV)/.installed

# Re-installs only when the project metadata changes.
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH_SPEC)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

test: setup
	$(PY) -m pytest -q $(PYTEST_ARGS)

tokenizer: setup
	$(VENV)/bin/state-reduction train-tokenizer

# Resumable: rerunning after an interruption continues from the last saved step.
tiny-models: setup
	$(VENV)/bin/state-reduction pretrain experiments/tiny_models/configs/*.yaml

# The language-modelling tables of experiments/deltanet_gdn: each runs what is missing (dense baseline,
# prune with the five methods, evaluate pre-RFT, RFT, evaluate post-RFT), then renders LaTeX, Markdown,
# the comparison with the paper and the figure. A second run reruns nothing.
$(LM_TABLES): setup
	$(VENV)/bin/state-reduction run-table $@ --profile $(PROFILE)
	$(PY) paper_tables/$@.py --profile $(PROFILE)

clean-venv:
	rm -rf $(VENV)
