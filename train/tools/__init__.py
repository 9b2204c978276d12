"""Tools around trained runs: benchmark, profile traces, plots, memory check, export."""
