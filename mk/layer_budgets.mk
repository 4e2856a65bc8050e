# Layer-adaptive key-dimension budgets (issue 17, experiments/layer_adaptive_budgets): runs what each table's results
# lack (dense baselines, prune with --budget uniform|global-aire|global-last, tiny_ppl evaluation, RFT where the
# table asks), renders paper_tables/out/<profile>/<table>.md and figures/<profile>/<table>_key_dims.{png,pdf}, then
# prints the verdicts. LAYER_BUDGET_TABLES defaults to what fits in ~40 min on the shared 2-core machine; the full grid
# is `make layer-budgets LAYER_BUDGET_TABLES="layer_budgets layer_budgets_rft"`.
LAYER_BUDGET_TABLES ?= layer_budgets_energy layer_budgets_drrqr
.PHONY: layer-budgets
layer-budgets: setup
	for t in $(LAYER_BUDGET_TABLES); do $(VENV)/bin/state-reduction render $$t --profile $(PROFILE) --run || exit 1; done
	$(VENV)/bin/state-reduction verdicts layer_adaptive_budgets --profile $(PROFILE)
