#!/usr/bin/env bash
# Start a one-node Slurm on this host for the `slurm`-marked tests; safe to run twice.
#
# Installs Debian's slurmctld, slurmd, munge and slurm-client when missing, writes a slurm.conf
# for this host under a scratch folder, starts munged, slurmctld and slurmd in the background and
# waits until `sinfo` shows the node idle. Debian's Slurm is built without multiple-slurmd
# support, so this is one Slurm node: the Ray bootstrap probes multi-node by starting several
# Ray nodes on it as separate job steps (see common/verl_recipes/cluster/).
#
# Clients find the configuration through /etc/slurm/slurm.conf, which this script links to the
# scratch copy when no other slurm.conf is there; otherwise it says to export SLURM_CONF.
#
#   VERL_SLURM_DIR   scratch folder for slurm.conf, state, spool, logs (default /tmp/verl-recipes-slurm)
#   SLURM_WAIT_S     seconds to wait for the node to be idle (default 60)
# Stop it with .ci/slurm-down.sh.
set -euo pipefail

dir="${VERL_SLURM_DIR:-/tmp/verl-recipes-slurm}"
wait_s="${SLURM_WAIT_S:-60}"
conf="$dir/etc/slurm.conf"
node="$(hostname -s)"

die() { echo "slurm-up: $*" >&2; exit 2; }
# shellcheck source=/dev/null
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # close_fds

[[ "$wait_s" =~ ^[1-9][0-9]*$ ]] || die "SLURM_WAIT_S must be a whole number of seconds > 0, got '$wait_s'"
[[ "$(id -u)" == 0 ]] || die "run as root: it installs packages and starts munged, slurmctld and slurmd"
[[ "$dir" == /* ]] || die "VERL_SLURM_DIR must be an absolute path, got '$dir'"

# SLURM_CONF from the caller wins over /etc/slurm/slurm.conf in every Slurm command.
if [[ -n "${SLURM_CONF:-}" && "$SLURM_CONF" != "$conf" ]]; then
  die "SLURM_CONF=$SLURM_CONF points at another cluster; unset it or set it to $conf"
fi
export SLURM_CONF="$conf"

node_state() { sinfo -h -n "$node" -o '%T' 2>/dev/null | head -n 1; }
running() { [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# Where no slurmctld answers, sinfo spends about 9 s on each call before it gives up: ask only the
# slurmctld this script started (its pid file), and once.
state=""
if [[ -f "$conf" ]] && running "$dir/run/slurmctld.pid"; then
  state="$(node_state)"
fi
if [[ "$state" == idle* || "$state" == mixed* || "$state" == allocated* ]]; then
  echo "slurm-up: node $node already up ($state); SLURM_CONF=$conf"
  exit 0
fi

missing=()
command -v slurmctld >/dev/null 2>&1 || missing+=(slurmctld)
command -v slurmd >/dev/null 2>&1 || missing+=(slurmd)
command -v munged >/dev/null 2>&1 || missing+=(munge)
command -v sbatch >/dev/null 2>&1 || missing+=(slurm-client)
if ((${#missing[@]} > 0)); then
  echo "slurm-up: installing ${missing[*]}"
  apt-get update -qq
  # No init system here: policy-rc.d 101 stops the packages from trying to start their services.
  policy=/usr/sbin/policy-rc.d
  own_policy=0
  if [[ ! -e "$policy" ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    own_policy=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if ((own_policy)); then rm -f "$policy"; fi
fi

# munge: one key for the host (the package may have made one), then the daemon.
key=/etc/munge/munge.key
if [[ ! -s "$key" ]]; then
  install -d -o munge -g munge -m 700 /etc/munge
  dd if=/dev/urandom of="$key" bs=1024 count=1 status=none
fi
chown munge:munge "$key"
chmod 400 "$key"
install -d -o munge -g munge -m 755 /run/munge
install -d -o munge -g munge -m 700 /var/lib/munge /var/log/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  echo "slurm-up: starting munged"
  (close_fds; exec runuser -u munge -- munged --force)
fi

cpus="$(nproc)"
mem_mb="$(awk '/^MemTotal:/ {printf "%d", $2 / 1024 * 0.8}' /proc/meminfo)"
mkdir -p "$dir/etc" "$dir/state" "$dir/spool" "$dir/log" "$dir/run"
cat >"$conf.new" <<EOF
# Written by .ci/slurm-up.sh for a one-node test cluster on $node.
ClusterName=verl-recipes-ci
SlurmctldHost=$node
AuthType=auth/munge
CryptoType=crypto/munge
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/slurmd-%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
SlurmctldPort=6817
SlurmdPort=6818
KillWait=10
InactiveLimit=0
MinJobAge=300
SchedulerType=sched/backfill
NodeName=$node CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=ci Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
mv "$conf.new" "$conf"

etc_conf=/etc/slurm/slurm.conf
if [[ -L "$etc_conf" && "$(readlink "$etc_conf")" == "$conf" ]]; then
  :
elif [[ -e "$etc_conf" || -L "$etc_conf" ]]; then
  echo "slurm-up: $etc_conf belongs to another setup; Slurm commands need: export SLURM_CONF=$conf"
else
  mkdir -p /etc/slurm
  ln -s "$conf" "$etc_conf"
fi

if ! running "$dir/run/slurmctld.pid"; then
  echo "slurm-up: starting slurmctld (log: $dir/log/slurmctld.log)"
  (close_fds; exec slurmctld -f "$conf")
fi
if ! running "$dir/run/slurmd-$node.pid"; then
  echo "slurm-up: starting slurmd (log: $dir/log/slurmd-$node.log)"
  (close_fds; exec slurmd -f "$conf")
fi

for ((i = 0; i < wait_s; i++)); do
  state="$(node_state)"
  if [[ "$state" == idle* ]]; then
    echo "slurm-up: node $node idle after ${i}s (${cpus} CPUs, ${mem_mb} MB); SLURM_CONF=$conf"
    exit 0
  fi
  sleep 1
done
echo "slurm-up: node $node not idle within ${wait_s}s (state '${state:-none}'); last lines of the logs:" >&2
tail -n 10 "$dir/log/slurmctld.log" "$dir/log/slurmd-$node.log" >&2 || true
exit 1
