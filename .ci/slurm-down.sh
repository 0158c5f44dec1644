#!/usr/bin/env bash
# Stop the one-node Slurm that .ci/slurm-up.sh started: cancel its jobs, stop slurmd, slurmctld
# and munged through their pid files (nothing is killed by name), and unlink /etc/slurm/slurm.conf
# if it is our link. The scratch folder is kept for its logs unless SLURM_DOWN_CLEAN=1.
#
#   VERL_SLURM_DIR    the scratch folder slurm-up.sh used (default /tmp/verl-recipes-slurm)
#   SLURM_DOWN_CLEAN  1 = also delete the scratch folder (default 0)
set -euo pipefail

dir="${VERL_SLURM_DIR:-/tmp/verl-recipes-slurm}"
conf="$dir/etc/slurm.conf"
node="$(hostname -s)"

if [[ ! -f "$conf" ]]; then
  echo "slurm-down: no cluster under $dir; nothing to stop"
  exit 0
fi
export SLURM_CONF="$conf"

# Jobs first, so that their steps end while slurmd can still clean them up.
if squeue -h -o '%i' >/dev/null 2>&1; then
  jobs="$(squeue -h -o '%i')"
  if [[ -n "$jobs" ]]; then
    echo "slurm-down: cancelling jobs: $(echo "$jobs" | tr '\n' ' ')"
    # shellcheck disable=SC2086 # one job id a word
    scancel $jobs || true
    for ((i = 0; i < 30; i++)); do
      [[ -z "$(squeue -h -o '%i')" ]] && break
      sleep 1
    done
  fi
fi

stop_pidfile() {
  local name="$1" pidfile="$2" pid
  [[ -s "$pidfile" ]] || return 0
  pid="$(cat "$pidfile")"
  if kill -0 "$pid" 2>/dev/null; then
    echo "slurm-down: stopping $name (pid $pid)"
    kill -TERM "$pid"
    for ((i = 0; i < 20; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; fi
  fi
  rm -f "$pidfile"
}

stop_pidfile slurmd "$dir/run/slurmd-$node.pid"
stop_pidfile slurmctld "$dir/run/slurmctld.pid"
stop_pidfile munged /run/munge/munged.pid

if [[ -L /etc/slurm/slurm.conf && "$(readlink /etc/slurm/slurm.conf)" == "$conf" ]]; then
  rm -f /etc/slurm/slurm.conf
fi
if [[ "${SLURM_DOWN_CLEAN:-0}" == 1 ]]; then
  rm -rf "$dir"
fi
echo "slurm-down: stopped"
