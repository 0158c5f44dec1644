#!/usr/bin/env bash
# `verl-recipes vllm-pool` records into a campaign's run folder: one engine with the process's
# allocator settings and every case (verl's gradual arrival, batched, logprobs off, greedy), then
# one engine per allocator setting that may bound the growth, verl's case only, and one at half
# max_num_seqs, verl's case and one batch. Each engine is a
# JSON record of its own; a setting that fails does not stop the next.
#
# usage: bash gpu/probes/vllm-pool.sh RUN_DIR [vllm-pool arguments...]   (e.g. --verl-example gsm8k-quickstart)
set -euo pipefail
run=${1:?usage: gpu/probes/vllm-pool.sh RUN_DIR [ARGS...]}
shift
mkdir -p "$run"
rc=0
# each engine under a limit of its own, so one that hangs leaves the others their time (SIGTERM:
# the probe writes the rounds it has read); 330 + 3 x 120 s and their grace fit the campaign line's 780
timeout --kill-after=20 330 verl-recipes vllm-pool "$@" --out "$run/vllm-pool-default.json" || rc=$?
# settings that coexist with sleep mode in vLLM 0.24 (cumem.py turns expandable segments off only
# while it allocates its own pool); file names carry the setting with ':' and ',' made '-'.
# garbage_collection_threshold is left out: it acts against set_per_process_memory_fraction, which
# vLLM's GPU worker never sets, so below the whole card it does nothing.
for conf in max_split_size_mb:128 expandable_segments:True; do
  name=${conf//[:,]/-}
  timeout --kill-after=20 120 verl-recipes vllm-pool "$@" --cases verl --alloc-conf "$conf" --out "$run/vllm-pool-$name.json" || rc=$?
done
# half the sequences a step: a sampler term (fp32 logits and logprobs of max_num_seqs x vocabulary)
# halves with it, the allocator's fragmentation need not
timeout --kill-after=20 120 verl-recipes vllm-pool "$@" --cases verl,batched \
  --set actor_rollout_ref.rollout.max_num_seqs=128 --out "$run/vllm-pool-max-num-seqs-128.json" || rc=$?
# the records hold every reading (tens of thousands of lines): kept gzipped, as the run logs are
find "$run" -maxdepth 1 -name 'vllm-pool-*.json' -exec gzip -f {} +
exit "$rc"
