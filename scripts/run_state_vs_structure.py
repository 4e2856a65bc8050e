"""Run the tiny state_vs_structure tasks in phases, so that a partial run on a busy machine leaves complete
comparisons: (1) prune + pre-RFT evaluation of DRRQR and shed-mixer for seeds 0 and 1, (2) the same for Grad and
the combination, (3) RFT + post-RFT evaluation in the same order, (4) seed 2. Writes the same result files, with
the same config keys, as `make state_vs_structure` (state_reduction.pipeline.run_task), which then reruns nothing.
A failing task is reported and the others go on."""

import sys
import traceback

import torch

from state_reduction.pipeline import plan_tasks, run_task

torch.set_num_threads(1)
tasks = plan_tasks("state_vs_structure", "tiny")
cells = [t for t in tasks if t.cell is not None]
PRE, POST = ("prune", "eval-pre"), ("rft", "eval-post")


def pick(methods, seeds):
    return [t for t in cells if t.cell.method in methods and dict(t.cell.vary).get("seed") in seeds]


main, extra = ("drrqr", "shed-mixer"), ("grad", "shed-mixer+drrqr")
phases = [([t for t in tasks if t.cell is None], ("baseline",)),
          (pick(main, (0, 1)), PRE), (pick(extra, (0, 1)), PRE), (pick(main, (0, 1)), POST),
          (pick(extra, (0, 1)), POST), (pick(main + extra, (2,)), PRE)]
failed = []
for group, stages in phases:
    for t in group:
        print(f"task {t.name} {stages}", flush=True)
        try:
            run_task("state_vs_structure", t.name, "tiny", stages=stages)
        except Exception:  # noqa: BLE001  (report and go on)
            traceback.print_exc()
            failed.append(t.name)
print(f"done; failed: {failed}", flush=True)
sys.exit(1 if failed else 0)
