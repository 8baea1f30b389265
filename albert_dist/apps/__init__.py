"""The applications: pretraining, fine-tuning, export; each composes the library below it."""
