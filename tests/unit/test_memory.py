"""The per-device memory estimate (albert_dist.engine.memory) against measurements, and the preflight refusal.

References: the figures `python bench/memory_scale.py --full` measured (DeepSpeed's own tensors walked on 1, 2
and 4 gloo ranks; activations from torch's profiler), stored in bench/results/memory_scale.json and recomputed here
with the current formulas; a live profiler measurement of a small model; the parameter list of the real
model; the refusal against the project's own config loader.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import load_bench

from albert_dist import cli
from albert_dist.apps.pretrain import preflight
from albert_dist.apps.pretrain import main as train_app
from albert_dist.config import load_config
from albert_dist.distributed import group as distributed
from albert_dist.engine import memory
from albert_dist.model import AlbertForPreTraining
from albert_dist.model.sharing import parameter_count, parameter_numels

REPO = Path(__file__).resolve().parents[2]
RECIPE = str(REPO / "configs/pretrain/albert-tiny-wikitext.yaml")
MEASURED = REPO / "bench" / "results" / "memory_scale.json"
LO, HI = 0.8, 1.25



@pytest.mark.parametrize("preset, sharing, groups", [("albert-tiny", "all", 2), ("albert-base", "none", 1),
                                                     ("albert-base", "attention", 3), ("albert-base", "ffn", 1)])
def test_parameter_numels_are_the_models_tensors(preset, sharing, groups):
    cfg = load_config(None, [f"model.preset={preset}", f"model.sharing={sharing}",
                             f"model.num_hidden_groups={groups}"]).model
    model = AlbertForPreTraining(cfg)
    assert sorted(parameter_numels(cfg)) == sorted(p.numel() for p in model.parameters())
    assert sum(parameter_numels(cfg)) == parameter_count(cfg)


# ------------------------------------------------------------------------------ against the measured figures
def _measured() -> dict:
    return json.loads(MEASURED.read_text())


def test_measured_figures_cover_the_issue_cells():
    states = _measured()["states"]
    cells = {(v["preset"], v["stage"], v["world_size"]) for v in states.values()}
    for preset in ("albert-base", "albert-large", "albert-xlarge"):
        for stage in (1, 2, 3):
            for world in (1, 2, 4):
                assert (preset, stage, world) in cells, (preset, stage, world)


def test_model_states_estimate_matches_deepspeeds_tensors():
    """Parameters + gradients + optimiser, the buckets and ZeRO-3's gathered parameters, every measured cell."""
    bad = []
    for key, v in _measured()["states"].items():
        # measured with DeepSpeed's bucket default (bench/memory_scale.py builds its config without the model)
        cfg = load_config(None, [f"model.preset={v['preset']}", f"engine.zero_stage={v['stage']}",
                                 f"engine.precision={v['precision']}",
                                 "engine.zero_optimization.reduce_bucket_size=500000000", *v.get("overrides", [])])
        est = memory.model_state_bytes(cfg.model, cfg.engine, v["world_size"])
        m = v["per_rank_max"]
        pairs = [("states", v["model_states_bytes"], est.model_states_bytes, HI),
                 ("buckets", m["buffers"], est.buffers_bytes, HI),
                 # ZeRO-3: the gathered set, twice over while a prefetching all-gather is in flight (its flat
                 # output buffer beside the parameters it replaces; seen on CPU for albert-large)
                 ("gathered", m["gathered"], est.gathered_bytes, 2 * HI)]
        for what, measured, ours, hi in pairs:
            if measured == ours == 0:
                continue
            if not (ours and LO <= measured / ours <= hi):
                bad.append((key, what, measured, ours))
    assert not bad, bad


def test_activation_estimate_matches_the_profiler():
    bad = []
    for preset, a in _measured()["activations"].items():
        for key, cell in a["cells"].items():
            depth = a["depths"][1]
            cfg = load_config(None, [f"model.preset={preset}", f"model.num_hidden_layers={depth}",
                                     f"model.gradient_checkpointing={str(cell['checkpointing']).lower()}"]).model
            est = memory.activation_bytes(cfg, cell["micro_batch"], cell["seq"], cell["precision"],
                                          masked=round(cell["masked_per_sequence"]))
            got = cell["measured"][str(depth)]
            for what in ("retained_bytes", "peak_bytes"):
                if not LO <= got[what] / getattr(est, what) <= HI:
                    bad.append((preset, key, what, got[what], getattr(est, what)))
    assert not bad, bad


def test_zero3_partitions_the_states_on_4_ranks():
    states = _measured()["states"]
    for key, v in states.items():
        if v["stage"] == 3 and v["world_size"] == 4:
            one = states[key.rsplit("|", 1)[0] + "|1"]
            assert v["model_states_bytes"] <= 0.3 * one["model_states_bytes"], key


@pytest.mark.parametrize("seq, checkpointing", [(64, False), (64, True)])
def test_activation_estimate_matches_a_live_profile(seq, checkpointing):
    """A 4-block model with I != 4H measured now with torch's profiler (bench/memory_scale.py's pass)."""
    bench = load_bench("memory_scale")
    cfg = load_config(None, ["model.preset=albert-tiny", "model.num_hidden_groups=1", "model.intermediate_size=320",
                             f"model.gradient_checkpointing={str(checkpointing).lower()}"]).model
    torch.manual_seed(0)
    model = AlbertForPreTraining(cfg).train()
    batch = bench._batch(cfg.vocab_size, seq, batch=2)
    masked = round((batch["mlm_labels"] != -100).sum().item() / 2)
    model(**batch).loss.backward()
    got = bench._activation_pass(model, batch)
    est = memory.activation_bytes(cfg, 2, seq, "fp32", masked=masked)
    assert LO <= got["retained_bytes"] / est.retained_bytes <= HI, (got, est)
    assert LO <= got["peak_bytes"] / est.peak_bytes <= HI, (got, est)


