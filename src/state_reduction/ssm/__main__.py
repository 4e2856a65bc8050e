"""`python -m state_reduction.ssm train|sweep|render`: the aire_home experiment's entry points."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import yaml
from state_reduction.ssm.experiment import render_home, run_home_sweep
from state_reduction.ssm.train import TrainConfig, train


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m state_reduction.ssm", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train (or resume) the S5 ListOps models of the experiment's training seeds")
    t.add_argument("--config", default="experiments/aire_home/config.yaml")
    t.add_argument("--seed", type=int, action="append", help="training seed (repeatable); default: the config's")
    t.add_argument("--checkpoints", default="experiments/aire_home/checkpoints")
    t.add_argument("--run-dir", default="runs/aire_home")
    s = sub.add_parser("sweep", help="prune every trained model with every method at every ratio, write results")
    s.add_argument("--config", default="experiments/aire_home/config.yaml")
    s.add_argument("--checkpoints", default="experiments/aire_home/checkpoints")
    s.add_argument("--profile", default="tiny")
    s.add_argument("--seed", type=int, action="append", help="only this training seed (repeatable; parallel sweeps)")
    r = sub.add_parser("render", help="Figures 6 and 7 and the summary table from the results")
    r.add_argument("--config", default="experiments/aire_home/config.yaml")
    r.add_argument("--profile", default="tiny")
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    if args.command == "train":
        seeds = args.seed or yaml.safe_load(Path(args.config).read_text())["training_seeds"]
        for seed in seeds:
            out = Path(args.checkpoints) / f"seed{seed}"
            cfg = TrainConfig.from_yaml(args.config, seed=seed)
            record_path = out / "training_record.json"
            if record_path.is_file():
                if json.loads(record_path.read_text())["config_hash"] == cfg.hash():
                    print(f"{out}: trained (config {cfg.hash()})")
                    continue
            record = train(cfg, out, Path(args.run_dir) / f"seed{seed}",
                           log=lambda m, s=seed: print(f"[seed {s}] {m}", flush=True))
            print(f"{out}: test accuracy {record['test_accuracy']:.4f} (majority class "
                  f"{record['test_majority_class_accuracy']:.4f}), {record['wall_time_s']} s", flush=True)
    elif args.command == "sweep":
        run_home_sweep(args.config, args.checkpoints, args.profile, seeds=args.seed)
    else:
        render_home(args.config, args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
