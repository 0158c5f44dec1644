#!/usr/bin/env bash
# The comparison in one run: the same PPO workload on DeepSpeed ZeRO-3 (compare.py ds), then on
# verl (verl-recipes train verl-vs-deepspeed with compare.py's overrides), then one table and plot
# (compare.py report). Both sides read the same model, the same fixed-length prompts and the same
# batch; every number comes from this one invocation.
#
# usage: recipes/verl-vs-deepspeed/run-both.sh OUT_DIR [NPROC] [--rank R] [--side ds|verl|openrlhf] [compare.py workload options...]
#   NPROC      GPUs for both sides (default 2)
#   --rank R   a rank rehearsal: one local GPU runs rank R of NPROC on both sides (PyTorch's fake
#              process group, VERL_RECIPES_RANK_REHEARSAL=R/NPROC; `verl-recipes train --rank`),
#              full depth; each side's per-rank memory, no speed comparison (one rank's compute is
#              not the job's speed), so no table
#   --side S   run one side only (ds or verl), e.g. the DeepSpeed side of a rank whose verl side is
#              already measured; no table either (the table compares two sides of one invocation);
#              or `openrlhf`: OpenRLHF 0.11.2, the maintained DeepSpeed-based trainer, on the same
#              workload in its own environment (its wheelhouse installed: gpu/README.md, "The
#              peers"), under the monitor (`verl-recipes peers run`); not with --rank
#   options    e.g. --batch 64 --warmup-steps 2 --measured-steps 5 (compare.py ds --help)
#   LAYERS     env: truncate the synthetic Qwen2-7B (full width) to this many layers; default: all
#              layers on 2+ GPUs, 8 on one (ZeRO-3 states of the full model need two H200s)
# On a host without internet, install the wheelhouse first (gpu/README.md).
set -euo pipefail

out=${1:?usage: run-both.sh OUT_DIR [NPROC] [compare.py workload options...]}
nproc=${2:-2}
shift $(( $# >= 2 ? 2 : 1 ))
workload=("$@")
rank=""
side=both
while [[ "${workload[0]:-}" == --rank || "${workload[0]:-}" == --side ]]; do
  case "${workload[0]}" in
    --rank) rank=${workload[1]:-none} ;;
    --side) side=${workload[1]:-none} ;;
  esac
  workload=("${workload[@]:2}")
done
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
compare="$here/compare.py"
command -v verl-recipes >/dev/null || { echo "run-both.sh: verl-recipes is not installed (pip install -e '.[gpu]')" >&2; exit 2; }
[[ "$nproc" =~ ^[1-9][0-9]*$ ]] || { echo "run-both.sh: NPROC must be a positive number of GPUs, got '$nproc'" >&2; exit 2; }
if [[ -n "$rank" ]]; then
  [[ "$rank" =~ ^[0-9]+$ && "$rank" -lt "$nproc" ]] || { echo "run-both.sh: --rank needs a rank below NPROC ($nproc), got '$rank'" >&2; exit 2; }
fi
[[ "$side" == both || "$side" == ds || "$side" == verl || "$side" == openrlhf ]] || { echo "run-both.sh: --side takes ds, verl or openrlhf, got '$side'" >&2; exit 2; }
[[ "$side" != openrlhf || -z "$rank" ]] || { echo "run-both.sh: --side openrlhf runs the job itself; a rank rehearsal (--rank) is verl's and the DeepSpeed loop's" >&2; exit 2; }
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1} PYTHONUNBUFFERED=1

layers=${LAYERS:-}
if [[ -z "$layers" && "$nproc" == 1 ]]; then layers=8; fi
# a rehearsed rank holds its share of the whole model: full depth unless LAYERS says otherwise
ds_procs=$nproc
verl_rank=()
if [[ -n "$rank" ]]; then
  ds_procs=1
  verl_rank=(--rank "$rank")
