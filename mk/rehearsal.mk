# Rehearsal of the paper profile at the paper's exact widths (experiments/rehearsal, issue 22): random-init models
# from the committed configs, every stage (prune with every selector at 50% and 75%, all at once and layer-streamed;
# reload; RFT; evaluate; speed), wall time and heap peak per stage against memory-plan. Each model runs only when its
# result file is missing; then the summary tables are rendered into experiments/rehearsal/README.md from the results.
# Qwen3.5 9B (~14 GiB on a CPU: its bf16 embedding and head alone are 3.8 GiB) is not in the default list; run as in
# the README: state-reduction rehearse qwen3_5-9b --layers 2 --first-layer 2 --ratios 0.5 --only-streamed
REHEARSAL_MODELS ?= deltanet-1.3b gated_deltanet-1.3b
# also: make rehearsal REHEARSAL_MODELS="deltanet-370m gated_deltanet-370m codestral-7b"
REHEARSAL_LAYERS ?= 2
REHEARSAL_DEVICE = $(shell $(PY) -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')" 2>/dev/null)
.PHONY: rehearsal
rehearsal: setup
	@for m in $(REHEARSAL_MODELS); do \
	  test -f results/paper/rehearsal/rehearsal-$$m-L$(REHEARSAL_LAYERS)-$(REHEARSAL_DEVICE).json || \
	    OMP_NUM_THREADS=1 $(VENV)/bin/state-reduction rehearse $$m --layers $(REHEARSAL_LAYERS) \
	      --out runs/rehearsal/$$m || exit $$?; \
	done
	$(PY) -c "from state_reduction.rehearsal import README, write_readme; write_readme(README)"
	@echo "rehearsal: results/paper/rehearsal/; tables in experiments/rehearsal/README.md"
