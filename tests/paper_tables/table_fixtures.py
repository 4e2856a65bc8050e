"""Synthetic result files for the equivalence check of the table renderers (tests/paper_tables/test_golden.py).

FIXTURES, not measurements: every evaluation result a table reads (the pipeline's plan for the table: dense
baselines, pre- and post-RFT evaluations of every cell, replicate and variation) is written with deterministic
made-up metrics, a few results left out (holes) and a few metrics NaN, so that the renderers' marks, holes,
confidence intervals and comparisons are all exercised. The rendered LaTeX / Markdown of these fixtures is
saved under tests/paper_tables/golden/ (`python tests/paper_tables/table_fixtures.py`; the goldens were rendered
with `--scripts` by the per-table scripts of b558dfa, before paper_tables became a package) and compared byte for
byte by test_golden.py.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from pathlib import Path

from state_reduction.pipeline import plan_table
from state_reduction.results import build_result, config_key

GOLDEN = Path(__file__).resolve().parent / "golden"
# the tables whose inputs are evaluation results of the pipeline (both profiles)
TABLES = ["table1", "table3", "table8", "table9", "table10", "table12", "table13", "table20", "table21", "table22",
          "table23", "table24", "table2", "table7", "table16", "table4", "table11", "table14", "table15"]
PROFILES = ["tiny", "paper"]
# tiny-only companion tables, whose cells the MQAR columns of Tables 4, 11 and 12 read (written, not rendered alone)
COMPANIONS = {"tiny": ["recall_table4", "recall_table11", "recall_table12"]}
# rendered a second time with replicate seeds (mean ± CI half-width), as `<table>_seeds` goldens
SEEDED = {"table20": [0, 1, 2]}
PPL = ["wiki_word_perplexity", "lambada_ppl", "ptb_word_perplexity"]
ACC = ["zero_shot_avg", "arc_easy_acc_norm", "arc_challenge_acc_norm", "hellaswag_acc_norm", "winogrande_acc",
       "piqa_acc_norm", "lambada_acc", "continuation_acc_norm", "next_sentence_acc", "ruler_2k_acc", "ruler_4k_acc",
       "niah_2k_acc", "niah_4k_acc", "squad_acc", "swde_acc", "ruler_256_acc", "ruler_512_acc", "niah_256_acc",
       "niah_512_acc", "mqar_32_p2_acc", "mqar_32_p8_acc"]


def _unit(*parts) -> float:
    """A deterministic number in [0, 1) from the parts."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2 ** 64


def fixture_metrics(name: str, config: dict) -> dict:
    """Made-up metrics of one result: perplexities 20-220 on a 0.5 grid (so that ties occur), accuracies in
    steps of 1/200; about one metric in forty is NaN (rendered as a hole)."""
    salt = json.dumps(config.get("vary", {}), sort_keys=True)
    out = {}
    for key in PPL:
        out[key] = 20.0 + round(_unit(name, salt, key) * 400) / 2
    for key in ACC:
        out[key] = round(_unit(name, salt, key) * 200) / 200
    for key in PPL + ACC:
        if _unit(name, salt, key, "nan") < 0.025:
            out[key] = math.nan
    return out


def write_fixtures(results_root: Path, tables=TABLES, profiles=PROFILES) -> int:
    """Write the fixture results of `tables` x `profiles` under results_root/<profile>/<experiment>/; about one
    result in fifteen is left out. Returns the number written."""
    template = build_result("evaluate", profile="tiny", experiment="fixture", config={}, metrics={}, wall_time_s=1.0)
    template["provenance"] = {"fixture": True}
    template["created"] = "2026-01-01T00:00:00+00:00"
    written = set()
    plans = [(profile, table, seeds) for profile in profiles for table in tables
             for seeds in ([None] + ([SEEDED[table]] if table in SEEDED else []))]
    plans += [(profile, table, None) for profile in profiles for table in COMPANIONS.get(profile, [])]
    for profile, table, seeds in plans:
        plan = plan_table(None, table, profile, stages=("baseline", "eval-pre", "eval-post"), seeds=seeds)
        for jobs in plan["stages"].values():
            for name, config in jobs:
                path = Path(results_root) / profile / plan["experiment"] / f"{name}.json"
                if path in written or _unit(profile, name, json.dumps(config.get("vary", {}))) < 1 / 15:
                    continue
                record = copy.deepcopy(template)
                record.update(profile=profile, experiment=plan["experiment"], config=config,
                              config_key=config_key(config), metrics=fixture_metrics(name, config))
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(record, indent=1, sort_keys=True))
                written.add(path)
    return len(written)


OUTPUTS = (".tex", ".md", "_vs_paper.md")


def golden_files(profile: str, table: str, seeded: bool = False) -> list[Path]:
    return [GOLDEN / profile / f"{table}{'_seeds' if seeded else ''}{suffix}" for suffix in OUTPUTS]


def main(argv=None) -> None:
    import argparse
    import subprocess
    import sys
    import tempfile

    ap = argparse.ArgumentParser(description="write the fixture results and render them into the goldens (only for "
                                             "an intended change of the rendered tables, named in its commit)")
    ap.add_argument("--scripts", type=Path, default=None,
                    help="render with the per-table scripts of this folder (paper_tables/ of a checkout before the "
                         "package, e.g. b558dfa) instead of paper_tables.render")
    ap.add_argument("--profiles", nargs="+", default=PROFILES)
    ap.add_argument("--tables", nargs="+", default=TABLES)
    ap.add_argument("--outputs", nargs="*", default=None,
                    help="render the goldens of these targets of output_fixtures.OUTPUTS (all if none named: rank "
                         "analysis, speed, MQAR, state vs structure, RaLiMP) instead of the evaluation tables")
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="table_fixtures_"))
    if args.outputs is not None:
        from output_fixtures import save_goldens, write_output_fixtures

        write_output_fixtures(root / "results")
        save_goldens(root / "results", root / "work", targets=args.outputs)
        print("goldens in", GOLDEN)
        return
    print(write_fixtures(root / "results", profiles=args.profiles), "fixture results in", root)
    cases = [(p, t, None) for p in args.profiles for t in args.tables]
    cases += [(p, t, SEEDED[t]) for p in args.profiles for t in args.tables if t in SEEDED]
    for profile, table, seeds in cases:
        out = root / ("out_seeds" if seeds else "out")
        if args.scripts is not None:
            subprocess.run([sys.executable, str(args.scripts / f"{table}.py"), "--profile", profile,
                            "--results-root", str(root / "results"), "--out-root", str(out)]
                           + (["--seeds", *map(str, seeds)] if seeds else []), check=True, stdout=subprocess.DEVNULL)
        else:
            import paper_tables

            paper_tables.render(table, profile, results_root=root / "results", out_root=out,
                                figures_root=out / "figures", quiet=True, seeds=seeds)
        for src, dst in zip([out / profile / f"{table}{s}" for s in OUTPUTS],
                            golden_files(profile, table, seeded=bool(seeds))):
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(src.read_bytes())
    print("goldens in", GOLDEN)


if __name__ == "__main__":
    main()
