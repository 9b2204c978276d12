"""Tokenizers and the data pipeline: documents -> packed rows -> batches (grain)."""
