# AIRE-Prune / LAST in their home setting (issue #17, experiments/aire_home): trains the S5 ListOps models of the
# three training seeds where their committed checkpoints are missing, sweeps the five pruning methods over 0-95%
# of the states (cells already in results/ are skipped), renders the figures and the table, prints the verdicts.
.PHONY: aire-home
aire-home: setup
	OMP_NUM_THREADS=1 $(PY) -m state_reduction.ssm train
	OMP_NUM_THREADS=1 $(PY) -m state_reduction.ssm sweep --profile $(PROFILE)
	$(PY) -m state_reduction.ssm render --profile $(PROFILE)
	$(VENV)/bin/state-reduction verdicts aire_home --profile $(PROFILE)
