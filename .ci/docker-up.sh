#!/usr/bin/env bash
# Start a local dockerd for the `docker`-marked tests and the image builds; safe to run twice.
#
# Installs Debian's docker.io (dockerd, classic builder: Debian 12 has no buildx) and mmdebstrap
# (images/build.sh makes the base image's root filesystem with it, since Docker Hub is not
# reachable) when they are missing, starts dockerd in the background and waits for `docker info`.
#
#   DOCKERD_LOG     where dockerd writes its log   (default /var/log/verl-recipes-dockerd.log)
#   DOCKERD_WAIT_S  seconds to wait for `docker info` (default 60)
set -euo pipefail

log="${DOCKERD_LOG:-/var/log/verl-recipes-dockerd.log}"
wait_s="${DOCKERD_WAIT_S:-60}"
pidfile=/var/run/docker.pid

die() { echo "docker-up: $*" >&2; exit 2; }
# shellcheck source=/dev/null
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # close_fds

[[ "$wait_s" =~ ^[1-9][0-9]*$ ]] || die "DOCKERD_WAIT_S must be a whole number of seconds > 0, got '$wait_s'"
[[ "$(id -u)" == 0 ]] || die "run as root: it installs packages and starts dockerd"

if docker info >/dev/null 2>&1; then
  echo "docker-up: dockerd already answers"
  exit 0
fi

missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
if ((${#missing[@]} > 0)); then
  echo "docker-up: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# A dockerd that is starting (pid file with a live process) is waited for, not started twice.
if [[ -s "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
  echo "docker-up: dockerd (pid $(cat "$pidfile")) is starting; waiting"
else
  rm -f "$pidfile"
  mkdir -p "$(dirname "$log")"
  echo "docker-up: starting dockerd (log: $log)"
  (close_fds; exec setsid dockerd --pidfile "$pidfile" >>"$log" 2>&1 </dev/null) &
fi

for ((i = 0; i < wait_s; i++)); do
  if docker info >/dev/null 2>&1; then
    echo "docker-up: dockerd ready after ${i}s ($(docker version --format '{{.Server.Version}}'))"
    exit 0
  fi
  sleep 1
done
echo "docker-up: dockerd did not answer within ${wait_s}s; last lines of $log:" >&2
tail -n 20 "$log" >&2
exit 1
