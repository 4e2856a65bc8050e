# Rank analysis (experiments/rank_analysis): Figures 2, 3, 5, 6, 7, Tables 5, 6 and the channel overlap of appendix
# C.2. Each target prunes (and, for figure6/table5, fine-tunes) what is missing through the pipeline, runs the
# missing `analyze` results, then renders from result files only. A second run reruns nothing.
# `state-reduction run-analysis TARGET --profile paper --dry-run` prints the plan.
# (figure2 figure3 figure5 figure6 figure7 table5 table6 tableC2: the generic table/figure rule of the top-level
# Makefile, which runs `run-analysis` for this experiment)
