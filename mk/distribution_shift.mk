# Distribution shift (issue 15 item 6, experiments/distribution_shift): the recall models pruned at 50% by DRRQR and
# Grad, calibrated on ptb, books or MQAR (3 draws each), each cell evaluated on wiki and ptb perplexity and MQAR
# accuracy. Runs what the tables shift and shift_mqar lack, renders paper_tables/out/<profile>/shift.md and
# figures/<profile>/shift.{png,pdf}, then prints the verdicts (tiny profile only: the experiment has no paper one).
.PHONY: shift
shift: setup
	$(RENDER)
	$(VENV)/bin/state-reduction verdicts distribution_shift --profile $(PROFILE)
# `make shift-mqar-seeds`: the recall half at 50% on every recurrent family's recall recipe, three pretraining seeds
# (text vs MQAR calibration, 3 draws each; tiny profile only), then its render and the verdicts.
.PHONY: shift-mqar-seeds
shift-mqar-seeds: setup
	$(VENV)/bin/state-reduction render shift_mqar_seeds --profile tiny --run --workers $(WORKERS)
	$(VENV)/bin/state-reduction verdicts distribution_shift --profile tiny
# `make shift-mqar-mamba2-confirm`: the same on the Mamba-2 recall recipe's five new pretraining seeds (3-7, the
# confirmation set of its claims; tiny profile only), then its render and the verdicts.
.PHONY: shift-mqar-mamba2-confirm
shift-mqar-mamba2-confirm: setup
	$(VENV)/bin/state-reduction render shift_mqar_mamba2_confirm --profile tiny --run --workers $(WORKERS)
	$(VENV)/bin/state-reduction verdicts distribution_shift --profile tiny
