"""MQAR recall by distance: accuracy per (pairs, gap) for a dense recall model and its reductions.

At a fixed context length the tiny_mqar suite's pair count also sets how far the queries sit from their pairs: an
MQAR sequence is the pairs (2 x pairs tokens), then `gap = length - 4 x pairs` noise tokens, then the queries
(state_reduction.data.mqar). At 32 tokens, 2 pairs have 24 noise tokens before their queries and 8 pairs none, so
the suite's 2-pair cell measures retention over distance as well as capacity. This probe separates the two: it
prunes the model with each method (calibrated as experiments/mqar_recall: 64 ptb windows of 32 tokens) and scores
fresh MQAR sequences at each (pairs, gap), every cell at least --queries queries (one binomial SE <= 1 point at 2500).

    python scripts/mqar_gap_probe.py experiments/tiny_models/checkpoints/gated_deltanet_lr1e3_s2 \\
        --methods l1 drrqr --ratio 0.5 --out results/tiny/mqar_gap_probe/gated_deltanet_lr1e3_s2.json

Prints a Markdown table; --out writes it as a result (kind analyze, with provenance).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from state_reduction.backend import install_cpu_backend
from state_reduction.data.mqar import mqar_sequences
from state_reduction.evaluation.mqar import MIN_QUERIES, mqar_query_hits
from state_reduction.evaluation.run import load_causal_lm
from state_reduction.pipeline import load_experiment
from state_reduction.pruning.prune import PruneConfig, prune
from state_reduction.results import build_result, write_result

SEED = 1234  # of the probe's MQAR sequences (not the suite's)


def accuracy_grid(model, pairs: list[int], gaps: list[int], queries: int, by_query: bool = False) -> dict[str, float]:
    """Recall (%) per cell `p{pairs}_gap{gap}`, each on its own seeded set of ceil(queries / pairs) sequences; with
    `by_query`, also per query position `p{pairs}_gap{gap}_q{i}` (i = 1 the first query after the gap, over the
    cell's sequences)."""
    out = {}
    for p in pairs:
        for g in gaps:
            n = -(-queries // p)
            ids, labels = mqar_sequences(n, 4 * p + g, p, SEED + 1000 * p + g)
            hits = mqar_query_hits(model, ids, labels, batch_size=64)
            out[f"p{p}_gap{g}"] = 100.0 * int(hits.sum()) / hits.numel()
            if by_query:  # hits are sequence-major: each sequence's queries in order
                per_query = hits.view(n, p).sum(0)
                out.update({f"p{p}_gap{g}_q{i + 1}": 100.0 * int(c) / n for i, c in enumerate(per_query)})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a dense recall checkpoint (experiments/tiny_models/checkpoints/...)")
    ap.add_argument("--methods", nargs="+", default=["l1", "drrqr"])
    ap.add_argument("--ratio", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0, help="calibration seed")
    ap.add_argument("--pairs", nargs="+", type=int, default=[2, 8])
    ap.add_argument("--gaps", nargs="+", type=int, default=[0, 8, 16, 24])
    ap.add_argument("--queries", type=int, default=MIN_QUERIES)
    ap.add_argument("--by-query", action="store_true",
                    help="also recall per query position (q1 = the first query after the gap)")
    ap.add_argument("--out", type=Path, default=None, help="write the grid as a result JSON here")
    args = ap.parse_args(argv)
    if not (Path(args.model) / "config.json").is_file():
        print(f"mqar_gap_probe: {args.model} is not a checkpoint folder (no config.json)", file=sys.stderr)
        return 2
    if min(args.gaps) < 0 or min(args.pairs) < 1:
        print(f"mqar_gap_probe: gaps must be >= 0 and pairs >= 1, got {args.gaps} / {args.pairs}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    install_cpu_backend()
    t0 = time.time()
    # calibrated as the sweep of experiments/mqar_recall calibrates the recall models (its tiny profile's prune settings)
    sweep = load_experiment("mqar_recall")["profiles"]["tiny"]["prune"]
    calibration = {k: sweep[k] for k in ("calib", "n_calib", "seq_len")}
    grids = {"dense": accuracy_grid(load_causal_lm(args.model)[0], args.pairs, args.gaps, args.queries, args.by_query)}
    with tempfile.TemporaryDirectory() as tmp:
        for method in args.methods:
            out = Path(tmp) / method
            prune(PruneConfig(model=args.model, method=method, ratio=args.ratio, out=str(out), **calibration,
                              seed=args.seed))
            grids[method] = accuracy_grid(load_causal_lm(str(out))[0], args.pairs, args.gaps, args.queries,
                                          args.by_query)
    cells = list(grids["dense"])
    print(f"| {Path(args.model).name} | " + " | ".join(c.replace("_", " ") for c in cells) + " |")
    print("| --- |" + " ---: |" * len(cells))
    for name, grid in grids.items():
        label = name if name == "dense" else f"{name} {round(args.ratio * 100)}%"
        print(f"| {label} | " + " | ".join(f"{grid[c]:.1f}" for c in cells) + " |")
    if args.out is not None:
        config = {"model": args.model, "methods": args.methods, "ratio": args.ratio, "calib_seed": args.seed,
                  "pairs": args.pairs, "gaps": args.gaps, "queries": args.queries, "mqar_seed": SEED,
                  "by_query": args.by_query}
        write_result(args.out, build_result("analyze", profile="tiny", experiment="mqar_recall", config=config,
                                            metrics={f"{m}_{c}": v for m, g in grids.items() for c, v in g.items()},
                                            wall_time_s=time.time() - t0))
        print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
