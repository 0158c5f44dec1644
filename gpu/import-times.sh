#!/usr/bin/env bash
# How long a fresh Python takes to import what verl's start-up processes import. Each of vLLM's
# server actor, engine core and GPU worker is a new process (20-42 s apiece in the 7B runs' start-up
# tables); this says how much of that is the imports alone, and whether their bytecode is cached.
#
# usage: gpu/import-times.sh OUT_DIR   (a campaign line: `bash gpu/import-times.sh`)
# IMPORT_MODULES (default: torch transformers ray vllm verl.trainer.main_ppo) and IMPORTTIME_MODULE
# (default vllm) name what is imported; IMPORT_ROUNDS (default 1) how many times each is timed.
# OUT_DIR gets import-times.tsv (round, bytecode or source, module, wall s), bytecode.txt and the
# slowest imports of vLLM (python -X importtime, top 40 by cumulative time, with the bytecode).
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
    cached=0
    [[ -n "${PYTHONPYCACHEPREFIX:-}" && -d "$PYTHONPYCACHEPREFIX$dir" ]] && cached=$(find "$PYTHONPYCACHEPREFIX$dir" -name '*.pyc' | wc -l)
    printf '%s %s: %s .py, %s .pyc beside them, %s in PYTHONPYCACHEPREFIX\n' "$mod" "$dir" \
      "$(find "$dir" -name '*.py' | wc -l)" "$(find "$dir" -name '*.pyc' | wc -l)" "$cached"
  done
} >"$out/bytecode.txt" 2>&1
# Side by side: "source" without the bytecode prefix `offline-host.sh install` writes (each module
# compiled from source, as every process did before it), "bytecode" with it (as the runs start now).
printf 'round\tbytecode\tmodule\twall_s\n' >"$out/import-times.tsv"
TIMEFORMAT=%R
prefix=${PYTHONPYCACHEPREFIX:-}
for round in $(seq "${IMPORT_ROUNDS:-1}"); do
  for mode in source bytecode; do
    for mod in ${IMPORT_MODULES:-torch transformers ray vllm verl.trainer.main_ppo}; do
      if [[ "$mode" == source ]]; then
        t=$( { time env -u PYTHONPYCACHEPREFIX python3 -c "import $mod" >/dev/null 2>&1 || echo "failed"; } 2>&1 | tr '\n' ' ' )
      else
        t=$( { time python3 -c "import $mod" >/dev/null 2>&1 || echo "failed"; } 2>&1 | tr '\n' ' ' )
      fi
      label=$mode
      [[ "$mode" == bytecode && -n "$prefix" ]] && label="bytecode ($prefix)"
      printf '%s\t%s\t%s\t%s\n' "$round" "$label" "$mod" "$t" >>"$out/import-times.tsv"
    done
  done
done
top=${IMPORTTIME_MODULE:-vllm}
python3 -X importtime -c "import $top" 2>"$out/importtime-vllm.raw" || true
# awk, not head: head closing the pipe early ends the script with SIGPIPE (141) under pipefail
{ head -n 1 "$out/importtime-vllm.raw"; tail -n +2 "$out/importtime-vllm.raw" | sort -t'|' -k2 -n -r | awk 'NR <= 40'; } \
  >"$out/importtime-vllm-top40.txt"
rm -f "$out/importtime-vllm.raw"
cat "$out/bytecode.txt" "$out/import-times.tsv"
