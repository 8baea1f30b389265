"""The SOP weight schedule (albert_dist.engine.objective) inside a real Trainer's backward pass, one trainer in
this process."""
from helpers import read_metrics

from albert_dist.engine import metric_names as names


def test_trainer_backward_uses_the_scheduled_sop_weight(tmp_path):
    """SOP weight 0 for steps 0-1, 1 from step 2 (one trainer in this process: DeepSpeed keeps its groups)."""
    import torch

    from albert_dist.config import load_config
    from albert_dist.trainer import Trainer

    overrides = ["model.num_hidden_layers=1", "model.num_hidden_groups=1", "model.hidden_size=32",
                 "model.embedding_size=16", "model.intermediate_size=64", "model.num_attention_heads=2",
                 "model.max_position_embeddings=32", "data.max_seq_length=32", "data.max_predictions_per_seq=5",
                 "data.num_workers=0", "data.validation=[]", "engine.zero_stage=0",
                 "engine.train_micro_batch_size_per_gpu=2", "optimizer.weight_decay=0.0", "optimizer.warmup_steps=0",
                 "max_steps=3", "log_interval_steps=1", "eval_interval_steps=0", "checkpoint.save_interval_steps=0",
                 "tracking.enabled=false", "progress_bar=false", f"run_dir={tmp_path}", "objective.sop_start_step=2"]
    trainer = Trainer(load_config(None, overrides))
    head = lambda: trainer.engine.module.sop_classifier.classifier.weight.detach().clone()  # noqa: E731
    try:
        trainer.setup()
        initial = head()
        trainer.cfg.max_steps = 2  # stop after the two MLM-only steps (the lr schedule stays the 3-step one)
        trainer.train()
        mlm_only = head()
        trainer.cfg.max_steps = 3
        trainer.train()
        final = head()
    finally:
        trainer.close("FINISHED")
    # Weight 0: the SOP head's gradient is 0 and, without weight decay, AdamW leaves it exactly as it was.
    assert torch.equal(initial, mlm_only)
    assert not torch.equal(mlm_only, final)
    assert [r[names.TRAIN_SOP_WEIGHT] for r in read_metrics(tmp_path, names.TRAIN_SOP_WEIGHT)] == [0.0, 0.0, 1.0]
