# PCA vs shared convolutions (paper appendix C.6, Tables 14 and 15; experiments/pca_vs_shared_conv): each target
# runs what its table is missing (Table 14: the three dense variants with the zero-shot suite; Table 15: pca-adv,
# pca and grad at 75/50% on the non-shared and the per-head-shared DeltaNet, perplexity only), then renders it.
# (`make table14`, `make table15`: the generic table rule of the top-level Makefile)
