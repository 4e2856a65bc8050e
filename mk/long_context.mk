# Long-context retrieval after RFT (experiments/long_context: Table 4, GDN vs the Qwen3.5 hybrid at 50%; Table 11,
# Gated DeltaNet at 20/30/50% with DRRQR and Grad): run what is missing (baseline, prune, RFT, the long-context
# suite: tiny_longctx on the tiny profile, RULER/SQuAD/SWDE through lm-eval on the paper profile), then render.
# (`make table4`, `make table11`: the generic table rule of the top-level Makefile)
# `make recall-table4-seeds`: Table 4's recall cell (DRRQR 50% after RFT, the dense+RFT control, dense) on every
# family's recall recipe, three pretraining seeds x three calibration/RFT seeds (tiny profile only), then its render.
.PHONY: recall-table4-seeds
recall-table4-seeds: setup
	$(VENV)/bin/state-reduction render recall_table4_seeds --profile tiny --run --workers $(WORKERS)
# `make recall-table11-seeds`: Table 11's DRRQR sweep (20/30/50%) on the Gated DeltaNet recall recipe's three
# pretraining seeds, three calibration/RFT seeds each (tiny profile only), then its render.
.PHONY: recall-table11-seeds
recall-table11-seeds: setup
	$(VENV)/bin/state-reduction render recall_table11_seeds --profile tiny --run --workers $(WORKERS)
# `make recall-table4-mamba2-confirm`: Table 4's recall cell on the Mamba-2 recall recipe's five new pretraining seeds
# (3-7, the confirmation set of the Mamba-2 claims), three calibration/RFT seeds each (tiny profile only), its render.
.PHONY: recall-table4-mamba2-confirm
recall-table4-mamba2-confirm: setup
	$(VENV)/bin/state-reduction render recall_table4_mamba2_confirm --profile tiny --run --workers $(WORKERS)
