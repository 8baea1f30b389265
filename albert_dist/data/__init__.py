"""Pretraining data, read top to bottom: sources -> stream -> examples (pretraining) -> loader; validation; config."""
