# Joint compression (issue 18 part 4, experiments/joint_compression): per group (the text models DeltaNet, Gated
# DeltaNet and the Qwen3.5-style hybrid, and `recall`: the three MQAR recall models; JOINT_GROUPS_TINY) the missing
# cells of its three tables joint_<group>_{state,mlp,both} (DRRQR alone, MLP linearization alone, both: reduce,
# RFT, evaluate), the groups in parallel processes (one thread each); then the tables, the Pareto and recall
# figures and the generated verdicts. Resumable: a rerun runs only what is missing.
#   make joint-compression [PROFILE=tiny]      (PROFILE=paper: the GDN 1.3B plan, joint_paper_*; --dry-run it first:
#   state-reduction run-table joint_paper_both --profile paper --dry-run)
# The `recall` group also runs, after its three tables (so that no two processes build the cells they share), the
# recall claims' cells on every family's recall recipe, three pretraining seeds: joint_recall_seeds_{state,mlp}
# (8:48 from empty on 2 cores with --workers 2, 2026-12-07).
JOINT_GROUPS_TINY ?= deltanet gated_deltanet qwen3_5 recall
JOINT_GROUPS = $(if $(filter paper,$(PROFILE)),paper,$(JOINT_GROUPS_TINY))
.PHONY: joint-compression
joint-compression: setup
	@pids=""; for f in $(JOINT_GROUPS); do \
	  ts="state mlp both"; [ $$f = recall ] && ts="$$ts seeds_state seeds_mlp"; \
	  ( for t in $$ts; do \
	      OMP_NUM_THREADS=1 $(VENV)/bin/state-reduction run-table joint_$${f}_$$t --profile $(PROFILE) || exit 1; \
	    done ) & pids="$$pids $$!"; \
	done; rc=0; for p in $$pids; do wait $$p || rc=1; done; exit $$rc
	$(VENV)/bin/state-reduction render joint_compression --profile $(PROFILE)
	$(VENV)/bin/state-reduction verdicts joint_compression --profile $(PROFILE) --write
