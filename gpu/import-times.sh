#!/usr/bin/env bash
# How long a fresh Python takes to import what verl's start-up processes import. Each of vLLM's
# server actor, engine core and GPU worker is a new process (20-42 s apiece in the 7B runs' start-up
# tables); this says how much of that is the imports alone, and whether their bytecode is cached.
#
# usage: gpu/import-times.sh OUT_DIR   (a campaign line: `bash gpu/import-times.sh`)
# OUT_DIR gets import-times.tsv (round, module, wall s), bytecode.txt and the slowest imports of
# vLLM's second round (python -X importtime, top 40 by cumulative time).
set -euo pipefail
out=${1:?usage: gpu/import-times.sh OUT_DIR}
mkdir -p "$out"
{
  python3 -c 'import sys; print("sys.dont_write_bytecode", sys.dont_write_bytecode)'
  echo "PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-} PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-}"
  for mod in torch vllm verl transformers ray; do
    if ! dir=$(python3 -c "import importlib.util as u, os; print(os.path.dirname(u.find_spec('$mod').origin))" 2>/dev/null); then
      echo "$mod: not installed"
      continue
    fi
    printf '%s %s: %s .py, %s .pyc\n' "$mod" "$dir" "$(find "$dir" -name '*.py' | wc -l)" "$(find "$dir" -name '*.pyc' | wc -l)"
  done
} >"$out/bytecode.txt" 2>&1
printf 'round\tmodule\twall_s\n' >"$out/import-times.tsv"
TIMEFORMAT=%R
for round in 1 2; do
  for mod in torch transformers ray vllm verl.trainer.main_ppo; do
    t=$( { time python3 -c "import $mod" >/dev/null 2>&1 || echo "failed"; } 2>&1 | tr '\n' ' ' )
    printf '%s\t%s\t%s\n' "$round" "$mod" "$t" >>"$out/import-times.tsv"
  done
done
python3 -X importtime -c 'import vllm' 2>"$out/importtime-vllm.raw" || true
{ head -n 1 "$out/importtime-vllm.raw"; tail -n +2 "$out/importtime-vllm.raw" | sort -t'|' -k2 -n -r | head -n 40; } \
  >"$out/importtime-vllm-top40.txt"
rm -f "$out/importtime-vllm.raw"
cat "$out/bytecode.txt" "$out/import-times.tsv"
