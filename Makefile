# Two commands on a fresh machine: `make table20` and `make test`. Each sets itself up.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch lies on these machines' disk; any other spec pulls a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
PROFILE ?= tiny
PYTEST_ARGS ?=
# make test runs the suite in this many pytest-xdist worker processes, one torch thread each (0: one process, in order).
PYTEST_WORKERS ?= 2
SEEDS ?=

.PHONY: setup test test-fast tiny-models tokenizer clean-venv help

help:
	@echo "make table20   Table 20 (profile $(PROFILE)) as LaTeX and plots; also table1, table21 ... table24"
	@echo "make table13   Table 13, Qwen3.5 pre-RFT (experiments/qwen3_5); also table12; Mamba-2: table3, table8 ... table10"
	@echo "make table16   Table 16, K+Q vs K vs Q selection (experiments/coupled_selection); table2, table7: calibration sensitivity"
	@echo "make table17   Table 17, decode speed (tiny profile: CPU benchmarks); also table18, table19, figure4"
	@echo "make figures   Figures 2-7 (rank analysis, speed); table4, table11: long context; table14, table15: PCA vs shared conv"
	@echo "make submit    Slurm job array of an experiment (EXP=..., PROFILE=...); make status; make wandb-sync"
	@echo "make test      the test suite (CPU, PYTEST_WORKERS=2 processes); make test-fast: without the slow tests"
	@echo "make setup     create $(VENV) and install the project (idempotent)"

setup: $(VENV)/.installed

# Re-installs only when the project metadata changes.
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH_SPEC)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

PYTEST = OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(PYTEST_WORKERS)
test: setup
	$(PYTEST) $(PYTEST_ARGS)

# Without the tests marked slow (each over a minute on two cores): the inner loop while developing.
test-fast: setup
	$(PYTEST) -m "not slow" $(PYTEST_ARGS)

tokenizer: setup
	$(VENV)/bin/state-reduction train-tokenizer

# Resumable: rerunning after an interruption continues from the last saved step.
tiny-models: setup
	$(VENV)/bin/state-reduction pretrain experiments/tiny_models/configs/*.yaml

# Every paper table and figure (`make table20`, `make figure2`, ...): one rule. The experiment whose config.yaml
# declares the table runs what its results lack (`state-reduction render TABLE --run`: run-table, i.e. dense
# baseline, prune, evaluate pre-RFT, RFT, evaluate post-RFT; run-analysis for the rank analysis), then the table is
# rendered from result files only: LaTeX, Markdown, the comparison with the paper, the figure. A second run
# reruns nothing. `state-reduction run-table TABLE --profile paper --dry-run` prints the plan without running it.
# SEEDS="0 1 2": replicate seeds (calibration draw + RFT run each); the LM tables then show mean ± 95% CI.
# Speed tables (17-19, figure 4) have their bench results as prerequisites below.
# WORKERS: processes that run a table's tasks (each model's baseline, each cell's stages) side by side; 2 on the tiny
# profile (two cores, one torch thread each), 1 on the paper profile (one GPU; clusters use make submit).
WORKERS ?= $(if $(filter tiny,$(PROFILE)),2,1)
RENDER = $(VENV)/bin/state-reduction render $@ --profile $(PROFILE) --run --workers $(WORKERS) $(if $(SEEDS),--seeds $(SEEDS))
table%: setup
	$(RENDER)
figure%: setup
	$(RENDER)

clean-venv:
	rm -rf $(VENV)

# Speed (paper G.1, Tables 17-19, Figure 4). Tiny profile: CPU benchmarks (torch references, 1 thread) run only
# when their result file is missing, then the renderers. Paper profile: results come from a GPU machine
# (scripts/gpu_check.sh, or `state-reduction bench ... --device cuda --profile paper`).
SPEED_RESULTS := results/$(PROFILE)/speed
BENCH := $(VENV)/bin/state-reduction bench
TINY_CKPT := experiments/tiny_models/checkpoints

$(SPEED_RESULTS)/decode_%_cpu.json: | setup
	@test "$(PROFILE)" = tiny || { echo "$@ missing: paper-profile speed results are measured on a GPU (scripts/gpu_check.sh)"; exit 2; }
	$(BENCH) decode --model $(TINY_CKPT)/$* --batch-sizes 1 4 16 64 --prompt-len 512 --warmup 5 --steps 20 --repeats 5 --out $@
$(SPEED_RESULTS)/prefill_%_cpu.json: | setup
	@test "$(PROFILE)" = tiny || { echo "$@ missing: paper-profile speed results are measured on a GPU (scripts/gpu_check.sh)"; exit 2; }
	$(BENCH) prefill --model $(TINY_CKPT)/$* --grid 1x512 4x512 1x2k 4x2k --warmup 1 --steps 2 --repeats 3 --out $@
$(SPEED_RESULTS)/mixer_gdn_cpu.json: | setup
	@test "$(PROFILE)" = tiny || { echo "$@ missing: paper-profile speed results are measured on a GPU (scripts/gpu_check.sh)"; exit 2; }
	$(BENCH) mixer --batch-sizes 1 2 --seq-len 512 --warmup 1 --steps 1 --repeats 3 --out $@
$(SPEED_RESULTS)/recurrence_gdn_cpu.json: | setup
	@test "$(PROFILE)" = tiny || { echo "$@ missing: paper-profile speed results are measured on a GPU (scripts/gpu_check.sh)"; exit 2; }
	$(BENCH) recurrence --warmup 3 --steps 20 --repeats 5 --out $@

table17: $(SPEED_RESULTS)/decode_gated_deltanet_cpu.json $(SPEED_RESULTS)/decode_deltanet_cpu.json
table18: $(SPEED_RESULTS)/prefill_gated_deltanet_cpu.json $(SPEED_RESULTS)/prefill_deltanet_cpu.json
table19: $(SPEED_RESULTS)/mixer_gdn_cpu.json $(SPEED_RESULTS)/recurrence_gdn_cpu.json
figure4: $(SPEED_RESULTS)/decode_gated_deltanet_cpu.json $(SPEED_RESULTS)/prefill_gated_deltanet_cpu.json

# The generated verdict blocks of the experiment READMEs, decided from results (state_reduction/claims.py); on the
# default profile each experiment's own (`claims_profile:`: the rehearsal's results are the paper profile's).
.PHONY: verdicts
verdicts: setup
	$(VENV)/bin/state-reduction verdicts --write $(if $(filter tiny,$(PROFILE)),,--profile $(PROFILE))

# A static, offline HTML page of every result of the profile: results/$(PROFILE)/dashboard.html
.PHONY: dashboard
dashboard: setup
	$(PY) -m state_reduction.dashboard --profile $(PROFILE)

# Further targets live one file per study in mk/ (each experiment's own targets), included here.
include $(sort $(wildcard mk/*.mk))

# Every figure of the paper this project reproduces (Figure 4 from the speed benchmarks, Figures 2, 3, 5, 6, 7
# from experiments/rank_analysis); each runs what its results lack first.
.PHONY: figures
figures: figure2 figure3 figure4 figure5 figure6 figure7
