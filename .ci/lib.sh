# shellcheck shell=bash
# Shared by the .ci service scripts (sourced, not run).

# Daemons outlive the script that starts them, so they get none of its open files: a caller that
# holds a lock (`flock LOCK .ci/run`) would otherwise stay locked for as long as the daemon runs.
# Call it in the subshell that execs the daemon: `(close_fds; exec dockerd ...) &`.
close_fds() {
  local fd
  for fd in /proc/"$BASHPID"/fd/*; do
    fd="${fd##*/}"
    if ((fd > 2)); then exec {fd}>&-; fi
  done
}
