"""TrainConfig / load_config strictness and the DeepSpeed config generated from it."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from albert_dist.config import (TrainConfig, check_derived, config_hash, for_world_size, load_config, to_container,
                                to_yaml)
from albert_dist.engine.config import EngineConfig
from albert_dist.engine.deepspeed_config import build_deepspeed_config

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted((REPO / "configs" / "pretrain").glob("*.yaml"))
MAIN_RECIPE = REPO / "configs" / "pretrain" / "albert-tiny-wikitext.yaml"


def _earlier_phase(recipe: Path, where: Path) -> None:
    """A recipe starting from another recipe's run (model.init_from: ALBERT's phase 2): that run's directory,
    as far as loading reads it (config.yaml, final_model/fp32/model.yaml), under `where`."""
    import dataclasses

    import yaml

    ref = (yaml.safe_load(recipe.read_text()).get("model") or {}).get("init_from")
    if ref is None:
        return
    earlier = next(r for r in RECIPES if (yaml.safe_load(r.read_text()).get("run_dir") or "") == ref)
    cfg = load_config(earlier)
    (where / ref / "final_model" / "fp32").mkdir(parents=True)
    (where / ref / "config.yaml").write_text(to_yaml(cfg))
    (where / ref / "final_model" / "fp32" / "model.yaml").write_text(yaml.safe_dump(dataclasses.asdict(cfg.model)))


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.name for p in RECIPES])
def test_every_recipe_loads_and_builds_a_deepspeed_config(recipe, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a later phase's run directory is looked for here first
    _earlier_phase(recipe, tmp_path)
    from albert_dist.apps.pretrain.init_from import read_source

    cfg = for_world_size(load_config(recipe, (), read_source), 2)
    ds = build_deepspeed_config(cfg.engine, world_size=2, accelerator="cuda", model=cfg.model)
    assert ds["train_batch_size"] == (cfg.engine.train_micro_batch_size_per_gpu
                                      * cfg.engine.gradient_accumulation_steps * 2)
    # to_container walks the dataclasses itself: OmegaConf's own conversion is the reference (types included: the
    # trajectory hash of a checkpoint written by either must match)
    from omegaconf import OmegaConf

    reference = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    assert to_container(cfg) == reference and repr(to_container(cfg)) == repr(reference)


def test_main_recipe_is_the_documented_job():
    cfg = load_config(MAIN_RECIPE)
    assert cfg.engine.zero_stage == 2
    assert cfg.model.num_hidden_groups == 2 and cfg.model.num_hidden_layers == 4
    assert cfg.data.validation and cfg.eval_interval_steps > 0
    assert 100 <= cfg.max_steps <= 1000


def test_overrides_apply_with_yaml_types():
    cfg = load_config(MAIN_RECIPE, ["engine.zero_stage=3", "optimizer.lr=5e-4", "model.sharing=ffn",
                                    "optimizer.betas=[0.8,0.9]", "run_dir=/tmp/x"])
    assert cfg.engine.zero_stage == 3 and isinstance(cfg.engine.zero_stage, int)
    assert cfg.optimizer.lr == 5e-4 and cfg.model.sharing == "ffn"
    assert cfg.optimizer.betas == [0.8, 0.9] and cfg.run_dir == "/tmp/x"


@pytest.mark.parametrize("override, fragment", [
    (["engine.zero_stag=3"], "zero_stag"),                       # unknown key in a section
    (["nonsense=1"], "nonsense"),                                # unknown top-level key
    (["engine.zero_stage=three"], "engine.zero_stage"),          # wrong type
    (["max_steps=1.5"], "max_steps"),                            # float for an int
    (["engine.zero_stage=4"], "engine.zero_stage"),              # out of range (__post_init__)
    (["optimizer.type=sgd"], "optimizer.type"),
    (["optimizer.decay=cosine"], "optimizer.decay"),
    (["engine.precision=fp8"], "engine.precision"),
    (["model.num_hidden_groups=9"], "num_hidden_groups"),
    (["optimizer.warmup_steps=100000"], "warmup_steps"),
    (["engine.zero_stage"], "dotted.key=value"),                 # malformed override
    (["data.train=[/data/prep"], "is not valid YAML (did not find expected ',' or ']'); close its brackets"),
    (["model.sharing={a"], "is not valid YAML"),                 # yaml's 33-line ParserError before
    (["data.train.0.text_field=content"], "in brackets: data.train[0].text_field=content"),  # MLflow's spelling
])
def test_bad_override_is_a_clear_value_error(override, fragment):
    with pytest.raises(ValueError, match=re.escape(fragment)):
        load_config(MAIN_RECIPE, override)


def test_unknown_key_in_yaml_names_file_and_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(MAIN_RECIPE.read_text() + "\nengine_typo:\n  zero_stage: 1\n")
    with pytest.raises(ValueError, match=r"bad\.yaml.*engine_typo"):
        load_config(bad)


def test_wrong_type_in_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine:\n  train_micro_batch_size_per_gpu: [1, 2]\n")
    with pytest.raises(ValueError, match="train_micro_batch_size_per_gpu"):
        load_config(bad)


def test_missing_file():
    with pytest.raises(FileNotFoundError):
        load_config("/nonexistent/recipe.yaml")


@pytest.mark.parametrize("micro, ga, world, given, ok", [
    (8, 1, 2, None, True), (8, 3, 2, 48, True), (4, 2, 4, 32, True),
    (8, 1, 2, 32, False), (8, 3, 2, 16, False), (4, 2, 3, 32, False),
])
def test_batch_arithmetic(micro, ga, world, given, ok):
    cfg = load_config(None, [f"engine.train_micro_batch_size_per_gpu={micro}",
                             f"engine.gradient_accumulation_steps={ga}",
                             f"engine.train_batch_size={'null' if given is None else given}"])
    if ok:
        assert check_derived(cfg, world) == micro * ga * world
        ds = build_deepspeed_config(cfg.engine, world, accelerator="cpu")
        assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) \
            == (micro * ga * world, micro, ga)
    else:
        with pytest.raises(ValueError, match=rf"train_batch_size \({given}\).*= {micro * ga * world}") as err:
            check_derived(cfg, world)
        if given % (micro * world) == 0:  # the hint names the accumulation that multiplies out
            assert f"gradient_accumulation_steps={given // (micro * world)}" in str(err.value)
        else:
            assert "not a multiple" in str(err.value)
        with pytest.raises(ValueError, match="train_batch_size"):
            build_deepspeed_config(cfg.engine, world, accelerator="cpu")


def test_gradient_accumulation_auto_is_derived_from_the_global_batch_and_the_world_size():
    cfg = load_config(None, ["engine.train_batch_size=48", "engine.train_micro_batch_size_per_gpu=4",
                             "engine.gradient_accumulation_steps=auto"])
    assert cfg.engine.gradient_accumulation_steps == "auto"
    for world, ga in ((1, 12), (2, 6), (3, 4), (12, 1)):
        resolved = for_world_size(cfg, world)
        assert resolved.engine.gradient_accumulation_steps == ga and check_derived(resolved, world) == 48
        ds = build_deepspeed_config(resolved.engine, world, accelerator="cpu")
        assert (ds["train_batch_size"], ds["gradient_accumulation_steps"]) == (48, ga)
        assert "gradient_accumulation_steps: %d" % ga in to_yaml(resolved)  # the run's config.yaml: the number used
    assert for_world_size(resolved, 12) is resolved  # nothing left to resolve
    message = ("engine.gradient_accumulation_steps=auto: engine.train_batch_size (48) is not a multiple of "
               "train_micro_batch_size_per_gpu (4) x world size (5) = 20")
    with pytest.raises(ValueError, match=re.escape(message)):
        for_world_size(cfg, 5)
    # resolved once per job (the preflight): the batch check and the DeepSpeed config take the result, never "auto"
    for call in (check_derived, lambda c, w: build_deepspeed_config(c.engine, w, accelerator="cpu")):
        with pytest.raises(ValueError, match=re.escape("engine.gradient_accumulation_steps=auto is not resolved for "
                                                       "the world size (2): resolve it first")):
            call(cfg, 2)
    with pytest.raises(ValueError, match=re.escape("engine.gradient_accumulation_steps=auto needs "
                                                   "engine.train_batch_size")):
        load_config(None, ["engine.gradient_accumulation_steps=auto"])
    with pytest.raises(ValueError, match=re.escape("engine.gradient_accumulation_steps must be an integer >= 1 or "
                                                   "'auto', got 'many'")):
        load_config(None, ["engine.gradient_accumulation_steps=many", "engine.train_batch_size=8"])


def test_albert_base_recipe_resolves_its_accumulation_for_1_to_16_ranks():
    cfg = load_config(REPO / "configs" / "pretrain" / "albert-base-lamb.yaml")
    for world in (1, 2, 4, 8, 16):
        engine = for_world_size(cfg, world).engine
        assert engine.train_micro_batch_size_per_gpu * engine.gradient_accumulation_steps * world == 4096
    with pytest.raises(ValueError, match=re.escape("world size (32) = 8192")):
        for_world_size(cfg, 32)


def test_bucket_sizes_are_scaled_to_the_model():
    """A quarter of the parameters, at least the largest tensor, in whole millions of elements; counted here on the
    torch model, independently of the config arithmetic. A set bucket wins; ZeRO-0 has none; DeepSpeed's default
    stays without a model."""
    from albert_dist.model import AlbertForPreTraining

    cfg = load_config(None, ["model.preset=albert-base"])
    numels = [p.numel() for p in AlbertForPreTraining(cfg.model).parameters()]
    expected = -(-max(max(numels), -(-sum(numels) // 4)) // 10**6) * 10**6
    assert expected == 4_000_000  # the 30000 x 128 word embeddings (3.84e6) outweigh a quarter of 1.2e7
    zero = build_deepspeed_config(cfg.engine, 2, accelerator="cpu", model=cfg.model)["zero_optimization"]
    assert zero == {"stage": 2, "reduce_bucket_size": expected, "allgather_bucket_size": expected}
    zero = build_deepspeed_config(load_config(None, ["model.preset=albert-base", "engine.zero_stage=3",
                                                     "engine.zero_optimization.reduce_bucket_size=7"]).engine,
                                  2, accelerator="cpu", model=cfg.model)["zero_optimization"]
    assert zero == {"stage": 3, "reduce_bucket_size": 7}
    stage0 = load_config(None, ["engine.zero_stage=0"]).engine
    assert build_deepspeed_config(stage0, 1, accelerator="cpu", model=cfg.model)["zero_optimization"] == {"stage": 0}
    assert build_deepspeed_config(cfg.engine, 2, accelerator="cpu")["zero_optimization"] == {"stage": 2}
    xxlarge = load_config(None, ["model.preset=albert-xxlarge"]).model
    big = build_deepspeed_config(cfg.engine, 2, accelerator="cpu", model=xxlarge)["zero_optimization"]
    assert 5e7 < big["reduce_bucket_size"] < 5e8  # a quarter of 2.2e8


def test_deepspeed_throughput_timer_is_off():
    """DeepSpeed's timer synchronizes the device at every forward and step when on (its default)."""
    from deepspeed.utils.config import get_timers_config

    ds = build_deepspeed_config(TrainConfig().engine, 1, accelerator="cpu")
    assert get_timers_config(ds).enabled is False and get_timers_config({}).enabled is True


