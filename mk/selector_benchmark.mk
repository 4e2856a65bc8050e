# Selector benchmark (experiments/selector_benchmark, issue 19): runs what table selector_bar lacks (ours vs DRRQR vs
# Grad x 4 tiny families x 50/75% x 3 calibration seeds, pre-RFT, tiny_wiki), then renders its table and the
# increase-by-selector figure. `make selector-benchmark-all` does the same for the whole benchmark: every selector
# pre- and post-RFT with the dense+RFT control (selector_benchmark), GHOST on the three families with a decay
# (selector_benchmark_ghost), every selector's recall on the recall models (selector_recall, selector_recall_ghost; on three pretraining seeds
# per recurrent family: selector_recall_seeds(_ghost)), the
# same pruned and post-RFT models on the second held-out corpus (selector_benchmark_books, selector_benchmark_ghost_books),
# the post-RFT claims' tables (selector_bar_rft(_books), selector_rank_rft(_books): subsets of the above, nothing more to run), then the
# verdicts, and the selection cost of every selector and family (`bench selectors`, only when its result file is
# missing).
.PHONY: selector-benchmark selector-benchmark-all
SELECTOR_COST := results/$(PROFILE)/selector_benchmark/selector_cost.json
selector-benchmark: setup
	$(VENV)/bin/state-reduction render selector_bar --profile $(PROFILE) --run
selector-benchmark-all: setup
	$(VENV)/bin/state-reduction render selector_benchmark --profile $(PROFILE) --run --workers 2
	$(VENV)/bin/state-reduction render selector_benchmark_ghost --profile $(PROFILE) --run --workers 2
	$(VENV)/bin/state-reduction render selector_recall --profile $(PROFILE) --run --workers 2
	$(VENV)/bin/state-reduction render selector_recall_ghost --profile $(PROFILE) --run --workers 2
	$(VENV)/bin/state-reduction render selector_recall_seeds --profile $(PROFILE) --run --workers 2
	$(VENV)/bin/state-reduction render selector_recall_seeds_ghost --profile $(PROFILE) --run --workers 2
	$(VENV)/bin/state-reduction render selector_benchmark_books --profile $(PROFILE) --run --workers 2
	$(VENV)/bin/state-reduction render selector_benchmark_ghost_books --profile $(PROFILE) --run --workers 2
	$(VENV)/bin/state-reduction render selector_bar_rft --profile $(PROFILE) --run --workers 2
	$(VENV)/bin/state-reduction render selector_bar_rft_books --profile $(PROFILE) --run --workers 2
	$(VENV)/bin/state-reduction render selector_rank_rft --profile $(PROFILE) --run --workers 2
	$(VENV)/bin/state-reduction render selector_rank_rft_books --profile $(PROFILE) --run --workers 2
	test -f $(SELECTOR_COST) || $(VENV)/bin/state-reduction bench selectors --profile $(PROFILE) --out $(SELECTOR_COST) \
		--markdown paper_tables/out/$(PROFILE)/selector_cost.md
	$(VENV)/bin/state-reduction verdicts selector_benchmark --profile $(PROFILE)
# `make selector-recall-seeds`: every selector's recall on each recurrent family's recall recipe, three pretraining seeds
# x three calibration seeds (selector_recall_seeds, and GHOST on the two with a decay; tiny profile only), then the
# verdicts.
.PHONY: selector-recall-seeds
selector-recall-seeds: setup
	$(VENV)/bin/state-reduction render selector_recall_seeds --profile tiny --run --workers $(WORKERS)
	$(VENV)/bin/state-reduction render selector_recall_seeds_ghost --profile tiny --run --workers $(WORKERS)
	$(VENV)/bin/state-reduction verdicts selector_benchmark --profile tiny
# `make selector-bar-rft`: the bar after RFT with the recovery recipe (ours, DRRQR, Grad x 4 families x 2 ratios x 3
# seeds, their RFT runs and the dense+RFT controls), on wiki and books, then the verdicts (59:37 on 2 cores from empty)
.PHONY: selector-bar-rft
selector-bar-rft: setup
	$(VENV)/bin/state-reduction render selector_bar_rft --profile $(PROFILE) --run --workers $(WORKERS)
	$(VENV)/bin/state-reduction render selector_bar_rft_books --profile $(PROFILE) --run --workers $(WORKERS)
	$(VENV)/bin/state-reduction verdicts selector_benchmark --profile $(PROFILE)
# `make selector-rank-rft`: the paper's post-RFT ranking, DRRQR against Rand, L1 and S-Wanda after RFT with the recovery
# recipe (4 families x 2 ratios x 3 seeds, the dense+RFT controls), on wiki and books, then the verdicts
.PHONY: selector-rank-rft
selector-rank-rft: setup
	$(VENV)/bin/state-reduction render selector_rank_rft --profile $(PROFILE) --run --workers $(WORKERS)
	$(VENV)/bin/state-reduction render selector_rank_rft_books --profile $(PROFILE) --run --workers $(WORKERS)
	$(VENV)/bin/state-reduction verdicts selector_benchmark --profile $(PROFILE)
