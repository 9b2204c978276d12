"""Tools around trained runs: benchmark, profile traces, plots, export."""