def test_deepspeed_config_content():
    cfg = load_config(None, ["engine.zero_stage=3", "engine.gradient_clipping=0.5", "engine.precision=bf16",
                             "engine.zero_optimization.stage3_param_persistence_threshold=0",
                             "engine.zero_optimization.overlap_comm=false"])
    ds = build_deepspeed_config(cfg.engine, 2, accelerator="cpu")
    assert ds["zero_optimization"] == {"stage": 3, "stage3_param_persistence_threshold": 0, "overlap_comm": False}
    assert ds["gradient_clipping"] == 0.5
    assert ds["bf16"] == {"enabled": True} and ds["data_types"] == {"grad_accum_dtype": "fp32"}
    assert ds["communication_data_type"] == "fp32"  # reduced in the accumulation dtype, not bf16
    assert "fp16" not in ds
    assert ds["zero_force_ds_cpu_optimizer"] is False and ds["zero_allow_untested_optimizer"] is True
    json.dumps(ds)  # what the run directory's ds_config.json holds


def test_fp32_has_no_mixed_precision_sections():
    ds = build_deepspeed_config(TrainConfig().engine, 1, accelerator="cpu")
    assert "bf16" not in ds and "fp16" not in ds and "data_types" not in ds
    assert ds["zero_optimization"] == {"stage": 2}


