"""`state-reduction analyze MODEL [--selection PRUNED] [--compare OTHER] --out FILE`, and
`state-reduction run-analysis TABLE`: the analyses behind a rank-analysis figure or table (experiments/rank_analysis)."""

from __future__ import annotations

import json

import torch

from state_reduction.analysis.analyze import AnalyzeConfig, analyze
from state_reduction.analysis.experiment import plan_analyses, run_analyses
from state_reduction.analysis.rank import DIVISORS
from state_reduction.options import length_int, positive_int
from state_reduction.results import check_result_path, write_result


def _cmd_analyze(args) -> int:
    check_result_path(args.out)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = AnalyzeConfig(model=args.model, selection=args.selection, compare=args.compare,
                        selection_model=args.selection_model, calib=args.calib, stream=args.stream,
                        n_calib=args.n_calib, seq_len=args.seq_len, seed=args.seed, stride=args.stride,
                        divisor=args.divisor, ignore_decay=args.ignore_decay, batch_size=args.batch_size,
                        data_dir=args.data_dir)
    record = analyze(cfg, profile=args.profile, experiment=args.experiment)
    write_result(args.out, record)
    m = record["metrics"]
    layers = ", ".join(f"L{k} {v:.3f}" if v is not None else f"L{k} degenerate" for k, v in m["u_per_layer"].items())
    print(f"{record['extra']['model_type']}: u ({args.divisor}) per layer: {layers}; dense median kappa "
          f"{m['kappa_median_dense']}")
    for role in ("selection", "compare"):
        if f"{role}_u_mean" in m:
            print(f"{role}: u mean {m[f'{role}_u_mean']}, pearson {m[f'{role}_pearson_u']}, median kappa "
                  f"{m[f'{role}_kappa_median']} (sigma_min {m[f'{role}_sigma_min_median']}, sigma_max "
                  f"{m[f'{role}_sigma_max_median']})")
    if "overlap_median" in m:
        print(f"overlap: median {m['overlap_median']} shared channels per head")
    print(f"result: {args.out}")
    return 0


def _cmd_run_analysis(args) -> int:
    if args.dry_run:
        plan = plan_analyses(args.table, args.profile, args.experiment, results_root=args.results_root)
        print(f"{args.table} ({args.profile} profile), experiment {plan['experiment']}: results in {plan['results_dir']}")
        for stage, jobs in plan["stages"].items():
            print(f"stage {stage}: {len(jobs)} runs")
            for name, config in jobs:
                print(f"  {name}: {json.dumps(config, sort_keys=True)}")
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    paths = run_analyses(args.table, args.profile, args.experiment, results_root=args.results_root,
                         data_dir=args.data_dir)
    print(f"{args.table} ({args.profile}): {len(paths)} analysis results in {paths[0].parent if paths else None}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("analyze", help="rank utilisation, spectra, subspace conditioning, overlap, conv similarity")
    p.add_argument("model", help="dense model folder")
    p.add_argument("--selection", help="pruned model folder (with selection.json) or a selection.json of MODEL")
    p.add_argument("--compare", help="a second selection: channel overlap with --selection (appendix C.2)")
    p.add_argument("--selection-model", help="the reduced model to analyse for --selection (e.g. after RFT); "
                   "default: the pruned folder of the selection. Without --selection: a full-width model (e.g. the "
                   "dense model after RFT, the control) analysed beside MODEL with every channel kept")
    p.add_argument("--out", required=True, help="result JSON file")
    p.add_argument("--calib", default="ptb")
    p.add_argument("--stream", default="calibration", choices=["calibration", "evaluation"],
                   help="token stream of the corpus: the selectors' calibration stream or the held-out evaluation one")
    p.add_argument("--n-calib", type=positive_int, default=4)
    p.add_argument("--seq-len", type=length_int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stride", type=positive_int, default=16, help="analyse the state at every STRIDE-th token")
    p.add_argument("--divisor", choices=DIVISORS, default="dk",
                   help="u = er / d: dk (default), min = min(d_k, d_v) (the authors'), dv")
    p.add_argument("--ignore-decay", action="store_true", help="drop the GDN/Mamba-2 decay (the authors' recurrence)")
    p.add_argument("--batch-size", type=positive_int, default=4)
    p.add_argument("--threads", type=positive_int, default=None)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--profile", default="tiny")
    p.add_argument("--experiment", default="analysis")
    p.set_defaults(func=_cmd_analyze)

    r = subparsers.add_parser("run-analysis", help="prune, fine-tune and analyse what a rank-analysis figure or "
                              "table needs (experiments/rank_analysis: figure2 ... figure7, table5, table6, tableC2)")
    r.add_argument("table", help="a figure or table declared by the experiment's config.yaml")
    r.add_argument("--profile", choices=["tiny", "paper"], default="tiny")
    r.add_argument("--experiment", default="rank_analysis")
    r.add_argument("--dry-run", action="store_true", help="print every stage and configuration; run nothing")
    r.add_argument("--results-root", default=None, help="default: results/ in the repository")
    r.add_argument("--data-dir", default=None)
    r.add_argument("--threads", type=positive_int, default=None)
    r.set_defaults(func=_cmd_run_analysis)
