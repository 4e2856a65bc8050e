"""Run the tiny state_vs_structure tasks one cell at a time (all stages of a cell before the next), seed by seed,
so that a partial run leaves complete cells for every model and method. Writes the same result files, with the
same config keys, as `make state_vs_structure` (state_reduction.pipeline.run_task), which then reruns nothing.
A failing task is reported and the others go on."""

import sys
import traceback

import torch

from state_reduction.pipeline import plan_tasks, run_task

torch.set_num_threads(1)
tasks = plan_tasks("state_vs_structure", "tiny")
order = [t for t in tasks if t.cell is None] + sorted(
    (t for t in tasks if t.cell is not None), key=lambda t: (dict(t.cell.vary).get("seed", 0), t.cell.method, t.model))
failed = []
for t in order:
    print(f"task {t.name}", flush=True)
    try:
        run_task("state_vs_structure", t.name, "tiny")
    except Exception:  # noqa: BLE001  (report and go on)
        traceback.print_exc()
        failed.append(t.name)
print(f"done; failed: {failed}", flush=True)
sys.exit(1 if failed else 0)
