"""`state-reduction rft` and `state-reduction bench-rft`."""

from __future__ import annotations

import os

from state_reduction.options import length_int, nonnegative_int, positive_float, positive_int


def _cmd_rft(args) -> int:
    from state_reduction.rft.config import RFTConfig, RFTError, parse_overrides
    from state_reduction.rft.trainer import run_rft

    if args.teacher is None and not args.no_teacher:
        raise RFTError("pass --teacher DENSE (the unpruned model) or --no-teacher for cross-entropy only")
    flags = {"steps": args.steps, "batch_size": args.batch_size, "micro_batch_size": args.micro_batch_size,
             "seq_len": args.seq_len, "lr": args.lr, "warmup_steps": args.warmup_steps, "rank": args.rank,
             "alpha": args.alpha, "save_every": args.save_every, "seed": args.seed, "corpora": args.corpus,
             "wandb": args.wandb, "distributed": args.distributed, "device": args.device, "threads": args.threads,
             "eval_corpora": args.eval_corpora, "profile": args.profile,
             "resume": args.resume or None, "overwrite": args.overwrite or None}
    overrides = {**{k: v for k, v in flags.items() if v is not None}, **parse_overrides(args.overrides)}
    teacher = None if args.no_teacher else args.teacher
    if args.config:
        cfg = RFTConfig.from_yaml(args.config, student=args.student, teacher=teacher, out=args.out, **overrides)
    else:
        cfg = RFTConfig.from_preset(args.preset, args.student, teacher, args.out, **overrides)
    if args.export_flame:
        from state_reduction.rft.flame import export_for_flame

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
    from state_reduction.provenance import REPO_ROOT
    from state_reduction.results import build_result, write_result
    from state_reduction.rft.bench import bench_rft, format_rft_bench

    config = {"families": args.families, "steps": args.steps, "batch_size": args.batch_size, "seq_len": args.seq_len,
              "method": "l1", "ratio": 0.5, "threads": 1, "device": "cpu"}
    import time

    t0 = time.time()
    rows = bench_rft(args.families, REPO_ROOT / "experiments" / "tiny_models" / "checkpoints", steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len)
    print(f"RFT on the tiny models (L1 50%), CPU, 1 thread, batch {args.batch_size} x {args.seq_len} tokens, "
          f"{args.steps} steps; peak RSS of a fresh process")
    print(format_rft_bench(rows))
    if args.out:
        metrics = {f"{r['family']}_{'teacher' if r['teacher'] else 'ce_only'}_tokens_per_s": r["tokens_per_s"] for r in rows}
        metrics.update({f"{r['family']}_{'teacher' if r['teacher'] else 'ce_only'}_peak_rss_bytes": r["peak_rss_bytes"]
                        for r in rows})
        write_result(args.out, build_result("bench", profile="tiny", experiment="rft_bench", config=config,
                                            metrics=metrics, wall_time_s=time.time() - t0, extra={"rows": rows}))
    return 0


def register(sub) -> None:
    from state_reduction.rft.config import PRESETS

    r = sub.add_parser("rft", help="recovery fine-tuning of a pruned model: LoRA + distillation from the dense teacher",
                       description="Defaults are the paper's recipe (--preset paper); --preset tiny fits the CPU "
                                   "tiny profile. Flags and --set KEY=VALUE win over --config and the preset.")
    r.add_argument("student", help="pruned checkpoint (state-reduction prune --out)")
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override any RFTConfig field (repeatable), e.g. --set kd_temperature=1 --set progress=false")
    r.add_argument("--teacher", default=None, help="the unpruned (dense) checkpoint")
    r.add_argument("--no-teacher", action="store_true", help="cross-entropy only (no distillation)")
    r.add_argument("--out", required=True, help="run folder: model/, checkpoints/, log.jsonl, rft_result.json")
    r.add_argument("--preset", default="paper", choices=sorted(PRESETS))
    r.add_argument("--config", default=None, help="YAML of RFTConfig fields (may name a preset)")
    r.add_argument("--profile", choices=["tiny", "paper"], default=None)
    r.add_argument("--steps", type=positive_int)
    r.add_argument("--batch-size", type=positive_int, help="global batch (all processes)")
    r.add_argument("--micro-batch-size", type=positive_int, help="per process and forward (gradient accumulation)")
    r.add_argument("--seq-len", type=length_int)
    r.add_argument("--lr", type=positive_float)
    r.add_argument("--warmup-steps", type=nonnegative_int)
    r.add_argument("--rank", type=positive_int, help="LoRA r")
    r.add_argument("--alpha", type=positive_float, help="LoRA alpha")
    r.add_argument("--save-every", type=positive_int)
    r.add_argument("--resume", action="store_true", help="continue from <out>/checkpoints/state.pt")
    r.add_argument("--overwrite", action="store_true", help="start over, deleting the run in --out")
    r.add_argument("--seed", type=int)
    r.add_argument("--corpus", type=lambda s: [c for c in s.split(",") if c], default=None,
                   help="comma-separated corpora whose finetune streams are used")
    r.add_argument("--eval-corpora", type=lambda s: [c for c in s.split(",") if c], default=None,
                   help="held-out perplexity (test split) before and after, e.g. ptb,wiki")
    r.add_argument("--wandb", choices=["offline", "online", "disabled"], default=None,
                   help="default: $WANDB_MODE, else offline")
    r.add_argument("--distributed", choices=["auto", "none", "ddp", "fsdp"], default=None)
    r.add_argument("--device", default=None)
    r.add_argument("--threads", type=positive_int, default=None)
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

