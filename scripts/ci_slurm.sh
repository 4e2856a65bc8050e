#!/usr/bin/env bash
# CI's Slurm check (issue 9): a real single-node Slurm (scripts/slurm_local_cluster.sh) runs a reduced tiny
# Table 20 sweep (.ci/slurm_table20.yaml) through the generated sbatch script as a job array; then the same
# sweep runs locally, and the results (config keys, metrics) and the rendered table must match. Then a
# deleted result is resubmitted (only its task goes back to Slurm) and a broken experiment's failed tasks are
# listed by `slurm status` with their log paths.
set -euo pipefail
cd "$(dirname "$0")/.."
SR=.venv/bin/state-reduction
PY=.venv/bin/python
WORK=$(mktemp -d /tmp/ci-slurm.XXXXXX)
EXP=.ci/slurm_table20.yaml
trap 'bash scripts/slurm_local_cluster.sh stop' EXIT

bash scripts/slurm_local_cluster.sh start
export WANDB_MODE=offline

echo "== submit the job array (Slurm results in $WORK/slurm)"
$SR slurm submit $EXP --profile tiny --results-root "$WORK/slurm" --out "$WORK/table20.sbatch" --wait 3000
grep -q -- "--array=0-2" "$WORK/table20.sbatch"
for t in deltanet-baseline deltanet-l1-r50 deltanet-drrqr-r50; do
    cmp "$WORK/table20.sbatch" "$WORK/slurm/tiny/deltanet_gdn/runs/$t/job.sbatch"  # the exact script ran
done

echo "== the same sweep locally ($WORK/local)"
$SR run-table table20 --experiment $EXP --profile tiny --results-root "$WORK/local"

echo "== compare results and rendered tables"
$PY - "$WORK" <<'PY'
import sys
from state_reduction.results import compare_results
work = sys.argv[1]
problems = compare_results(f"{work}/slurm/tiny/deltanet_gdn", f"{work}/local/tiny/deltanet_gdn")
print("\n".join(problems) or "results identical (config keys and metrics)")
sys.exit(1 if problems else 0)
PY
for side in slurm local; do
    $PY -m state_reduction.cli render table20 --experiment $EXP --results-root "$WORK/$side" --out-root "$WORK/render-$side" >/dev/null
done
diff "$WORK/render-slurm/tiny/table20.tex" "$WORK/render-local/tiny/table20.tex"
diff "$WORK/render-slurm/tiny/table20.md" "$WORK/render-local/tiny/table20.md"
echo "rendered Table 20 identical"

echo "== wandb: every run mirrored offline with its tags"
$PY - "$WORK/slurm" <<'PY'
import sys
from state_reduction.tracking import offline_runs, read_offline_run
runs = [read_offline_run(d) for d in offline_runs("tiny", sys.argv[1])]
names = sorted(r["name"] for r in runs)
print(f"{len(runs)} offline runs: {', '.join(names)}")
assert len(names) == 9, names
for r in runs:
    assert r["group"] == "tiny/deltanet_gdn" and "experiment:deltanet_gdn" in r["tags"], r
PY

echo "== resubmission runs only what is missing"
rm "$WORK/slurm/tiny/deltanet_gdn/deltanet-l1-r50-eval-post.json"
$SR slurm status $EXP --profile tiny --results-root "$WORK/slurm" && exit 1  # not all done: exit 1
$SR slurm submit $EXP --profile tiny --results-root "$WORK/slurm" --out "$WORK/table20.sbatch" --wait 1200 \
    | tee "$WORK/resubmit.log"
grep -q "1 of 3 tasks (1)" "$WORK/resubmit.log"
$SR slurm submit $EXP --profile tiny --results-root "$WORK/slurm" --out "$WORK/table20.sbatch" | grep -q "nothing to submit"

echo "== failed tasks are listed with their logs"
sed 's#experiments/tiny_models/checkpoints/deltanet#experiments/tiny_models/checkpoints/no-such-model#' $EXP > "$WORK/broken.yaml"
$SR slurm submit "$WORK/broken.yaml" --profile tiny --results-root "$WORK/broken" --out "$WORK/broken.sbatch" \
    --wait 600 > "$WORK/broken.log" && exit 1
cat "$WORK/broken.log"
test "$(grep -c 'failed, log ' "$WORK/broken.log")" = 3
grep -q "no-such-model" "$WORK/broken.log"
echo "slurm CI check passed"
