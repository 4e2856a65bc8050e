# Slurm job arrays (state_reduction.slurm, slurm/template.sbatch):
#   make submit EXP=deltanet_gdn PROFILE=paper [TABLES="table20 table1"]   (re)submit what is not done
#   make status [EXP=deltanet_gdn] [PROFILE=paper]                          done / running / failed (with logs)
#   make slurm-scripts                                                      regenerate slurm/<experiment>-paper.sbatch
.PHONY: submit status slurm-scripts
EXP ?=
TABLES ?=
SLURM_EXPERIMENTS = $(if $(EXP),$(EXP),$(notdir $(patsubst %/config.yaml,%,$(wildcard experiments/*/config.yaml))))

submit: setup
	@test -n "$(EXP)" || { echo "usage: make submit EXP=<experiment> [PROFILE=tiny|paper] [TABLES='table20 ...']"; exit 2; }
	$(VENV)/bin/state-reduction slurm submit $(EXP) --profile $(PROFILE) $(if $(TABLES),--tables $(TABLES))

status: setup
	@rc=0; for e in $(SLURM_EXPERIMENTS); do $(VENV)/bin/state-reduction slurm status $$e --profile $(PROFILE) || rc=1; done; exit $$rc

slurm-scripts: setup
	$(VENV)/bin/state-reduction slurm generate all --profile paper