fi
cache=${VERL_RECIPES_CACHE:-$HOME/.cache/verl-recipes}
model="$cache/models/qwen2-7b-full-width-L${layers:-all}"
if [[ ! -f "$model/config.json" ]]; then
  verl-recipes synth-model --arch qwen2-7b --scale full-width --device cuda ${layers:+--layers "$layers"} --out "$model"
fi
src="$cache/data/arith"
[[ -f "$src/train.parquet" ]] || verl-recipes dataset --out "$src"
mkdir -p "$out/data"
python3 "$compare" prep-data --model "$model" --data "$src/train.parquet" --out "$out/data/train.parquet"
cp "$out/data/train.parquet" "$out/data/test.parquet"

if [[ "$side" == openrlhf ]]; then
  echo "== OpenRLHF PPO (every weight trained, ZeRO-3, vLLM) on $nproc GPU(s), same workload"
  python3 "$compare" openrlhf-args --model "$model" --data "$out/data/train.parquet" --gpus "$nproc" \
    --run-dir "$out/openrlhf" --out "$out/openrlhf-args.json" "${workload[@]}"
  verl-recipes peers run openrlhf --args-from "$out/openrlhf-args.json" --model "$model" \
    --data "$out/data/train.parquet" --gpus "$nproc" --run-dir "$out/openrlhf"
  echo "== results: $out/openrlhf/report.md (OpenRLHF); the DeepSpeed loop and verl: --side ds, --side verl"
  exit 0
fi

if [[ "$side" != verl ]]; then
  echo "== 1/3 DeepSpeed ZeRO-3 PPO on $nproc GPU(s)${rank:+ (rank rehearsal: rank $rank of $nproc on one GPU)}"
  (
    if [[ -n "$rank" ]]; then export VERL_RECIPES_RANK_REHEARSAL="$rank/$nproc"; fi
    python3 -m torch.distributed.run --standalone --nproc_per_node "$ds_procs" "$compare" ds \
      --model "$model" --data "$out/data/train.parquet" --out "$out/ds" "${workload[@]}"
  )
  # `ds` also writes the run's phases, metrics and provenance: the monitor's report reads them as a verl run's
  verl-recipes report "$out/ds"
fi

if [[ "$side" != ds ]]; then
  echo "== 2/3 verl PPO, same workload"
  sets=()
  steps=7
  while IFS= read -r line; do
    line=${line% \\}
    case "$line" in
      # the launcher owns paths, GPU counts, steps and logging
      data.train_files=* | data.val_files=* | *.model.path=* | trainer.n_gpus_per_node=* | trainer.nnodes=* | trainer.logger=*) ;;
      trainer.total_training_steps=*) steps=${line#*=} ;;
      *) sets+=(--set "$line") ;;
    esac
  done < <(python3 "$compare" verl-overrides --model "$model" --data "$out/data/train.parquet" --gpus "$nproc" "${workload[@]}")
  verl-recipes train verl-vs-deepspeed --model "$model" --data "$out/data" --gpus "$nproc" --steps "$steps" \
    "${verl_rank[@]}" "${sets[@]}" --run-dir "$out/verl" --quiet
fi

if [[ -n "$rank" || "$side" != both ]]; then
  why="one side only (--side $side)"
  if [[ -n "$rank" ]]; then why="a rank rehearsal: one rank's compute is not the job's speed"; fi
  where=()
  if [[ "$side" != verl ]]; then where+=("$out/ds/report.md (DeepSpeed)"); fi
  if [[ "$side" != ds ]]; then where+=("$out/verl/report.md (verl)"); fi
  echo "== 3/3 no table ($why); results: ${where[*]}"
  exit 0
fi

echo "== 3/3 one table"
python3 "$compare" report --ds "$out/ds" --verl "$out/verl/metrics.jsonl" --verl-gpus "$nproc" \
  --verl-monitor "$out/verl/summary.json" --out "$out"
