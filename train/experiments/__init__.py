"""Studies built on the trainer: continued pretraining (cpt) and its staged chains, the
language-model comparison, long-context retrieval, GDN decay spectra."""
