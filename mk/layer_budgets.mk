# Layer-adaptive key-dimension budgets (issue 17, experiments/layer_adaptive_budgets): runs what each table's results
# lack (dense baselines, prune with --budget uniform|global-aire|global-last, tiny_ppl evaluation, RFT where the
# table asks), renders paper_tables/out/<profile>/<table>.md and figures/<profile>/<table>_key_dims.{png,pdf}, then
# prints the verdicts. LAYER_BUDGET_TABLES defaults to the full grid (about 47 min on 2 cores at load 2-8, README "What ran");
# `make layer-budgets LAYER_BUDGET_TABLES=layer_budgets_energy` is a 24-cell subset.
LAYER_BUDGET_TABLES ?= layer_budgets layer_budgets_rft
.PHONY: layer-budgets
layer-budgets: setup
	for t in $(LAYER_BUDGET_TABLES); do $(VENV)/bin/state-reduction render $$t --profile $(PROFILE) --run || exit 1; done
	$(VENV)/bin/state-reduction verdicts layer_adaptive_budgets --profile $(PROFILE)
