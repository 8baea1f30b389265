"""The SOP weight schedule (albert_dist.engine.objective) inside a real Trainer's backward pass, one trainer in
this process; the same run checks the trainer's data path (loader depth, data wait, maskless unpadded batches)."""
from helpers import read_metrics

from albert_dist.engine import metric_names as names


def test_trainer_backward_uses_the_scheduled_sop_weight(tmp_path, monkeypatch):
    """SOP weight 0 for steps 0-1, 1 from step 2 (one trainer in this process: DeepSpeed keeps its groups).
    The same run, at gradient accumulation 3 with one loader worker: the loader keeps a step's 3 micro-batches in
    flight, every step logs its data wait, and the model gets no mask exactly for the batches without padding."""
    import torch

    from albert_dist.config import load_config
    from albert_dist.data.tokenizer import PAD_ID
    from albert_dist.distributed.env import discover
    from albert_dist.model import AlbertForPreTraining
    from albert_dist.apps.pretrain.preflight import plan_job
    from albert_dist.apps.pretrain.trainer import Trainer

    masks = []  # per forward: None (no mask given) or whether the given mask was all ones
    forward = AlbertForPreTraining.forward

    def spy(self, input_ids, attention_mask, *args, **kwargs):
        masks.append(None if attention_mask is None else bool(attention_mask.all()))
        assert attention_mask is not None or not (input_ids == PAD_ID).any()
        return forward(self, input_ids, attention_mask, *args, **kwargs)

    monkeypatch.setattr(AlbertForPreTraining, "forward", spy)
    overrides = ["model.num_hidden_layers=1", "model.num_hidden_groups=1", "model.hidden_size=32",
                 "model.embedding_size=16", "model.intermediate_size=64", "model.num_attention_heads=2",
                 "model.max_position_embeddings=32", "data.max_seq_length=32", "data.max_predictions_per_seq=5",
                 "data.num_workers=1", "data.short_seq_prob=0.5", "data.validation=[]", "engine.zero_stage=0",
                 "engine.gradient_accumulation_steps=3",
                 "engine.train_micro_batch_size_per_gpu=2", "optimizer.weight_decay=0.0", "optimizer.warmup_steps=0",
                 "max_steps=3", "log_interval_steps=1", "eval_interval_steps=0", "checkpoint.save_interval_steps=0",
                 "tracking.enabled=false", "progress_bar=false", f"run_dir={tmp_path}", "objective.sop_start_step=2"]
    cfg = load_config(None, overrides)
    trainer = Trainer(plan_job(cfg, discover()))
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
    assert trainer.train_loader.num_workers * trainer.train_loader.prefetch_factor >= 3
    waits = read_metrics(tmp_path, names.PERF_DATA_WAIT_S)
    assert len(waits) == 3 and all(r[names.PERF_DATA_WAIT_S] > 0 and 0 < r[names.PERF_DATA_WAIT_SHARE] < 1
                                   for r in waits), waits
    assert len(masks) == 9 and None in masks and False in masks and True not in masks, masks
