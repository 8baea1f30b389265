"""Downstream evaluation: tasks, metrics, model sources, fine-tuning and its MLflow records (`albert-dist finetune`)."""
