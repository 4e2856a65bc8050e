# Long-context retrieval after RFT (experiments/long_context: Table 4, GDN vs the Qwen3.5 hybrid at 50%; Table 11,
# Gated DeltaNet at 20/30/50% with DRRQR and Grad): run what is missing (baseline, prune, RFT, the long-context
# suite: tiny_longctx on the tiny profile, RULER/SQuAD/SWDE through lm-eval on the paper profile), then render.
# (`make table4`, `make table11`: the generic table rule of the top-level Makefile)
