"""What a run measured: the monitor, the report, bounds, run comparisons and provenance."""
