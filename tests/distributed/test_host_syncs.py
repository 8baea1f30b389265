"""No device->host sync and no device drain in the micro-steps: the real training loop, 2 gloo ranks, under a counter.

`host_sync_worker.py` counts every host read of a tensor (``item``, ``tolist``, ``cpu``, ``numpy``, ``__bool__``,
``__int__``, ``__float__``, ``__index__``, ``__array__``) during `Trainer.train()`, by loop phase and by owner
(albert_dist, DeepSpeed, other). Jobs: ZeRO-0 fp32 (the exact clipping of `albert_dist.engine.grad_norm`) and ZeRO-2,
both with clipping on and gradient accumulation 2, 6 steps logged every 3. Between log steps albert_dist reads
nothing from the device but the documented stop flag (one read per optimiser step, `Trainer._agree_stop`); at a
log step `_log_train` reads the interval's sums and `_check_divergence` the divergence flags (accumulated on the
device every step, `albert_dist.engine.divergence`); and each micro-batch's host copy is read for padding before
its copy to the device (`drop_full_mask`: host memory, no device sync on a GPU). DeepSpeed's own reads inside
`engine.step` are counted and reported (docs/training-loop.md), not asserted: they are upstream's. Device drains
(``synchronize`` through DeepSpeed's accelerator or torch, albert_dist's or DeepSpeed's) are asserted: none
inside the accumulation window, at most one per optimizer step (DeepSpeed's throughput timer, on by default,
made two per micro-step).

Controls: the same counter sees the dynamic MLM gather's host read (``int(counts.max())``) in a plain forward, and
none in the static gather's; it sees the synchronize of DeepSpeed's throughput timer under DeepSpeed's default
config, and none under ours. The stop flag is agreed on a host tensor over `host_group`, never a device copy.
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from fixtures.ranks import CONFIG, run_ok
from host_sync_worker import METHODS, SyncCounter

pytestmark = pytest.mark.distributed

WORKER = Path(__file__).with_name("host_sync_worker.py")
STEPS, LOG_EVERY, WORLD = 6, 3, 2
GA = 2  # the shared job's gradient_accumulation_steps (tests/fixtures/ranks.py)
#: the shared tiny job (tests/fixtures/ranks.py), clipped, logged every 3 steps, saved only at the end
OVERRIDES = [f"max_steps={STEPS}", f"log_interval_steps={LOG_EVERY}", "engine.gradient_clipping=1.0",
             "checkpoint.save_interval_steps=0", "data.num_workers=0"]


def run_job(tmp_path: Path, zero_stage: int) -> list[dict]:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    out = tmp_path / f"counts{zero_stage}"
    out.mkdir()
    run_ok(WORLD, config, tmp_path / f"run{zero_stage}", ["--out", str(out)],
           [*OVERRIDES, f"engine.zero_stage={zero_stage}"], command=[sys.executable, str(WORKER)])
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("zero_stage", [0, 2])
def test_micro_steps_read_nothing_from_the_device(tmp_path, zero_stage):
    for rank, result in enumerate(run_job(tmp_path, zero_stage)):
        assert result["steps"] == STEPS
        calls = [c for c in result["calls"] if c["method"] != "synchronize"]
        syncs = [c for c in result["calls"] if c["method"] == "synchronize"]
        in_window = [c for c in syncs if c["phase"] == "step" and 0 < c["micro"] < result["ga"]]
        assert result["ga"] == 2 and not in_window, f"rank {rank}: device synchronize inside the accumulation " \
                                                    f"window: {Counter(c['site'] for c in in_window)}"
        assert len(syncs) <= STEPS and max(Counter(c["step"] for c in syncs).values(), default=0) <= 1, syncs
        ours = [c for c in calls if c["owner"] == "ours"]
        in_steps = [c for c in ours if c["phase"] == "step"]
        assert not in_steps, f"rank {rank}: host reads in the micro-steps: {Counter(c['site'] for c in in_steps)}"
        # The documented ones: one stop-flag read per optimiser step, the interval's sums at log steps only.
        stops = Counter(c["step"] for c in ours if c["phase"] == "stop")
        assert stops == {s: 1 for s in range(1, STEPS + 1)}, stops
        log_steps = {c["step"] for c in ours if c["phase"] == "log"}
        assert log_steps == set(range(LOG_EVERY, STEPS + 1, LOG_EVERY)), log_steps
        # save() runs after every step but writes only at the last one here (save_interval_steps: 0)
        assert {c["step"] for c in ours if c["phase"] == "save"} <= {STEPS}
        # the host copy of each micro-batch, read for its padding before it goes to the device (drop_full_mask)
        batch = Counter((c["site"], c["method"]) for c in ours if c["phase"] == "batch")
        assert batch == {("data/pretraining.py:drop_full_mask", "__bool__"): STEPS * GA}, batch
        assert not [c for c in ours if c["phase"] not in ("step", "stop", "log", "save", "batch", "divergence")]
        # the divergence flags accumulate on the device every step (the step phase above reads nothing) and are
        # read at log steps only here (no save between them): albert_dist.engine.divergence
        divergence = {c["step"] for c in ours if c["phase"] == "divergence"}
        assert divergence == set(range(LOG_EVERY, STEPS + 1, LOG_EVERY)), divergence
        upstream = Counter((c["site"], c["method"]) for c in calls if c["owner"] != "ours" and c["phase"] == "step")
        print(f"ZeRO-{zero_stage} rank {rank}: DeepSpeed/other host reads in {STEPS} steps: {dict(upstream)}")


class _Step:
    step = 0


def test_control_the_counter_sees_the_dynamic_gather(monkeypatch):
    from albert_dist.model import AlbertConfig, AlbertForPreTraining

    torch.manual_seed(0)
    model = AlbertForPreTraining(AlbertConfig(vocab_size=50, embedding_size=8, hidden_size=16, num_hidden_layers=2,
                                              num_attention_heads=2, intermediate_size=24, max_position_embeddings=12))
    labels = torch.full((2, 12), -100)
    labels[:, 3:6] = 7
    batch = {"input_ids": torch.randint(0, 50, (2, 12)), "attention_mask": torch.ones(2, 12, dtype=torch.long),
             "token_type_ids": torch.zeros(2, 12, dtype=torch.long), "mlm_labels": labels,
             "sop_labels": torch.tensor([0, 1])}
    counter = SyncCounter(_Step())
    for method in METHODS:
        monkeypatch.setattr(torch.Tensor, method, counter.wrap(method))
    seen = {}
    for slots in (None, 5):
        model.max_predictions_per_seq = slots
        counter.calls.clear()
        counter.active = True
        out = model(**batch)
        out.loss.backward()
        counter.active = False
        seen[slots] = [(c["site"], c["method"]) for c in counter.calls if c["owner"] == "ours"]
    assert ("model/albert.py:forward", "__int__") in seen[None]
    assert seen[5] == []


def test_control_the_counter_sees_deepspeeds_throughput_timer(monkeypatch):
    """DeepSpeed's ThroughputTimer drains the device at start and stop under its default config (the counter sees
    both), and not at all under the config albert_dist generates."""
    from deepspeed.utils.config import get_timers_config
    from deepspeed.utils.timer import ThroughputTimer

    from albert_dist.engine.config import EngineConfig
    from albert_dist.engine.deepspeed_config import build_deepspeed_config

    counter = SyncCounter(_Step())
    counter.count_synchronize(monkeypatch)
    counter.active = True
    seen = {}
    for name, ds_config in (("default", {}), ("ours", build_deepspeed_config(EngineConfig(), 1, accelerator="cpu"))):
        counter.calls.clear()
        timer = ThroughputTimer(get_timers_config(ds_config), batch_size=1, start_step=0)
        timer.start()  # engine.forward without training_data
        timer.stop(global_step=True)  # engine.step()
        seen[name] = [c["site"] for c in counter.calls]
    assert seen == {"default": ["deepspeed/utils/timer.py:start", "deepspeed/utils/timer.py:stop"], "ours": []}


def test_the_stop_flag_is_agreed_on_a_host_tensor_over_the_host_group(monkeypatch):
    """`Trainer._agree_stop` all-reduces a CPU tensor over `host_group`'s group, even when the trainer's device is
    not the CPU (the meta device stands in for a GPU: a tensor there cannot be read at all)."""
    import signal

    from albert_dist.apps.pretrain import trainer as T
    from albert_dist.job.stop import StopFlag

    reduced = []

    def all_reduce(tensor, op=None, group=None):
        reduced.append((tensor.device.type, group))
        tensor.fill_(int(signal.SIGTERM))  # another rank was signalled

    monkeypatch.setattr(T, "is_multi_rank", lambda: True)
    monkeypatch.setattr(T.dist, "all_reduce", all_reduce)
    trainer = object.__new__(T.Trainer)
    trainer._stop, trainer._host_group, trainer.device = StopFlag(), "gloo-side-group", torch.device("meta")
    trainer.watchdog = None  # no hang watchdog: a bare Trainer (its phase marks are no-ops then)
    assert trainer._agree_stop() == int(signal.SIGTERM)  # the largest flag: the signal number
    assert reduced == [("cpu", "gloo-side-group")]
