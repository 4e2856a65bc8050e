#!/bin/bash
# Pretrain one DeltaNet 370M variant of Tables 14/15 with flame (fla-org/flame, not on PyPI), the recipe of the
# paper's 370M models (appendix C.6.1; the authors' flame scripts deltanet_340m.sh / deltanet_2_head_shared_340m.sh):
# fineweb-edu sample-10BT, 19064 steps x 8 GPUs x 32 x 2048 tokens (10.0B), AdamW lr 7e-4 eps 1e-15, 950 warm-up
# steps, cosine to 0.1x, grad clip 1.0, seed 42, tokenizer fla-hub/transformer-1.3B-100B.
#
#   cd <flame checkout> && NGPU=8 bash <this repo>/experiments/pca_vs_shared_conv/flame/pretrain_370m.sh shared_head
#
# VARIANT: no_share (××, the DeltaNet 370M of deltanet_gdn too), shared_head (×✓), shared_all (✓✓). Then convert
# the last checkpoint to a Hugging Face folder, with this package imported so that the shared variants' model
# type resolves, and place it where config.yaml's paper profile looks:
#   python -c "import state_reduction, runpy, sys; sys.argv[0] = 'convert'; \
#     runpy.run_module('flame.utils.convert_dcp_to_hf', run_name='__main__')" \
#     --path outputs/<VARIANT>/370m/10BT --step 19064 --config <model json> --tokenizer fla-hub/transformer-1.3B-100B
#   -> $SR_CHECKPOINTS/delta_net-370M, delta_net_shared_head-370M, delta_net_shared_all-370M
set -euo pipefail
VARIANT=${1:?usage: pretrain_370m.sh no_share|shared_head|shared_all}
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
case "$VARIANT" in
  no_share) CONFIG="$HERE/delta_net_370M.json" ;;
  shared_head) CONFIG="$HERE/delta_net_shared_head_370M.json" ;;
  shared_all) CONFIG="$HERE/delta_net_shared_all_370M.json" ;;
  *) echo "unknown VARIANT '$VARIANT'; accepted: no_share, shared_head, shared_all" >&2; exit 2 ;;
esac
NNODE=${NNODE:-1} NGPU=${NGPU:-8} LOG_RANK=${LOG_RANK:-0} bash train.sh \
  --job.config_file flame/models/fla.toml \
  --job.dump_folder "outputs/$VARIANT/370m/10BT" \
  --model.config "$CONFIG" \
  --model.tokenizer_path fla-hub/transformer-1.3B-100B \
  --experimental.custom_model_path "$HERE/register_shared_conv.py" \
  --optimizer.name AdamW --optimizer.eps 1e-15 --optimizer.lr 7e-4 \
  --lr_scheduler.warmup_steps 950 --lr_scheduler.lr_min 0.1 --lr_scheduler.decay_type cosine \
  --training.batch_size 32 --training.seq_len 2048 --training.context_len 2048 \
  --training.gradient_accumulation_steps 1 --training.max_norm 1.0 --training.skip_nan_inf \
  --training.dataset HuggingFaceFW/fineweb-edu --training.dataset_name sample-10BT --training.dataset_split train \
  --training.steps 19064 --training.num_workers 32 --training.prefetch_factor 2 --training.seed 42 \
  --checkpoint.enable_checkpoint --checkpoint.folder checkpoints --checkpoint.interval 1000 \
  --checkpoint.keep_latest_k 2 --metrics.log_freq 100
