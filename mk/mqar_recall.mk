# Recall under state reduction (experiments/mqar_recall): the tiny recall models (text + MQAR) pruned at 50% and
# 75% with every selector, three calibration seeds, scored by the tiny_mqar suite; runs what is missing, then renders
# the figures (per family and per model) and their numbers. `make recall-models` (re)trains the recall models
# (resumable; ~15-20 min each on one free core).
.PHONY: figure-mqar recall-models
# A recall model is a pretraining config with an `mqar:` section, whatever its recipe's name.
recall-models: setup
	$(VENV)/bin/state-reduction pretrain $(sort $(shell grep -l '^mqar:' experiments/tiny_models/configs/*.yaml))

# figure_mqar (the generic figure rule) runs both tables of the experiment (figure_mqar, mqar_seeds), then renders
figure-mqar: figure_mqar
# `make mqar-mamba2-confirm`: DRRQR and Rand at 50/75% on the Mamba-2 recall recipe's five new pretraining seeds (3-7,
# the confirmation set of its claims), three calibration seeds each (tiny profile only), then the verdicts.
.PHONY: mqar-mamba2-confirm
mqar-mamba2-confirm: setup
	$(VENV)/bin/state-reduction run-table mqar_mamba2_confirm --profile tiny --workers $(WORKERS)
	$(VENV)/bin/state-reduction verdicts mqar_recall --profile tiny
