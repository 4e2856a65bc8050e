"""The `state-reduction` command line: one subcommand per capability."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import warnings
from pathlib import Path

from state_reduction import tracking, wandb_workspace
from state_reduction.atomic import publish_folder
from state_reduction.backend import install_cpu_backend
from state_reduction.checkpoints import check_checkpoint_files
from state_reduction.data import corpus_text, list_corpora, load_corpus
from state_reduction.devices import resolve_device
from state_reduction.allocator import pipeline_heap
from state_reduction.errors import Error, InputError
from state_reduction.evaluation import evaluate, load_causal_lm
from state_reduction.evaluation.run import HUB_SUITES, EvaluateConfig, _suite_table
from state_reduction.options import add_config_options, config_from_args, positive_int
from state_reduction.pipeline import find_experiment, offline_cache, plan_table, run_table
from state_reduction.prefetch import check_offline
from state_reduction.progress import QUIET_PROGRESS_INTERVAL_S, quiet_progress_off_tty  # noqa: F401 (re-exported)
from state_reduction.provenance import REPO_ROOT, TINY_CHECKPOINTS, TINY_MODELS_DIR
from state_reduction.pruning.prune import PruneConfig, prune, prune_result
from state_reduction.pruning.shed import STRUCTURE_METHODS, ShedConfig, shed, shed_result
from state_reduction.results import build_result, check_result_path, measure, model_entry, write_result
from state_reduction.tokenizer import tokenizer_hash, train_bpe_tokenizer
from state_reduction.training.pretrain import PretrainConfig, pretrain

# Subcommands defined next to their code: each module has register(subparsers), which adds its parsers
# with set_defaults(func=handler). Append a module here to add a subcommand.
SUBCOMMAND_MODULES: list[str] = ["state_reduction.speed.cli", "state_reduction.rft.cli", "state_reduction.analysis.cli",
                                 "state_reduction.pruning.memory_plan", "state_reduction.slurm",
                                 "state_reduction.claims", "state_reduction.rehearsal", "state_reduction.prefetch"]


def _cmd_data(args) -> int:
    names = args.corpora or [c.name for c in list_corpora(profile="tiny")]
    for name in names:
        sizes = {}
        for split in ("train", "validation", "test"):
            ds = load_corpus(name, split, data_dir=args.data_dir)
            sizes[split] = {"documents": len(ds), "characters": sum(len(t) for t in ds["text"])}
        print(json.dumps({"corpus": name, **sizes}))
    return 0


def _cmd_train_tokenizer(args) -> int:
    texts = [corpus_text(name, "train", data_dir=args.data_dir) for name in args.corpora]
    tok = train_bpe_tokenizer(texts, vocab_size=args.vocab_size)
    publish_folder(args.out, tok.save_pretrained, overwrite=True, option="--out")
    print(f"tokenizer: {len(tok)} tokens, sha256 {tokenizer_hash(args.out)} -> {args.out}")
    return 0


def _cmd_pretrain(args) -> int:
    install_cpu_backend()
    for config_path in args.configs:
        cfg = PretrainConfig.from_yaml(config_path, steps=args.steps, threads=args.threads)
        out = Path(args.out_root) / cfg.name
        run = Path(args.run_root) / cfg.name
        record = pretrain(cfg, args.tokenizer, out, run, data_dir=args.data_dir, device=args.device,
                          resume=not args.no_resume)
        print(json.dumps({"model": cfg.name, "out": str(out), "eval": record["eval"],
                          "wall_time_s": record["wall_time_s"]}, indent=2))
    return 0


def _cmd_shed(args) -> int:
    if args.target is None or args.steps is None:
        raise InputError(f"--method {args.method} removes structures: it needs --target (block, mixer, mlp, "
                         f"mlp-channels) and --steps N, got --target {args.target}, --steps {args.steps}")
    record = shed(config_from_args(ShedConfig, args))
    b, a = record["costs"]["before"], record["costs"]["after"]
    ppl = record["calibration_ppl"]
    print(f"{record['model_type']}: shed ({args.search}) removed {', '.join(record['removed'])}; parameters "
          f"{b['parameters']} -> {a['parameters']}, state {b['state_bytes']} -> {a['state_bytes']} bytes/sequence, "
          f"FLOPs/token {b['flops_per_token']} -> {a['flops_per_token']}; calibration ppl {ppl['dense']:.4g} -> "
          f"{ppl['after']:.4g}; {args.out} ({record['wall_time_s']} s)")
    result = Path(args.out) / "prune_result.json"
    write_result(result, shed_result(record, args.out, profile=args.profile, experiment=args.experiment))
    print(f"result: {result}")
    return 0


def _cmd_prune(args) -> int:
    if args.method in STRUCTURE_METHODS:
        return _cmd_shed(args)
    if args.ratio is None:
        raise InputError(f"--method {args.method} removes key channels: it needs --ratio (fraction removed, in [0, 1))")
    cfg = config_from_args(PruneConfig, args)
    cfg.validate()
    if args.profile == "tiny":  # the tiny profile reads local checkpoints only; a missing one is no hub id
        check_checkpoint_files(args.model)

    def write_prune_result(folder: Path, record: dict) -> None:  # inside the folder, published with it
        write_result(folder / "prune_result.json", prune_result(record, folder, profile=args.profile,
                                                                experiment=args.experiment, published_as=args.out))

    record = prune(cfg, write_extra=write_prune_result)
    sb = record["state_bytes_per_sequence"]
    print(f"{record['model_type']}: {args.method} ({args.select}) kept {record['key_dim_after']}/{record['key_dim_before']} "
          f"channels per head; state {sb['before']} -> {sb['after']} bytes/sequence; {args.out} "
          f"({record['wall_time_s']} s)")
    print(f"result: {Path(args.out) / 'prune_result.json'}")
    return 0


def _cmd_evaluate(args) -> int:
    cfg = config_from_args(EvaluateConfig, args)
    _suite_table(cfg.suite)  # an unknown suite fails before the model loads
    check_result_path(args.out)  # and an output that cannot be written
    device = resolve_device(cfg.device)
    install_cpu_backend()
    with measure() as m:
        model, tokenizer = load_causal_lm(cfg.model, device, max_length=cfg.max_length)
        result = evaluate(model, tokenizer, suite=cfg.suite, batch_size=cfg.batch_size,
                          max_length=cfg.max_length, limit=cfg.limit, data_dir=cfg.data_dir)
    record = build_result(
        "evaluate", profile="paper" if cfg.suite in HUB_SUITES else "tiny", experiment=args.experiment,
        config=cfg.result_config(device), metrics=result["metrics"], model=model_entry(cfg.model),
        data={t: d["sha256"] for t, d in result["data"].items() if d}, wall_time_s=m["wall_time_s"],
        extra={k: result[k] for k in ("suite", "tasks", "n_examples", "tokenizer", "lm_eval_version", "vocab") if k in result}
        | {"data_files": result["data"]})
    write_result(args.out, record)
    print(json.dumps(result["metrics"], indent=2))
    return 0


def _cmd_run_table(args) -> int:
    if args.dry_run:
        plan = plan_table(args.experiment, args.table, args.profile, results_root=args.results_root,
                          seeds=args.seeds)
        print(f"{plan['table']} ({plan['profile']} profile), experiment {plan['experiment']}: "
              f"results in {plan['results_dir']}")
        for key, path in plan["models"].items():
            print(f"  model {key}: {path}")
        for stage, jobs in plan["stages"].items():
            print(f"stage {stage}: {len(jobs)} runs")
            for name, config in jobs:
                print(f"  {name}: {json.dumps(config, sort_keys=True)}")
        return 0
    if offline_cache() is not None:  # every artefact of the table in the prefetched cache, before any compute
        check_offline(args.profile, [args.table], offline_cache(), args.experiment or find_experiment(args.table))
    paths = run_table(args.experiment, args.table, args.profile, results_root=args.results_root,
                      data_dir=args.data_dir, seeds=args.seeds, workers=args.workers)
    folder = paths[0].parent if paths else None
    print(f"{args.table} ({args.profile}): {len(paths)} result files in {folder}")
    return 0


def _cmd_wandb(args) -> int:
    try:
        if args.wandb_command == "mirror":
            done = tracking.mirror_missing(args.profile, args.results_root, args.experiment, args.mode)
            print(f"mirrored {len(done)} results to wandb ({tracking.wandb_mode(args.mode)}) in "
                  f"{tracking.wandb_dir(args.profile, args.results_root)}")
        elif args.wandb_command == "sync":
            tracking.mirror_missing(args.profile, args.results_root, None, "offline")
            return tracking.sync(args.profile, args.results_root)
        elif args.wandb_command == "show":
            print(json.dumps(tracking.read_offline_run(args.run_dir), indent=1, default=str))
        elif args.wandb_command == "workspace":
            if args.print:
                print(json.dumps(wandb_workspace.PANELS, indent=1))
            else:
                print(f"created {wandb_workspace.create(args.entity, args.project)}")
    except tracking.TrackingError as e:
        print(f"state-reduction wandb {args.wandb_command}: error: {e}", file=sys.stderr)
        return 2
    return 0


def _register_wandb(subparsers) -> None:
    p = subparsers.add_parser("wandb", help="mirror results to wandb (offline by default), sync, dashboard")
    sub = p.add_subparsers(dest="wandb_command", required=True)
    m = sub.add_parser("mirror", help="log every result file that has no wandb run yet")
    m.add_argument("--experiment", default=None)
    m.add_argument("--mode", choices=tracking.MODES, default=None, help="default: $WANDB_MODE, else offline")
    s = sub.add_parser("sync", help="mirror what is missing, then upload the offline runs (needs wandb login)")
    for q in (m, s):
        q.add_argument("--profile", default="tiny", choices=["tiny", "paper"])
        q.add_argument("--results-root", default=None)
    sh = sub.add_parser("show", help="print what an offline run folder recorded")
    sh.add_argument("run_dir")
    w = sub.add_parser("workspace", help="create the dashboard (workspace) in wandb; --print: its panels, offline")
    w.add_argument("--entity", default=None, help="default: $WANDB_ENTITY")
    w.add_argument("--project", default=os.environ.get("WANDB_PROJECT", tracking.PROJECT))
    w.add_argument("--print", action="store_true")
    p.set_defaults(func=_cmd_wandb)


def _cmd_render(args) -> int:
    # paper_tables sits beside src/ (renderers import the library, never the reverse): imported when asked for
    from paper_tables import render, run_missing

    if args.run:
        paths = run_missing(args.table, args.profile, args.experiment, args.results_root, seeds=args.seeds,
                            workers=args.workers)
        if paths:
            print(f"{args.table} ({args.profile}): {len(paths)} result files in {paths[0].parent}")
    figures = args.out_root / "figures" if args.out_root is not None else None
    out = render(args.table, args.profile, args.experiment, args.results_root, out_root=args.out_root,
                 figures_root=figures, seeds=args.seeds)
    if isinstance(out, list):  # renderers that do not print their outputs themselves
        for path in out:
            print(path)
    for line in _table_verdicts(args):
        print(line)
    return 0


def _table_verdicts(args) -> list[str]:
    """The claims of the experiment that declares the table, decided from the results present (claims.py)."""
    from state_reduction import claims
    from state_reduction.pipeline import PipelineError, find_experiment

    experiment = args.experiment
    if experiment is None:
        try:
            experiment = find_experiment(args.table)
        except PipelineError:  # a renderer of its own (speed tables, ralimp_synthetic): no experiment config
            return []
    if "/" in experiment or experiment.endswith(".yaml"):
        return []  # a config file given by path: its claims are not the committed experiment's
    return claims.render_summary(experiment, args.profile, args.results_root)


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line naming the option, exit 2 (as every other expected failure)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="state-reduction",
                                description="state-reduction: post-training state reduction in linear attention models")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("data", help="fetch, verify and summarise the offline corpora")
    d.add_argument("corpora", nargs="*", help="corpus names (default: all tiny-profile corpora)")
    d.add_argument("--data-dir", default=None)
    d.set_defaults(func=_cmd_data)

    t = sub.add_parser("train-tokenizer", help="train the tiny profile's byte-level BPE tokenizer")
    t.add_argument("--corpora", nargs="+", default=["ptb", "wiki", "books", "bible"])
    t.add_argument("--vocab-size", type=positive_int, default=8192)
    t.add_argument("--out", default=str(TINY_MODELS_DIR / "tokenizer"))
    t.add_argument("--data-dir", default=None)
    t.set_defaults(func=_cmd_train_tokenizer)

    r = sub.add_parser("pretrain", help="pretrain tiny models from their YAML configs (resumable)")
    r.add_argument("configs", nargs="+", help="experiments/tiny_models/configs/*.yaml")
    r.add_argument("--tokenizer", default=str(TINY_MODELS_DIR / "tokenizer"))
    r.add_argument("--out-root", default=str(TINY_CHECKPOINTS))
    r.add_argument("--run-root", default=str(REPO_ROOT / "runs" / "tiny_models"))
    r.add_argument("--steps", type=positive_int, default=None, help="override the config's number of steps")
    r.add_argument("--threads", type=positive_int, default=None)
    r.add_argument("--device", default="cpu")
    r.add_argument("--data-dir", default=None)
    r.add_argument("--no-resume", action="store_true", help="start over even if a run state exists")
    r.set_defaults(func=_cmd_pretrain)

    pr = sub.add_parser("prune", help="remove key channels per head (state reduction) and save the smaller model")
    add_config_options(pr, PruneConfig, positional=["model"], optional=["ratio"])
    add_config_options(pr, ShedConfig, optional=["target", "steps"])
    pr.add_argument("--experiment", default="prune", help="experiment name recorded in prune_result.json")
    pr.add_argument("--profile", choices=["tiny", "paper"], default="tiny", help="profile recorded in the result")
    pr.set_defaults(func=_cmd_prune)

    ev = sub.add_parser("evaluate", help="evaluate a model through lm-eval (suite tiny: offline; paper: hub tasks)")
    add_config_options(ev, EvaluateConfig, positional=["model"])
    ev.add_argument("--out", required=True, help="result JSON")
    ev.add_argument("--experiment", default="evaluate", help="experiment name recorded in the result")
    ev.set_defaults(func=_cmd_evaluate)


    b = sub.add_parser("run-table", help="run every missing stage (prune, evaluate, RFT) behind a paper table")
    b.add_argument("table", help="a table declared by an experiment's config.yaml (table1, table3, table20, ...)")
    b.add_argument("--profile", choices=["tiny", "paper"], default="tiny")
    b.add_argument("--experiment", default=None,
                   help="experiments/<name>/config.yaml (default: the experiment that declares the table)")
    b.add_argument("--dry-run", action="store_true",
                   help="print every stage and resolved configuration; run nothing, load no model, call no hub")
    b.add_argument("--results-root", default=None, help="default: results/ in the repository")
    b.add_argument("--data-dir", default=None)
    b.add_argument("--seeds", type=int, nargs="+", default=None,
                   help="replicate seeds (default: the table's `seeds:`, else one); each seed draws the calibration "
                        "data and drives the RFT run; the tables show mean ± 95%% CI over them")
    b.add_argument("--workers", type=positive_int, default=1,
                   help="run the table's tasks (each model's baseline, each cell's stages) in this many processes, "
                        "torch's threads split between them (default 1; make table20 uses 2 on the tiny profile)")
    b.set_defaults(func=_cmd_run_table)
    _register_wandb(sub)

    rd = sub.add_parser("render", help="render a paper table or figure from result files (paper_tables)")
    rd.add_argument("table", help="a table or figure declared by an experiment's config.yaml (table1, table20, "
                                  "figure2, ...), or table17-19, figure4, ralimp_synthetic")
    rd.add_argument("--profile", choices=["tiny", "paper"], default="tiny")
    rd.add_argument("--experiment", default=None,
                    help="experiments/<name>/config.yaml (default: the experiment that declares the table)")
    rd.add_argument("--results-root", default=None, help="default: results/ in the repository")
    rd.add_argument("--seeds", type=int, nargs="+", default=None,
                    help="replicate seeds shown (as run-table --seeds; default: the table's)")
    rd.add_argument("--out-root", default=None, type=Path,
                    help="write OUT_ROOT/<profile>/<table>.* and OUT_ROOT/figures/<profile>/ instead of "
                         "paper_tables/out/ and figures/")
    rd.add_argument("--run", action="store_true",
                    help="first run what the table's results lack (run-table, or run-analysis for the rank analysis)")
    rd.add_argument("--workers", type=positive_int, default=1, help="with --run: as run-table --workers")
    rd.set_defaults(func=_cmd_render)
    for module in SUBCOMMAND_MODULES:
        importlib.import_module(module).register(sub)
    return p


def main(argv=None) -> int:
    """Expected failures (errors.Error: bad input, damaged file, unwritable output) print one line and return 2;
    anything else is a bug and propagates with its traceback (exit 1)."""
    args = build_parser().parse_args(argv)
    quiet_progress_off_tty()
    where = f"state-reduction {args.command}"
    if getattr(args, "allocator", "pipeline") == "pipeline":  # `bench` sets "own": it measures glibc's default
        try:
            pipeline_heap()
        except Error as e:
            print(f"{where}: error: {e.one_line()}", file=sys.stderr)
            return 2
    show = warnings.showwarning
    warnings.showwarning = lambda message, category, *rest, **kw: print(
        f"{where}: warning: {' '.join(str(message).split())}", file=sys.stderr)
    try:
        return args.func(args)
    except Error as e:
        print(f"{where}: error: {e.one_line()}", file=sys.stderr)
        return 2
    finally:
        warnings.showwarning = show


if __name__ == "__main__":
    sys.exit(main())
