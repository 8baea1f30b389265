"""albert_dist: distributed ALBERT pretraining with grouped cross-layer sharing on DeepSpeed ZeRO."""

__version__ = "0.1.0"
