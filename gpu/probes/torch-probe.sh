#!/usr/bin/env bash
# One torch-only probe of gpu/probes/ into a campaign's run folder: its JSON record as
# RUN_DIR/<probe>.json, its output as the campaign's script.log.
#
# usage: bash gpu/probes/torch-probe.sh RUN_DIR gpu/probes/PROBE.py
set -euo pipefail
run=${1:?usage: gpu/probes/torch-probe.sh RUN_DIR gpu/probes/PROBE.py}
probe=${2:?usage: gpu/probes/torch-probe.sh RUN_DIR gpu/probes/PROBE.py}
[[ -f "$probe" ]] || { echo "torch-probe: no probe $probe" >&2; exit 2; }
mkdir -p "$run"
python3 "$probe" "$run/$(basename "$probe" .py).json"
