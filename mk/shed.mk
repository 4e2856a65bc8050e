# State vs structure (issue 16, experiments/state_vs_structure): key-channel state reduction (DRRQR, Grad) vs
# Mamba-Shedder mixer removal vs both, on the four tiny families at 50% of the state, pre-RFT (seeds 0-2) and
# post-RFT (seeds 0-1). Runs what is missing (baseline, prune/shed with costs and decode timing, tiny_ppl
# evaluation, RFT), then renders paper_tables/out/$(PROFILE)/state_vs_structure{,_vs_paper}.md and
# figures/$(PROFILE)/state_vs_structure_{state,decode}.{png,pdf}. A second call reruns nothing.
# `state-reduction run-table state_vs_structure --experiment state_vs_structure --profile paper --dry-run`: the plan.
.PHONY: state_vs_structure
state_vs_structure: setup
	$(RENDER)
