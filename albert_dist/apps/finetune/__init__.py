"""The fine-tuning app: options in, scores out (tasks, metrics, the fine-tune loop, child runs via tracking/)."""
