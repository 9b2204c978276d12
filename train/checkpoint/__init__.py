"""Checkpoints: Orbax storage of the train state and the data iterator, the run files beside
them (config, tokenizer, provenance), and the preemption signal."""
