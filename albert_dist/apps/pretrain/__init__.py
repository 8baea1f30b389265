"""`albert-dist train`: main (exit codes), preflight -> JobPlan, the Trainer, its tracking glue, init_from."""