# ------------------------------------------------------------------------------ the preflight
def _cfg(*overrides: str):
    return load_config(RECIPE, ["tracking.enabled=false", *overrides])


BIG = ("model.preset=albert-base", "model.max_position_embeddings=512", "data.max_seq_length=512",
       "engine.train_micro_batch_size_per_gpu=64", "engine.precision=bf16")


def test_cpu_prints_the_line_and_never_refuses(caplog):
    caplog.set_level("INFO", logger="albert_dist.apps.pretrain.preflight")
    cfg = _cfg(*BIG)
    est = preflight.check_memory(cfg, 2, device=None)
    assert est.total_bytes > 8 * 2**30  # would not fit the fake devices below
    line = caplog.records[-1].getMessage()
    assert line.startswith("memory per device (estimate)") and "ZeRO-2, 2 ranks, bf16" in line
    assert "micro-batch 64 x 512 tokens" in line


def test_a_gpu_that_fits_passes():
    est = preflight.check_memory(_cfg(*BIG), 2, device=("GPU 0 (fake 80 GB)", 80 * 2**30), log=False)
    assert est.total_bytes <= memory.USABLE_FRACTION * 80 * 2**30


@pytest.mark.parametrize("gib", [8, 3])
def test_a_gpu_too_small_is_refused_with_a_change_that_fits(gib):
    cfg = _cfg(*BIG)
    usable = memory.USABLE_FRACTION * gib * 2**30
    with pytest.raises(ValueError) as err:
        preflight.check_memory(cfg, 2, device=("GPU 0 (fake)", gib * 2**30), log=False)
    text = str(err.value)
    assert "GPU 0 (fake)" in text and f"{gib}.00 GiB" in text and "the smallest change that fits: " in text
    change = text.split("the smallest change that fits: ")[1].split(" (estimate")[0].split()
    # the advice, given to the real config loader as command-line overrides, fits; the config without it does not
    fixed = load_config(RECIPE, ["tracking.enabled=false", *BIG, *change])
    assert memory.estimate(fixed.model, fixed.data, fixed.engine, 2).total_bytes <= usable < memory.estimate(cfg.model, cfg.data, cfg.engine, 2).total_bytes
    # no single earlier (cheaper) candidate fits
    candidates = preflight.candidate_changes(cfg)
    if change in candidates:
        for earlier in candidates[:candidates.index(change)]:
            trial = load_config(RECIPE, ["tracking.enabled=false", *BIG, *earlier])
            assert memory.estimate(trial.model, trial.data, trial.engine, 2).total_bytes > usable, earlier


def test_halving_the_micro_batch_keeps_the_global_batch():
    cfg = _cfg(*BIG)
    halvings = [c for c in preflight.candidate_changes(cfg) if "train_micro_batch_size_per_gpu" in c[0]]
    assert len(halvings) == 6  # 64 -> 32 ... 1
    for change in halvings:
        trial = load_config(RECIPE, ["tracking.enabled=false", *BIG, *change])
        assert (trial.engine.train_micro_batch_size_per_gpu * trial.engine.gradient_accumulation_steps
                == cfg.engine.train_micro_batch_size_per_gpu * cfg.engine.gradient_accumulation_steps)


def test_nothing_fits_says_so_and_warn_mode_starts(monkeypatch):
    cfg = _cfg("model.preset=albert-xxlarge", "model.max_position_embeddings=512", "data.max_seq_length=512")
    with pytest.raises(ValueError, match="no change this check knows fits"):
        preflight.check_memory(cfg, 1, device=("GPU 0 (fake)", 2**30), log=False)
    monkeypatch.setenv(preflight.CHECK_ENV, "warn")
    preflight.check_memory(cfg, 1, device=("GPU 0 (fake)", 2**30), log=False)


def test_train_exits_2_before_the_process_group_on_a_small_gpu(monkeypatch, capsys):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(distributed, "init_distributed", lambda *a, **k: pytest.fail("process group started"))
    monkeypatch.setattr(train_app.Trainer, "setup", lambda self: pytest.fail("Trainer.setup reached"))
    monkeypatch.setattr(memory, "device_memory", lambda local_rank: ("GPU 0 (fake 1 GiB)", 2**30))
    code = cli.main(["train", "--config", RECIPE, "tracking.enabled=false", "engine.train_micro_batch_size_per_gpu=256"])
    err = capsys.readouterr().err
    assert code == train_app.EXIT_CONFIG_ERROR, err
    assert err.startswith("albert-dist train: memory per device (estimate)") and "GPU 0 (fake 1 GiB)" in err
    # the bucket is already scaled to the model (1e6 elements, not DeepSpeed's 5e8): the micro-batch must shrink
    assert "gradient buckets 3.8 MiB (reduce_bucket_size 1e+06)" in err
    assert ("the smallest change that fits: engine.train_micro_batch_size_per_gpu=64 "
            "engine.gradient_accumulation_steps=4") in err
