# wandb mirror of the result files (state_reduction.tracking): offline runs in results/$(PROFILE)/wandb/.
#   make wandb-sync        mirror the results that have no run yet, then upload the offline runs (wandb login first)
#   make wandb-dashboard   create the dashboard (workspace) in wandb, online; WANDB_ENTITY=<user or team>
#   make dashboard         the static, offline HTML dashboard (top-level Makefile)
.PHONY: wandb-sync wandb-dashboard
wandb-sync: setup
	$(VENV)/bin/state-reduction wandb sync --profile $(PROFILE)

wandb-dashboard: setup
	$(VENV)/bin/state-reduction wandb workspace $(if $(WANDB_ENTITY),--entity $(WANDB_ENTITY))
