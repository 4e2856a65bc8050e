# The RFT budget sweep (experiments/rft, issue 15 item 4): DRRQR 50% and the dense+RFT control on tiny DeltaNet and
# Gated DeltaNet x 3 seeds x 8 RFT budgets (steps, lr, CE weight), books perplexity; runs what is missing (~55 min on 2
# cores from nothing), renders table and figure (the budget rule's pick in its last column), then the verdicts.
.PHONY: rft-budget
rft-budget: setup
	$(VENV)/bin/state-reduction render rft_budget --profile $(PROFILE) --run --workers 2
	$(VENV)/bin/state-reduction verdicts rft --profile $(PROFILE)
