"""Ray on a Slurm allocation. Standard library only: the launcher runs on the host's bare python3."""
