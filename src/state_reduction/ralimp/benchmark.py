"""Runner of experiments/ralimp_synthetic (seed section 3.1 / App. D.1): one result per activation x method x
budget x seed, under results/<profile>/ralimp_synthetic/, written by results.run_sweep (resumable: finished cells
are skipped).

    python -m state_reduction.ralimp.benchmark --profile tiny [--worker 0/2] [--dry-run]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import yaml

from state_reduction.provenance import REPO_ROOT
from state_reduction.ralimp.synthetic import fit
from state_reduction.results import build_result, results_dir, run_sweep

EXPERIMENT = "ralimp_synthetic"
CONFIG = REPO_ROOT / "experiments" / EXPERIMENT / "config.yaml"


def method_options(cfg: dict, method: str, budget: int) -> dict:
    """The method's options at this budget; RaLiMP moves poly_fraction of off-default budgets to the polynomial."""
    opts = dict(cfg["methods"][method] or {})
    if method == "ralimp" and budget != cfg["budget"]:
        deg = opts.get("degree", 2)
        poly = max(deg, int(round(budget * cfg["budget_sweep"]["poly_fraction"] / deg)) * deg)
        opts["poly_features"] = poly
    return opts


def cells(cfg: dict, profile: str) -> list[tuple[str, dict]]:
    """Main grid first, seed by seed (so a partial run already pairs every method), then the budget sweep."""
    prof = cfg["profiles"][profile]
    main = [(a, m, cfg["budget"]) for a in cfg["activations"] for m in cfg["methods"]]
    sweep = cfg.get("budget_sweep") or {}
    extra = [(a, m, b) for a in sweep.get("activations", []) for m in sweep.get("methods", [])
             for b in sweep.get("budgets", []) if (a, m, b) not in main]
    out = []
    for group in (main, extra):
        for seed, (act, method, budget) in ((s, g) for s in prof["seeds"] for g in group):
            config = {"method": method, "activation": act, "budget": int(budget), "seed": int(seed),
                      "steps": int(prof["steps"]), "batch_size": prof.get("batch_size"), **cfg["train"],
                      **cfg["problem"], "options": method_options(cfg, method, budget)}
            out.append((f"{act}-{method}-b{budget}-s{seed}", config))
    return out


def run_cell(profile: str):
    def run(name: str, config: dict) -> dict:
        torch.set_num_threads(1)
        c = config
        metrics = fit(c["method"], c["activation"], c["seed"], budget=c["budget"], steps=c["steps"], lr=c["lr"],
                      clip=c["clip"], batch_size=c["batch_size"], n=c["n"], d=c["d"], out=c["out"],
                      n_calib=c["n_calib"], options=c["options"])
        return build_result("bench", profile=profile, experiment=EXPERIMENT, config=config, metrics=metrics,
                            seeds={"seed": c["seed"]}, wall_time_s=metrics["fit_time_s"])
    return run


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="tiny", choices=["tiny", "paper"])
    ap.add_argument("--config", default=str(CONFIG))
    ap.add_argument("--worker", default="0/1", help="i/n: run every n-th missing cell starting at i")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    cfg = yaml.safe_load(Path(args.config).read_text())
    try:
        i, n = (int(v) for v in args.worker.split("/"))
        assert 0 <= i < n
    except (ValueError, AssertionError):
        raise SystemExit(f"ralimp benchmark: --worker must be i/n with 0 <= i < n, got {args.worker!r}") from None
    todo = cells(cfg, args.profile)[i::n]
    if args.dry_run:
        for name, _ in todo:
            print(name)
        return
    run_sweep(todo, run_cell(args.profile), results_dir(args.profile, EXPERIMENT))


if __name__ == "__main__":
    main()