def test_precision_rules():
    # fp16 is refused at load, with its reason (untestable on CPU; a loss scale log2(GA x world) too high)
    with pytest.raises(ValueError, match=re.escape("engine.precision=fp16 is not supported: its dynamic loss "
                                                   "scaling is untested here")):
        load_config(None, ["engine.precision=fp16"])
    # DeepSpeed accumulates bf16 gradients in fp32 only inside its ZeRO optimisers.
    with pytest.raises(ValueError, match="zero_stage >= 1"):
        EngineConfig(zero_stage=0, precision="bf16", grad_accum_dtype="fp32")
    ds = build_deepspeed_config(load_config(None, ["engine.zero_stage=0", "engine.precision=bf16",
                                                   "engine.grad_accum_dtype=bf16"]).engine, 1, accelerator="cpu")
    assert ds["data_types"] == {"grad_accum_dtype": "bf16"}
    # Left unset, bf16 accumulates in fp32 where DeepSpeed can (ZeRO >= 1) and in bf16 at ZeRO-0: bf16 is never
    # refused on CPU for want of a second setting; an explicit fp32 at ZeRO-0 still is (above).
    for stage, accum in ((0, "bf16"), (1, "fp32"), (3, "fp32")):
        ds = build_deepspeed_config(load_config(None, [f"engine.zero_stage={stage}", "engine.precision=bf16"]).engine,
                                    1, accelerator="cpu")
        assert ds["data_types"] == {"grad_accum_dtype": accum} and ds["communication_data_type"] == accum, stage
    # bf16 + ZeRO-1 + gradient accumulation is accepted: it was wrong only because DeepSpeed never ran its backward
    # prologue on our output type (tests/distributed/test_grad_matrix.py checks every bf16 cell).
    cfg = EngineConfig(zero_stage=1, precision="bf16", gradient_accumulation_steps=3)
    assert build_deepspeed_config(cfg, 1, accelerator="cpu")["gradient_accumulation_steps"] == 3


