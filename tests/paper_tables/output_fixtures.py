"""Synthetic result files for the golden check of the renderers whose inputs are not evaluation tables of the
pipeline: the rank analysis (`analyze` results), the speed benchmarks (`bench` results), the MQAR recall figure,
state vs structure (prune and evaluation results) and the RaLiMP synthetic benchmark.

FIXTURES, not measurements: deterministic made-up numbers (table_fixtures._unit), a few results left out (holes).
The speed results are the one exception: bench results of the tiny Gated DeltaNet on a CPU (the bench functions of
tests/speed/test_renderers.py with one timed repetition), saved once under fixtures/speed/ so that their numbers
do not change from run to run. The rendered LaTeX / Markdown are saved under golden/<profile>/<target>/
(`python tests/paper_tables/table_fixtures.py --outputs`) and compared byte for byte by test_golden.py; figures
are written but not compared.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml
from table_fixtures import GOLDEN, _unit, fixture_metrics

from state_reduction.analysis.experiment import plan_analyses
from state_reduction.evaluation.mqar import CELLS
from state_reduction.pipeline import plan_table
from state_reduction.results import build_result, config_key

SPEED = Path(__file__).resolve().parent / "fixtures" / "speed"
RANK_TARGETS = ["table5", "table6", "tableC2", "figure2", "figure3", "figure5", "figure6", "figure7"]
# target -> profiles it is rendered on
OUTPUTS = {**{t: ["tiny", "paper"] for t in RANK_TARGETS},
           **{t: ["tiny"] for t in ("table17", "table18", "table19", "figure4")},
           "figure_mqar": ["tiny"], "state_vs_structure": ["tiny", "paper"], "ralimp_synthetic": ["tiny", "paper"]}
# targets that write figures only (no LaTeX / Markdown): checked for their figure files
FIGURE_ONLY = {"figure4"}
HOLE = 1 / 12
LAYERS, HEADS, KEY_DIM, POSITIONS = 2, 3, 8, [4, 8]


def _record(kind: str, profile: str, experiment: str, config: dict, metrics: dict, extra=None) -> dict:
    record = build_result(kind, profile=profile, experiment=experiment, config=config, metrics=metrics,
                          wall_time_s=1.0, extra=extra)
    record.update(provenance={"fixture": True}, created="2026-01-01T00:00:00+00:00", config_key=config_key(config))
    return record


def _write(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, sort_keys=True))


def _spectrum(*salt) -> list[float]:
    """A decreasing spectrum of KEY_DIM values, with a gap somewhere for some heads."""
    values, v = [], 1.0
    for i in range(KEY_DIM):
        values.append(v)
        v *= 0.05 if _unit(*salt, "gap", i) < 0.15 else 0.3 + 0.6 * _unit(*salt, "decay", i)
    return values


def _states(d_k: int, *salt) -> dict:
    """Per-layer state statistics; about one head in ten is degenerate (all-zero states: no rank)."""
    out = {}
    for layer in range(LAYERS):
        heads = []
        for h in range(HEADS):
            u = round(0.01 + 0.5 * _unit(*salt, layer, h, "u"), 4)
            if _unit(*salt, layer, h, "degenerate") < 0.1:
                heads.append({"er": None, "u": None, "u_std": None, "spectrum": None, "spectrum_raw": None,
                              "n_states": 0, "n_degenerate": 3, "degenerate": True,
                              "u_by_position": [None] * len(POSITIONS)})
                continue
            spectrum = _spectrum(*salt, layer, h)[:d_k]
            heads.append({"er": u * d_k, "u": u, "u_std": round(0.05 * _unit(*salt, layer, h, "std"), 4),
                          "spectrum": spectrum, "spectrum_raw": [100 * s for s in spectrum], "n_states": 3,
                          "n_degenerate": 0, "degenerate": False,
                          "u_by_position": [round(u * (0.5 + 0.5 * i), 4) for i in range(len(POSITIONS))]})
        out[str(layer)] = {"d_k": d_k, "d_v": 8, "divisor": d_k, "positions": POSITIONS, "u_mean": None,
                           "degenerate_heads": [h for h, head in enumerate(heads) if head["degenerate"]],
                           "heads": heads}
    return out


def _conditioning(*salt) -> dict:
    smin, smax = round(0.01 + _unit(*salt, "smin"), 4), round(10 + 90 * _unit(*salt, "smax"), 4)
    return {"per_layer": {}, "median": {"sigma_min": smin, "sigma_max": smax, "kappa": smax / smin},
            "degenerate_heads": int(3 * _unit(*salt, "deg"))}


def _summary(states: dict) -> dict:
    us = [h["u"] for layer in states.values() for h in layer["heads"] if h["u"] is not None]
    mean = sum(us) / len(us)
    std = (sum((u - mean) ** 2 for u in us) / len(us)) ** 0.5
    return {"mean": mean, "std": std, "min": min(us), "max": max(us), "n": len(us)}


def rank_extra(name: str, config: dict) -> dict:
    """The `extra` of one `analyze` result: the dense model's statistics, plus the selection's (pruned or
    post-RFT) and the channel overlap with another selection where the analysis compares two."""
    dense_states = _states(KEY_DIM, config["model"], "dense")
    filters = [[[round(_unit(name, h, k, w) - 0.5, 3) for w in range(2)] for k in range(2)] for h in range(HEADS)]
    conv = {side: {"within_head": [round(_unit(config["model"], side, h), 3) for h in range(HEADS)],
                   "across_heads": round(_unit(config["model"], side, "across"), 3),
                   "dead_filters": int(3 * _unit(config["model"], side, "dead")), "filters": filters}
            for side in ("q", "k")}
    extra = {"model_type": "delta_net", "key_heads": HEADS, "key_dim": KEY_DIM, "layers": list(range(LAYERS)),
             "dense": {"states": dense_states, "conditioning": _conditioning(config["model"], "dense")},
             "utilization_summary": {"dense": _summary(dense_states)},
             "conv_similarity": {str(layer): conv for layer in range(LAYERS)}}
    if config["method"] is None:
        return extra
    kept = max(1, round(KEY_DIM * (1 - config["ratio"])))
    states = _states(kept, name)
    extra["selection"] = {"path": "x/selection.json", "method": config["method"], "kept": kept, "model_dir": "x",
                          "conditioning": _conditioning(name), "states": states,
                          "pearson_u": round(2 * _unit(name, "pearson") - 1, 4), "utilization_summary": _summary(states)}
    if config.get("compare"):
        per_layer = {str(layer): [int(kept * _unit(name, layer, h, "overlap") + 0.5) for h in range(HEADS)]
                     for layer in range(LAYERS)}
        counts = sorted(c for row in per_layer.values() for c in row)
        extra["overlap"] = {"per_layer": per_layer, "median": float(counts[len(counts) // 2]), "kept": [kept] * HEADS}
    return extra


def write_rank(root: Path, profile: str) -> None:
    for target in RANK_TARGETS:
        plan = plan_analyses(target, profile)
        for name, config in plan["stages"]["analyze"]:
            path = root / profile / plan["experiment"] / f"{name}.json"
            if path.exists() or _unit(profile, name, "hole") < HOLE:
                continue
            _write(path, _record("analyze", profile, plan["experiment"], config, {}, rank_extra(name, config)))


def write_mqar(root: Path, profile: str) -> None:
    for table in ("figure_mqar", "mqar_seeds"):
        plan = plan_table(None, table, profile, stages=("baseline", "eval-pre"))
        for jobs in plan["stages"].values():
            for name, config in jobs:
                path = root / profile / plan["experiment"] / f"{name}.json"
                if path.exists() or _unit(profile, name, "hole") < HOLE:
                    continue
                salt = json.dumps(config, sort_keys=True)
                metrics = {}
                for cell in CELLS:
                    if _unit(salt, cell, "missing") < 0.05:
                        continue
                    metrics[f"{cell}_acc"] = round(_unit(salt, cell) * 400) / 400
                    metrics[f"{cell}_acc_se"] = round(0.02 * _unit(salt, cell, "se"), 5)
                _write(path, _record("evaluate", profile, plan["experiment"], config, metrics))


def write_state_vs_structure(root: Path, profile: str) -> None:
    for table in ("state_vs_structure", "state_vs_structure_rft"):
        plan = plan_table(None, table, profile, stages=("baseline", "prune", "eval-pre", "eval-post"))
        for stage, jobs in plan["stages"].items():
            for name, config in jobs:
                path = root / profile / plan["experiment"] / f"{name}.json"
                if path.exists() or _unit(profile, name, "hole") < HOLE:
                    continue
                salt = json.dumps(config, sort_keys=True)
                if stage == "prune":
                    metrics = {}
                    for key, before in (("state_bytes", 65536), ("parameters", 1_000_000), ("flops_per_token", 2e6)):
                        metrics[f"{key}_before"] = before
                        metrics[f"{key}_after"] = round(before * (0.3 + 0.6 * _unit(salt, key)))
                    if _unit(salt, "no decode") > 0.2:
                        metrics["decode_speedup"] = round(0.8 + _unit(salt, "speedup"), 4)
                        metrics["decode_ms_per_token"] = round(1 + 5 * _unit(salt, "ms"), 4)
                    _write(path, _record("prune", profile, plan["experiment"], config, metrics))
                else:
                    _write(path, _record("evaluate", profile, plan["experiment"], config,
                                         fixture_metrics(name, config)))


def write_ralimp(root: Path, profile: str) -> None:
    cfg = yaml.safe_load((Path(__file__).resolve().parents[2] / "experiments" / "ralimp_synthetic"
                          / "config.yaml").read_text())
    seeds = cfg["profiles"][profile]["seeds"]
    sweep = cfg["budget_sweep"]
    cells = [(a, m, cfg["budget"]) for a in cfg["activations"] for m in cfg["methods"]]
    cells += [(a, m, b) for a in sweep["activations"] for m in sweep["methods"] for b in sweep["budgets"]]
    for activation, method, budget in dict.fromkeys(cells):
        for seed in seeds:
            name = f"{activation}-{method}-b{budget}-s{seed}"
            if _unit(profile, name, "hole") < HOLE:
                continue
            config = {"activation": activation, "method": method, "budget": budget, "seed": seed}
            mse = round(0.001 + 0.2 * _unit(profile, name), 6)
            _write(root / profile / "ralimp_synthetic" / f"{name}.json",
                   _record("bench", profile, "ralimp_synthetic", config, {"train_mse": mse}))


def write_speed(root: Path, profile: str) -> None:
    folder = root / profile / "speed"
    folder.mkdir(parents=True, exist_ok=True)
    for path in sorted(SPEED.glob("*.json")):
        shutil.copyfile(path, folder / path.name)


WRITERS = {**{t: write_rank for t in RANK_TARGETS},
           **{t: write_speed for t in ("table17", "table18", "table19", "figure4")},
           "figure_mqar": write_mqar, "state_vs_structure": write_state_vs_structure,
           "ralimp_synthetic": write_ralimp}


def write_output_fixtures(results_root: Path) -> None:
    """The fixture results of every target of OUTPUTS, under results_root/<profile>/<experiment>/."""
    done = set()
    for target, profiles in OUTPUTS.items():
        for profile in profiles:
            writer = WRITERS[target]
            if (writer, profile) not in done:
                writer(Path(results_root), profile)
                done.add((writer, profile))


def text_outputs(out_root: Path) -> dict[str, str]:
    """file name -> text of every LaTeX / Markdown file a render wrote under out_root."""
    return {p.name: p.read_text() for p in sorted(Path(out_root).rglob("*")) if p.suffix in (".tex", ".md")}


def golden_dir(profile: str, target: str) -> Path:
    return GOLDEN / profile / target


def render_target(target: str, profile: str, results_root: Path, work: Path) -> tuple[dict[str, str], list[Path]]:
    """Render `target` into `work`; (its text outputs, the figure files written)."""
    import paper_tables

    out, figures = work / "out", work / "figures"
    paper_tables.render(target, profile, results_root=results_root, out_root=out, figures_root=figures, quiet=True)
    return text_outputs(out), sorted(p for p in figures.rglob("*") if p.is_file())


def save_goldens(results_root: Path, work: Path, targets=None) -> None:
    for target, profiles in OUTPUTS.items():
        if targets and target not in targets:
            continue
        for profile in profiles:
            texts, _ = render_target(target, profile, results_root, work / profile / target)
            folder = golden_dir(profile, target)
            shutil.rmtree(folder, ignore_errors=True)
            if texts:
                folder.mkdir(parents=True)
            for name, text in texts.items():
                (folder / name).write_text(text)
