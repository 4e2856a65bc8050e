"""`state-reduction rft` and `state-reduction bench-rft`."""

from __future__ import annotations

import os
import time

from state_reduction.options import add_config_options, length_int, nonnegative_int, positive_float, positive_int
from state_reduction.provenance import REPO_ROOT
from state_reduction.results import build_result, write_result
from state_reduction.rft.config import PRESETS, RFTConfig, RFTError, parse_overrides
from state_reduction.rft.flame import export_for_flame
from state_reduction.rft.throughput import bench_rft, format_rft_bench
from state_reduction.rft.trainer import run_rft

# RFTConfig fields settable by their own option (every other one through --set KEY=VALUE); unset options leave
# the field to --config and the preset
FLAGS = ["profile", "steps", "batch_size", "micro_batch_size", "seq_len", "lr", "warmup_steps", "rank", "alpha",
         "save_every", "resume", "overwrite", "seed", "corpora", "eval_corpora", "wandb", "distributed", "device",
         "threads"]
HELP = {"student": "pruned checkpoint (state-reduction prune --out)",
        "teacher": "the unpruned (dense) checkpoint",
        "out": "run folder: model/, checkpoints/, log.jsonl, rft_result.json",
        "batch_size": "global batch (all processes)",
        "micro_batch_size": "per process and forward (gradient accumulation)",
        "rank": "LoRA r", "alpha": "LoRA alpha",
        "resume": "continue from <out>/checkpoints/state.pt",
        "overwrite": "start over, deleting the run in --out",
        "corpora": "comma-separated corpora whose finetune streams are used",
        "eval_corpora": "held-out perplexity (test split) before and after, e.g. ptb,wiki",
        "wandb": "default: $WANDB_MODE, else offline"}
TYPES = {"steps": positive_int, "batch_size": positive_int, "micro_batch_size": positive_int, "seq_len": length_int,
         "lr": positive_float, "warmup_steps": nonnegative_int, "rank": positive_int, "alpha": positive_float,
         "save_every": positive_int, "threads": positive_int}
CHOICES = {"profile": ["tiny", "paper"], "wandb": ["offline", "online", "disabled"],
           "distributed": ["auto", "none", "ddp", "fsdp"]}


def _cmd_rft(args) -> int:
    if args.teacher is None and not args.no_teacher:
        raise RFTError("pass --teacher DENSE (the unpruned model) or --no-teacher for cross-entropy only")
    flags = {name: getattr(args, name) for name in FLAGS}
    overrides = {**{k: v for k, v in flags.items() if v is not None}, **parse_overrides(args.overrides)}
    teacher = None if args.no_teacher else args.teacher
    if args.config:
        cfg = RFTConfig.from_yaml(args.config, student=args.student, teacher=teacher, out=args.out, **overrides)
    else:
        cfg = RFTConfig.from_preset(args.preset, args.student, teacher, args.out, **overrides)
    if args.export_flame:
        print(f"flame: {export_for_flame(cfg, args.export_flame)} (run it from a flame checkout)")
        return 0
    record = run_rft(cfg)
    if os.environ.get("RANK", "0") == "0":
        m = record["metrics"]
        print(f"rft {record['extra']['model_type']}: {m['steps']} steps, loss {m['first_loss']:.3f} -> "
              f"{m['final_loss']:.3f} (ce {m['final_ce']:.3f}, kl {m['final_kl']:.4f}), {m['tokens_per_s']:.0f} tokens/s; "
              f"{cfg.out}/model")
    return 0


def _cmd_bench_rft(args) -> int:
    config = {"families": args.families, "steps": args.steps, "batch_size": args.batch_size, "seq_len": args.seq_len,
              "method": "l1", "ratio": 0.5, "threads": 1, "device": "cpu"}

    t0 = time.time()
    rows = bench_rft(args.families, REPO_ROOT / "experiments" / "tiny_models" / "checkpoints", steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len)
    print(f"RFT on the tiny models (L1 50%), CPU, 1 thread, batch {args.batch_size} x {args.seq_len} tokens, "
          f"{args.steps} steps; peak RSS of a fresh process")
    print(format_rft_bench(rows))
    if args.out:
        metrics = {f"{r['family']}_{'teacher' if r['teacher'] else 'ce_only'}_tokens_per_s": r["tokens_per_s"] for r in rows}
        metrics.update({f"{r['family']}_{'teacher' if r['teacher'] else 'ce_only'}_peak_rss_bytes": r["peak_rss_bytes"]
                        for r in rows})
        metrics.update({f"{r['family']}_{'teacher' if r['teacher'] else 'ce_only'}_fraction_of_bare": r["fraction_of_bare"]
                        for r in rows})
        write_result(args.out, build_result("bench", profile="tiny", experiment="rft_bench", config=config,
                                            metrics=metrics, wall_time_s=time.time() - t0, extra={"rows": rows}))
    return 0


def register(sub) -> None:
    r = sub.add_parser("rft", help="recovery fine-tuning of a pruned model: LoRA + distillation from the dense teacher",
                       description="Defaults are the paper's recipe (--preset paper); --preset tiny fits the CPU "
                                   "tiny profile. Flags and --set KEY=VALUE win over --config and the preset.")
    add_config_options(r, RFTConfig, positional=["student"], only=["student"], helps=HELP)
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override any RFTConfig field (repeatable), e.g. --set kd_temperature=1 --set progress=false")
    add_config_options(r, RFTConfig, only=["teacher"], optional=["teacher"], helps=HELP)
    r.add_argument("--no-teacher", action="store_true", help="cross-entropy only (no distillation)")
    add_config_options(r, RFTConfig, only=["out"], helps=HELP)
    r.add_argument("--preset", default="paper", choices=sorted(PRESETS))
    r.add_argument("--config", default=None, help="YAML of RFTConfig fields (may name a preset)")
    add_config_options(r, RFTConfig, only=FLAGS, layered=True, flags={"corpora": "--corpus"}, helps=HELP,
                       types=TYPES, choices=CHOICES)
    r.add_argument("--export-flame", metavar="DUMP_DIR", default=None,
                   help="write DUMP_DIR/flame_train_args.sh (DCP seed conversion + train.sh flags) instead of training")
    r.set_defaults(func=_cmd_rft)

    b = sub.add_parser("bench-rft", help="tokens/s and peak memory of RFT on the tiny models, with and without teacher")
    b.add_argument("--families", type=lambda s: s.split(","), default=["deltanet", "gated_deltanet", "mamba2", "qwen3_5"])
    b.add_argument("--steps", type=positive_int, default=5)
    b.add_argument("--batch-size", type=positive_int, default=4)
    b.add_argument("--seq-len", type=length_int, default=128)
    b.add_argument("--out", default=None, help="also write a result JSON")
    b.set_defaults(func=_cmd_bench_rft)

