"""Sharded trainer for the FPA and GatedDeltaNet language models (`python -m train --help`)."""
