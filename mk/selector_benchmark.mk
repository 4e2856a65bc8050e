# Selector benchmark (experiments/selector_benchmark, issue 19): runs what table selector_bar lacks (ours vs DRRQR vs
# Grad x 4 tiny families x 50/75% x 3 calibration seeds, pre-RFT, tiny_ppl), then renders its table and the
# increase-by-selector figure. `make selector-benchmark-all` does the same for the whole selector grid.
.PHONY: selector-benchmark selector-benchmark-all
selector-benchmark: setup
	$(VENV)/bin/state-reduction render selector_bar --profile $(PROFILE) --run
selector-benchmark-all: setup
	$(VENV)/bin/state-reduction render selector_benchmark --profile $(PROFILE) --run