def test_zero_pass_through_validation():
    with pytest.raises(ValueError, match="reduce_bucket_size"):
        load_config(None, ["engine.zero_optimization.reduce_bucket_size=0"])
    with pytest.raises(ValueError, match="stage3_prefetch_bucket_siz"):
        load_config(None, ["engine.zero_optimization.stage3_prefetch_bucket_siz=1"])


def test_resolved_yaml_round_trips(tmp_path):
    cfg = load_config(MAIN_RECIPE, ["engine.zero_stage=1"])
    path = tmp_path / "config.yaml"
    path.write_text(to_yaml(cfg))
    assert load_config(path) == cfg


def test_config_hash_tracks_the_trajectory_not_the_outputs():
    base = load_config(MAIN_RECIPE)
    assert config_hash(base) == config_hash(load_config(MAIN_RECIPE, ["run_dir=/elsewhere",
                                                                      "checkpoint.keep_last=9"]))
    assert config_hash(base) != config_hash(load_config(MAIN_RECIPE, ["optimizer.lr=1e-4"]))


def _preset_file(name: str) -> dict:
    import yaml

    return yaml.safe_load((REPO / "configs" / "model" / f"{name}.yaml").read_text())


def test_preset_in_a_recipe_with_fields_beside_it(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model:\n  preset: albert-large\n  num_hidden_groups: 2\n")
    model = load_config(recipe).model
    expected = {**_preset_file("albert-large"), "num_hidden_groups": 2}
    assert {k: getattr(model, k) for k in expected} == expected


def test_preset_override_replaces_the_recipes_model_section():
    # the tiny recipe sets 128 positions; albert-base's preset has 512 and replaces the whole section
    cfg = load_config(MAIN_RECIPE, ["model.preset=albert-base", "model.sharing=ffn"])
    expected = {**_preset_file("albert-base"), "sharing": "ffn"}
    assert {k: getattr(cfg.model, k) for k in expected} == expected
    assert load_config(MAIN_RECIPE, ["model=albert-base"]).model == load_config(MAIN_RECIPE, ["model.preset=albert-base"]).model
    by_path = load_config(MAIN_RECIPE, ["model.preset=configs/model/albert-base.yaml"]).model
    assert by_path == load_config(MAIN_RECIPE, ["model.preset=albert-base"]).model
    assert load_config(MAIN_RECIPE).model.max_position_embeddings == 128  # recipe: preset + its override


def test_a_preset_after_init_from_is_refused_rather_than_dropping_the_source():
    """A preset resets the model section to AlbertConfig's defaults, init_from included: given after
    `model.init_from` it trained a random model of the preset's size with no word of the source."""
    with pytest.raises(ValueError) as err:
        load_config(MAIN_RECIPE, ["model.init_from=/no/such/albert", "model.preset=albert-base"])
    assert str(err.value) == ("override 'model.preset=albert-base': model.preset='albert-base' would drop "
                              "model.init_from='/no/such/albert' set before it (a preset is a from-scratch "
                              "architecture; the source gives its own): give one of them")


@pytest.mark.parametrize("args, fragments", [
    ((MAIN_RECIPE, ["model.preset=albert-huge"]), ["model.preset", "albert-huge", "albert-base"]),
    ((REPO / "configs/model/albert-base.yaml", []), ["model preset, not a recipe", "model.preset=albert-base"]),
    ((MAIN_RECIPE, ["model.hiden_size=3"]), ["override 'model.hiden_size=3'", "model.hiden_size: unknown key",
                                             "hidden_size"]),
    ((MAIN_RECIPE, ["data.max_seq_length=4"]), ["data.max_seq_length must be >= 8"]),
    ((MAIN_RECIPE, ["data.train=[{paths: [a.txt], weight: 0}]"]), ["data.train[0].weight must be > 0"]),
    ((MAIN_RECIPE, ["data.validation=[{paths: [a.txt]}, {paths: []}]"]), ["data.validation[1].paths must list"]),
    ((MAIN_RECIPE, ["engine.zero_optimization.overlap_comm=maybe"]), ["engine.zero_optimization.overlap_comm:"]),
    # Literal-typed choices: OmegaConf rejects the value, naming the key and the choices
    ((MAIN_RECIPE, ["model.sharing=some"]), ["model.sharing: Invalid value 'some'", "'attention'"]),
    ((MAIN_RECIPE, ["model.hidden_act=tanh"]), ["model.hidden_act: Invalid value 'tanh'", "'gelu_new'"]),
    ((MAIN_RECIPE, ["engine.grad_accum_dtype=fp16"]), ["engine.grad_accum_dtype: Invalid value 'fp16'"]),
    ((MAIN_RECIPE, ["data.train=[{paths: [a]}, {paths: [a], format: csv}]"]), ["data.train[1].format: Invalid value"]),
    ((MAIN_RECIPE, ["data.validation=[{paths: [a], txt_documents: para}]"]),
     ["data.validation[0].txt_documents: Invalid value 'para'"]),
    ((MAIN_RECIPE, ["data.train=[{paths: [a], wieght: 2}]"]), ["data.train[0].wieght: unknown key", "'weight'"]),
])
def test_config_errors_name_the_dotted_yaml_path(args, fragments):
    with pytest.raises(ValueError) as err:
        load_config(*args)
    message = str(err.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert "Config" not in message and "object_type" not in message  # no class names, no OmegaConf dumps


def test_a_config_error_names_the_bad_key_first_and_only_the_layer_that_set_it(tmp_path):
    """A value a section refuses was reported after every layer of the job (the recipe's path and each override
    joined by " + ": ~450 characters before the key for one bad override of a launch script's command line); now
    the line starts with the key and ends with the one layer that set it (issue 46)."""
    ok = ["max_steps=20", "engine.zero_stage=3", "model.num_hidden_groups=2", "data.num_workers=0",
          "log_interval_steps=5"]
    with pytest.raises(ValueError) as err:
        load_config(MAIN_RECIPE, [*ok[:2], "optimizer.lr=-1", *ok[2:]])
    assert str(err.value) == "optimizer.lr must be > 0, got -1.0 (override 'optimizer.lr=-1')"
    with pytest.raises(ValueError) as err:  # a list given whole, its item at fault
        load_config(MAIN_RECIPE, [*ok, "data.train=[{paths: [a.txt], weight: 0}]"])
    assert str(err.value) == ("data.train[0].weight must be > 0, got 0.0 "
                              "(override 'data.train=[{paths: [a.txt], weight: 0}]')")
    recipe = tmp_path / "bad.yaml"  # the recipe set it, the overrides did not
    recipe.write_text(MAIN_RECIPE.read_text().replace("zero_stage: 2", "zero_stage: 7"))
    with pytest.raises(ValueError) as err:
        load_config(recipe, ok[2:])
    assert str(err.value) == f"engine.zero_stage must be 0, 1, 2 or 3, got 7 ({recipe})"


def test_warmup_ratio():
    cfg = load_config(MAIN_RECIPE)
    assert cfg.optimizer.warmup_ratio == 0.1 and cfg.optimizer.warmup_steps_for(cfg.max_steps) == 100
    assert load_config(MAIN_RECIPE, ["max_steps=5"]).optimizer.warmup_steps_for(5) == 1  # 0.5 rounds up
    lamb = load_config(REPO / "configs" / "pretrain" / "albert-base-lamb.yaml")
    assert lamb.optimizer.warmup_steps_for(lamb.max_steps) == 3125  # the paper's, from 0.025 x 125000
    # the form an override gives replaces the recipe's other form
    absolute = load_config(MAIN_RECIPE, ["optimizer.warmup_steps=7"])
    assert absolute.optimizer.warmup_ratio is None and absolute.optimizer.warmup_steps_for(300) == 7
    back = load_config(MAIN_RECIPE, ["optimizer.warmup_steps=7", "optimizer.warmup_ratio=0.2"]).optimizer
    assert back.warmup_steps == 0 and back.warmup_steps_for(300) == 60
    with pytest.raises(ValueError, match=r"optimizer\.warmup_steps \(7\) and optimizer\.warmup_ratio \(0\.1\)"):
        load_config(MAIN_RECIPE, ["optimizer={warmup_steps: 7, warmup_ratio: 0.1}"])
    with pytest.raises(ValueError, match=r"optimizer\.warmup_ratio must be in \[0, 1\]"):
        load_config(MAIN_RECIPE, ["optimizer.warmup_ratio=1.5"])
    with pytest.raises(ValueError, match=r"optimizer\.warmup_steps \(1400\) must be <= max_steps \(1000\)"):
        load_config(MAIN_RECIPE, ["optimizer.warmup_steps=1400"])


def test_offload_options():
    cfg = load_config(None, ["engine.zero_stage=3", "engine.offload_optimizer.device=cpu",
                             "engine.offload_optimizer.pin_memory=true", "engine.offload_param.device=cpu"])
    zero = build_deepspeed_config(cfg.engine, 2, accelerator="cpu")["zero_optimization"]
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert zero["offload_param"] == {"device": "cpu", "pin_memory": False}
    assert "offload_optimizer" not in build_deepspeed_config(TrainConfig().engine, 1, accelerator="cpu")["zero_optimization"]
    with pytest.raises(ValueError, match=r"engine\.offload_optimizer\.device=cpu needs engine\.zero_stage >= 1"):
        load_config(None, ["engine.zero_stage=0", "engine.offload_optimizer.device=cpu"])
    with pytest.raises(ValueError, match=r"engine\.offload_param\.device=cpu needs engine\.zero_stage=3"):
        load_config(None, ["engine.zero_stage=2", "engine.offload_param.device=cpu"])
    with pytest.raises(ValueError, match=r"engine\.offload_optimizer\.device must be one of"):
        load_config(None, ["engine.offload_optimizer.device=nvme"])


QUICKSTART = REPO / "configs" / "pretrain" / "albert-tiny-wikitext.yaml"


def test_override_sets_a_list_item_by_index_and_names_a_bad_index():
    base = load_config(QUICKSTART)
    cfg = load_config(QUICKSTART, ["data.train[0].text_field=body", "data.train[0]={txt_documents: file}"])
    assert cfg.data.train[0].text_field == "body" and cfg.data.train[0].txt_documents == "file"
    assert cfg.data.train[0].paths == base.data.train[0].paths  # the item's other fields are kept
    with pytest.raises(ValueError, match=r"data.train has 1 item\(s\), so data.train\[3\] does not exist"):
        load_config(QUICKSTART, ["data.train[3].paths=[x]"])
    with pytest.raises(ValueError, match=r"data.train\[0\].nope"):
        load_config(QUICKSTART, ["data.train[0].nope=1"])


def test_a_source_may_be_a_plain_path_or_url_string():
    """`data.train=[path]` (the override a user types first) and `data.train=[s3://...]` are sources; a local
    path is resolved as the mapping form's is, a URL is kept as given."""
    from albert_dist.config import load_config
    from albert_dist.data.config import SourceConfig
    from albert_dist.data.sources.discover import resolve_path

    cfg = load_config(None, ["data.train=[data/sample/wikitext-2-train-00.txt, s3://bucket/prepared/train]",
                             "data.validation=gs://bucket/valid/*.jsonl.zst"])
    assert cfg.data.train == [SourceConfig(paths=[str(resolve_path("data/sample/wikitext-2-train-00.txt"))]),
                              SourceConfig(paths=["s3://bucket/prepared/train"])]
    assert cfg.data.validation == [SourceConfig(paths=["gs://bucket/valid/*.jsonl.zst"])]
    assert load_config(None, ["data.train[0]=s3://b/x"]).data.train == [SourceConfig(paths=["s3://b/x"])]


@pytest.mark.parametrize("override,message", [
    ("data.train=[5]", "data.train[0]: expected a mapping of fields (a data source may also be a path or URL "
                       "string), got int 5"),
    ("data.train=[[a]]", "data.train[0]: expected a mapping of fields"),
    ("data.train[0]=5", "data.train[0]: expected a mapping of fields"),
    ("data.train=5", "data.train: expected a list of sources (mappings or path/URL strings), got int 5"),
    ("data.train={a: 1}", "data.train: expected a list of sources"),
    ("data.train=[{paths: 3}]", "data.train[0].paths: expected a list, got 3"),
])
def test_a_malformed_source_is_named_in_our_words(override, message):
    from albert_dist.config import load_config

    with pytest.raises(ValueError) as err:
        load_config(None, [override])
    assert message in str(err.value)
    assert "Invalid input" not in str(err.value) and "Config" not in str(err.value).replace("SourceConfig", "")


def test_rare_zero_options_pass_through_extra_checked_by_name_and_type():
    """engine.zero_optimization.extra: DeepSpeed's rarely set options (no recipe sets them) reach ds_config.json
    as given; an unknown name, a wrong type or a value below the floor is refused naming the key."""
    from albert_dist.engine.deepspeed_config import build_deepspeed_config

    cfg = load_config(None, ["engine.zero_optimization.extra={stage3_max_live_parameters: 100000000, "
                             "reduce_scatter: false}", "engine.zero_optimization.overlap_comm=true"])
    zero = build_deepspeed_config(cfg.engine, 1)["zero_optimization"]
    assert zero["stage3_max_live_parameters"] == 100_000_000 and zero["reduce_scatter"] is False
    assert zero["overlap_comm"] is True
    for bad, says in [("{contiguous_gradient: true}", "extra.contiguous_gradient: not an option passed through"),
                      ("{reduce_scatter: 1}", "extra.reduce_scatter must be a bool, got 1"),
                      ("{allgather_bucket_size: 0}", "extra.allgather_bucket_size must be >= 1, got 0")]:
        with pytest.raises(ValueError, match=re.escape(says)):
            load_config(None, [f"engine.zero_optimization.extra={bad}"])


def test_a_run_written_before_the_rare_zero_options_moved_into_extra_still_loads(tmp_path):
    """A config.yaml of an earlier version holds contiguous_gradients & co. as direct zero_optimization fields
    (None when unset): it loads, with a set value carried into `extra` and the unset ones dropped."""
    from albert_dist.config import load_config, to_yaml

    cfg = load_config(QUICKSTART)
    text = to_yaml(cfg).replace("zero_optimization:\n", "zero_optimization:\n    contiguous_gradients: null\n"
                                "    reduce_scatter: false\n", 1)
    assert "reduce_scatter: false" in text
    (tmp_path / "config.yaml").write_text(text)
    old = load_config(tmp_path / "config.yaml")
    assert old.engine.zero_optimization.extra == {"reduce_scatter": False}
    assert old.model == cfg.model and old.data == cfg.data
