# Rationally linearized MLPs (issue 18; seed paper /work/shared/papers/rationally_linearized_mlps.md).
#   make ralimp-synthetic [PROFILE=tiny|paper]   seed section 3.1 / App. D.1 (experiments/ralimp_synthetic): runs the
#       missing (activation x method x budget x seed) fits, renders the table (LaTeX + Markdown), the Figure-2-like
#       plot, the budget sweep, the comparison with the seed and the generated verdicts. PROFILE=paper is the seed's
#       full protocol (10 seeds x 3000 full-batch steps). RALIMP_WORKERS=2 runs two processes.
.PHONY: ralimp-synthetic
RALIMP_WORKERS ?= 1
ralimp-synthetic: setup
	@pids=""; for i in $$(seq 0 $$(($(RALIMP_WORKERS) - 1))); do \
	  $(PY) -m state_reduction.ralimp.benchmark --profile $(PROFILE) --worker $$i/$(RALIMP_WORKERS) & pids="$$pids $$!"; \
	done; rc=0; for p in $$pids; do wait $$p || rc=1; done; exit $$rc
	$(VENV)/bin/state-reduction render ralimp_synthetic --profile $(PROFILE)
	$(VENV)/bin/state-reduction verdicts ralimp_synthetic --profile $(PROFILE) --write
