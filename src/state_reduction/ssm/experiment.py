"""The aire_home experiment: every trained S5 ListOps model pruned by every method at every ratio, no retraining.

Results (results/<profile>/aire_home/): one `evaluate` result per (method, ratio, training seed) with the test
accuracy, the dense accuracy, the drop, the fraction of states actually removed and each layer's removed
fraction; one `analyze` result per (method, training seed) summarising its curve: the mean accuracy over the
grid, and the largest ratio up to which every grid point stays within `tolerance` of the dense accuracy.
Random selection draws its modes with the training seed as its seed.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from state_reduction.atomic import write_text_atomic
from state_reduction.provenance import REPO_ROOT
from state_reduction.results import build_result, read_result, results_dir, run_sweep, write_result
from state_reduction.ssm.listops import ListOpsSpec, generate_split, split_sha256
from state_reduction.ssm.scores import METHODS, select_modes
from state_reduction.ssm.train import accuracy, load_s5
from state_reduction.stats import mean_ci

EXPERIMENT = "aire_home"
RATIOS = tuple(round(0.05 * i, 2) for i in range(20))      # 0, 5, ..., 95%
METHOD_LABELS = {"aire": "AIRE-Prune", "last": "LAST", "uniform_hinf": r"Uniform $H_\infty$",
                 "global_hinf": r"Global $H_\infty$", "random": "Random (uniform per layer)"}


def _config(path: str | Path) -> dict:
    raw = yaml.safe_load(Path(path).read_text())
    methods = raw.get("methods", list(METHODS))
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise ValueError(f"{path}: methods {unknown} unknown; known: {', '.join(METHODS)}")
    raw["methods"] = methods
    raw.setdefault("ratios", list(RATIOS))
    raw.setdefault("tolerance", 0.01)
    return raw


def _check_profile(profile: str) -> None:
    if profile != "tiny":
        raise ValueError(f"aire_home --profile: runs on the tiny profile only (an S5 on generated ListOps, CPU); "
                         f"got {profile!r}")


class _Seed:
    """One trained model with its test split (sorted by length: fewer padded positions per batch)."""

    def __init__(self, model_dir: Path):
        self.dir = model_dir
        self.model = load_s5(model_dir)
        self.record = json.loads((model_dir / "training_record.json").read_text())
        spec = ListOpsSpec(**self.record["data_manifest"]["spec"])
        tokens, lengths, labels = generate_split(spec, "test")
        expected = self.record["data_manifest"]["splits"]["test"]["sha256"]
        if split_sha256(tokens, labels) != expected:
            raise ValueError(f"{model_dir}: the regenerated ListOps test split differs from the training record's "
                             f"sha256 {expected}; the generator changed since training")
        order = np.argsort(lengths, kind="stable")
        self.test = tuple(torch.from_numpy(a[order]) for a in (tokens, lengths, labels))
        self.data = {"listops_test": expected}
        with torch.no_grad():
            self.systems = [tuple(t.detach() for t in ssm.discrete()) for ssm in self.model.ssm_layers()]
        self.cache: dict[bytes, float] = {}

    def accuracy(self, keep: list[torch.Tensor]) -> float:
        key = torch.cat(keep).numpy().tobytes()
        if key not in self.cache:
            self.model.set_keep(keep)
            self.cache[key] = accuracy(self.model, *self.test)
        return self.cache[key]


def run_home_sweep(config_path: str | Path, checkpoints: str | Path, profile: str = "tiny",
                   seeds: list[int] | None = None) -> list[Path]:
    """Run the missing cells (of `seeds` only, when given), then rewrite the per-curve summaries."""
    _check_profile(profile)
    cfg = _config(config_path)
    out_dir = results_dir(profile, EXPERIMENT)
    loaded: dict[int, _Seed] = {}

    def seed_state(seed: int) -> _Seed:
        if seed not in loaded:
            loaded[seed] = _Seed(Path(checkpoints) / f"seed{seed}")
        return loaded[seed]

    cells = []
    for seed in seeds or cfg["training_seeds"]:
        if seed not in cfg["training_seeds"]:
            raise ValueError(f"aire_home sweep --seed {seed}: not a training seed of {config_path} "
                             f"({cfg['training_seeds']})")
        record = json.loads((Path(checkpoints) / f"seed{seed}" / "training_record.json").read_text())
        for method in cfg["methods"]:
            for ratio in cfg["ratios"]:
                cells.append((f"{method}-r{round(ratio * 100):02d}-seed{seed}",
                              {"experiment": EXPERIMENT, "model": "s5_listops", "train_config_hash": record["config_hash"],
                               "method": method, "ratio": ratio, "seed": seed, "split": "test"}))

    def run(name: str, config: dict) -> dict:
        t0 = time.perf_counter()
        s = seed_state(config["seed"])
        dense = s.accuracy([torch.ones(sys[0].numel(), dtype=torch.bool) for sys in s.systems])
        keep = select_modes(config["method"], s.systems, config["ratio"], seed=config["seed"])
        acc = s.accuracy(keep)
        kept = [int(k.sum()) for k in keep]
        sizes = [k.numel() for k in keep]
        metrics = {"accuracy": acc, "dense_accuracy": dense, "accuracy_drop": dense - acc,
                   "removed_fraction": 1 - sum(kept) / sum(sizes), "kept_states": sum(kept),
                   "total_states": sum(sizes), "layers_removed": sum(k == 0 for k in kept)}
        metrics.update({f"layer{i}_removed_fraction": 1 - k / n for i, (k, n) in enumerate(zip(kept, sizes))})
        return build_result("evaluate", profile=profile, experiment=EXPERIMENT, config=config, metrics=metrics,
                            model={"path": str(s.dir), "weights_sha256": None}, data=s.data,
                            seeds={"training": config["seed"], "pruning": config["seed"]},
                            wall_time_s=time.perf_counter() - t0,
                            extra={"kept_per_layer": kept, "kept_modes": [torch.nonzero(k).flatten().tolist() for k in keep]})

    paths = run_sweep(cells, run, out_dir)
    _write_summaries(cfg, out_dir, profile)
    return paths


def _curves(out_dir: Path, kind: str = "evaluate") -> list[dict]:
    rows = []
    for path in sorted(out_dir.glob("*.json")):
        r = read_result(path)
        if r["kind"] == kind:
            rows.append({**r["config"], **r["metrics"]})
    return rows


def max_ratio_within(ratios: list[float], drops: list[float], tolerance: float) -> float:
    """The largest grid ratio r such that every grid ratio <= r loses at most `tolerance` accuracy."""
    best = 0.0
    for r, d in sorted(zip(ratios, drops)):
        if d > tolerance + 1e-12:
            break
        best = r
    return best


def _write_summaries(cfg: dict, out_dir: Path, profile: str) -> None:
    rows = _curves(out_dir)
    for seed in cfg["training_seeds"]:
        for method in cfg["methods"]:
            mine = sorted((r for r in rows if r["seed"] == seed and r["method"] == method and r["ratio"] in cfg["ratios"]),
                          key=lambda r: r["ratio"])
            if len(mine) != len(cfg["ratios"]):
                continue
            ratios = [r["ratio"] for r in mine]
            config = {"experiment": EXPERIMENT, "model": "s5_listops", "summary": "curve", "method": method,
                      "seed": seed, "tolerance": cfg["tolerance"], "ratios": ratios}
            metrics = {"mean_accuracy": float(np.mean([r["accuracy"] for r in mine])),
                       "max_removed_within_tolerance": max_ratio_within(ratios, [r["accuracy_drop"] for r in mine],
                                                                        cfg["tolerance"]),
                       "dense_accuracy": mine[0]["dense_accuracy"]}
            write_result(out_dir / f"summary-{method}-seed{seed}.json",
                         build_result("analyze", profile=profile, experiment=EXPERIMENT, config=config,
                                      metrics=metrics, seeds={"training": seed}, wall_time_s=0.0))


def render_home(config_path: str | Path, profile: str = "tiny") -> list[Path]:
    """Figure 6 (accuracy vs fraction removed, mean and 95% CI over training seeds), Figure 7 (each layer's
    removed fraction vs the global ratio, AIRE and LAST) and a Markdown summary table, from the results only."""
    # lazy: start-up time (matplotlib only when the figures are drawn)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _check_profile(profile)
    cfg = _config(config_path)
    out_dir = results_dir(profile, EXPERIMENT)
    rows = _curves(out_dir)
    if not rows:
        raise FileNotFoundError(f"no aire_home results in {out_dir}; run `make aire-home` (or "
                                f"`python -m state_reduction.ssm sweep`) first")
    fig_dir = REPO_ROOT / "figures" / profile
    tab_dir = REPO_ROOT / "paper_tables" / "out" / profile
    fig_dir.mkdir(parents=True, exist_ok=True)
    tab_dir.mkdir(parents=True, exist_ok=True)
    written = []

    def ci(method, ratio, metric):
        vals = [100 * r[metric] for r in rows if r["method"] == method and r["ratio"] == ratio]
        return mean_ci(vals) if vals else None

    fig, ax = plt.subplots(figsize=(6, 4))
    for method in cfg["methods"]:
        pts = [(100 * ratio, ci(method, ratio, "accuracy")) for ratio in cfg["ratios"]]
        pts = [(x, c) for x, c in pts if c is not None]
        xs = [x for x, _ in pts]
        ax.plot(xs, [c.mean for _, c in pts], marker="o", ms=3, label=METHOD_LABELS[method])
        if all(c.low is not None for _, c in pts):
            ax.fill_between(xs, [c.low for _, c in pts], [c.high for _, c in pts], alpha=0.2)
    n_seeds = len(cfg["training_seeds"])
    ax.set(xlabel="states removed (%)", ylabel="ListOps test accuracy (%)",
           title=f"S5 on ListOps, no retraining (mean, 95% CI over {n_seeds} training seeds)")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    for ext in ("png", "pdf"):
        fig.savefig(fig_dir / f"aire_home_fig6.{ext}", bbox_inches="tight", dpi=150)
        written.append(fig_dir / f"aire_home_fig6.{ext}")
    plt.close(fig)

    n_layers = max(int(k.removeprefix("layer").removesuffix("_removed_fraction"))
                   for k in rows[0] if k.startswith("layer") and k.endswith("_removed_fraction")) + 1
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, method in zip(axes, ("aire", "last")):
        for layer in range(n_layers):
            ys = [ci(method, ratio, f"layer{layer}_removed_fraction") for ratio in cfg["ratios"]]
            ax.plot([100 * r for r in cfg["ratios"]], [c.mean for c in ys], marker="o", ms=3, label=f"layer {layer + 1}")
        ax.plot([0, 95], [0, 95], "k--", lw=0.8, label="uniform")
        ax.set(xlabel="global pruning ratio (%)", title=f"{METHOD_LABELS[method]}: layer-wise pruning ratio")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"states removed in the layer (%; mean over {n_seeds} seeds)")
    axes[0].legend(fontsize=8)
    for ext in ("png", "pdf"):
        fig.savefig(fig_dir / f"aire_home_fig7.{ext}", bbox_inches="tight", dpi=150)
        written.append(fig_dir / f"aire_home_fig7.{ext}")
    plt.close(fig)

    summaries = _curves(out_dir, "analyze")
    tol = cfg["tolerance"]
    lines = [f"# aire_home ({profile}): S5 on ListOps, pruned without retraining",
             "", f"Mean [95% CI] over training seeds {cfg['training_seeds']}; accuracy in %.", "",
             f"| method | max removed within {100 * tol:g} pt (%) | mean accuracy over 0-95% | acc. at 50% | "
             "acc. at 60% | acc. at 75% | acc. at 90% |", "| --- | --- | --- | --- | --- | --- | --- |"]
    fmt = lambda c: "n/a" if c is None else (f"{c.mean:.1f}" if c.low is None else f"{c.mean:.1f} [{c.low:.1f}, {c.high:.1f}]")
    dense = mean_ci([100 * r["dense_accuracy"] for r in rows if r["method"] == cfg["methods"][0] and r["ratio"] == 0])
    for method in cfg["methods"]:
        mine = [s for s in summaries if s["method"] == method]
        removed = mean_ci([100 * s["max_removed_within_tolerance"] for s in mine]) if mine else None
        mean_acc = mean_ci([100 * s["mean_accuracy"] for s in mine]) if mine else None
        lines.append(f"| {METHOD_LABELS[method]} | {fmt(removed)} | {fmt(mean_acc)} | "
                     + " | ".join(fmt(ci(method, r, "accuracy")) for r in (0.5, 0.6, 0.75, 0.9)) + " |")
    lines += ["", f"Dense test accuracy: {fmt(dense)}."]
    write_text_atomic(tab_dir / "aire_home.md", "\n".join(lines) + "\n")
    written.append(tab_dir / "aire_home.md")
    for p in written:
        print(p)
    return written
