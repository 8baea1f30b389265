"""`model.init_from` (albert_dist.runs, albert_dist.apps.pretrain.init_from): a new run from a transformers ALBERT, a run
directory or an MLflow run, checked against transformers as the reference: the source's tokenizer gives
transformers' ids, the first batch's logits are the source model's, untying keeps the outputs, and bad sources
are exit 2 with one line before any process group."""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch

from albert_dist import cli
from albert_dist.config import load_config as load_recipe, to_yaml
from albert_dist.data.tokenizer import copy_tokenizer, load_tokenizer
from albert_dist.apps.pretrain.init_from import check, load_into, read_source, resolve
from albert_dist.model.albert import AlbertForPreTraining
from albert_dist.model.config import AlbertConfig
from albert_dist.model.unroll import source_names

transformers = pytest.importorskip("transformers")
from fixtures.hub_albert import MIXED_TEXT, SPIECE, make_hub_albert  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
RECIPE = str(REPO / "configs/pretrain/albert-tiny-wikitext.yaml")
#: A job small enough for one process: the source's 128 positions, no loader workers, no validation.
SMALL = ["data.max_seq_length=64", "data.num_workers=0", "data.validation=[]", "tracking.enabled=false"]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    return make_hub_albert(tmp_path_factory.mktemp("hub") / "albert")


def load_config(path, overrides=()):
    """The training job's load: `model.init_from`'s source read by the app's reader (albert_dist.apps.pretrain.main)."""
    return load_recipe(path, overrides, read_source)


def _hf(path: Path):
    return transformers.AlbertForPreTraining.from_pretrained(path, attn_implementation="sdpa").eval()


def test_a_tokenizer_directory_gives_transformers_ids_on_mixed_case_accented_text(hub, tmp_path):
    """The hub's uncased settings (tokenizer_config.json) apply before sentencepiece, in `encode` and in the
    pipeline's documents: the ids of transformers from tokenizer.json, from spiece.model alone (converted), and
    with no tokenizer_config.json at all (transformers' defaults: uncased)."""
    from albert_dist.data.config import DataConfig
    from albert_dist.data.pretraining import ExampleBuilder

    reference = transformers.AutoTokenizer.from_pretrained(hub)(MIXED_TEXT)["input_ids"][1:-1]
    converted = tmp_path / "converted"
    converted.mkdir()
    for name in ("spiece.model", "tokenizer_config.json"):
        shutil.copyfile(hub / name, converted / name)
    defaults = tmp_path / "defaults"
    defaults.mkdir()
    for name in ("spiece.model", "config.json"):
        shutil.copyfile(hub / name, defaults / name)
    for directory in (hub, converted, defaults):
        assert transformers.AutoTokenizer.from_pretrained(directory)(MIXED_TEXT)["input_ids"][1:-1] == reference
        copy_tokenizer(directory, tmp_path / f"{directory.name}-export")  # what an export of its model holds
        exported = transformers.AutoTokenizer.from_pretrained(tmp_path / f"{directory.name}-export")
        assert exported(MIXED_TEXT)["input_ids"][1:-1] == reference, directory.name
        sp = load_tokenizer(str(directory))
        assert sp.encode(MIXED_TEXT) == reference, directory.name
        tokens, _, _ = ExampleBuilder(sp, DataConfig()).encode_document(MIXED_TEXT)
        assert tokens.tolist() == reference, directory.name
    # what the pipeline fed an uncased model before: the cased, accented pieces
    assert load_tokenizer(str(SPIECE)).encode(MIXED_TEXT) != reference


def _segments(row: torch.Tensor, labels: torch.Tensor) -> list[list[int]]:
    """The text segments of a batch row as the pipeline made them before masking (labels restored)."""
    from albert_dist.data.tokenizer import CLS_ID, PAD_ID, SEP_ID

    ids = torch.where(labels != -100, labels, row).tolist()
    segments, current = [], []
    for token in ids:
        if token == SEP_ID:
            segments.append(current)
            current = []
        elif token not in (CLS_ID, PAD_ID):
            current.append(token)
    return [seg for seg in segments if seg]


def test_a_transformers_5_directory_trains_with_its_own_tokenizer_json(hub, tmp_path):
    """What transformers 5 saves (`AlbertTokenizer.from_pretrained(...).save_pretrained(dir)`: tokenizer.json, no
    spiece.model) is a source to train from: its tokenizer as saved (uncased, accents stripped) gives the first
    batch, every segment of which is a run of transformers' own ids for the document (issue 46 item 2: was exit 2,
    "the source has no tokenizer (spiece.model)")."""
    from albert_dist.data.loader import build_train_loader

    source = tmp_path / "albert5"
    source.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(hub / name, source / name)
    transformers.AlbertTokenizer.from_pretrained(hub).save_pretrained(source)
    assert not (source / "spiece.model").exists() and (source / "tokenizer.json").is_file()
    corpus = tmp_path / "mixed.txt"
    corpus.write_text("\n".join([MIXED_TEXT] * 40) + "\n")
    cfg = load_config(RECIPE, [f"model.init_from={source}", *SMALL, f"data.train=[{{paths: [{corpus}]}}]"])
    assert cfg.data.tokenizer_path == str(source)
    assert load_tokenizer(str(source)).encode(MIXED_TEXT) == load_tokenizer(str(hub)).encode(MIXED_TEXT)
    reference = transformers.AutoTokenizer.from_pretrained(source)(" ".join([MIXED_TEXT] * 40))["input_ids"][1:-1]
    assert reference[:len(reference) // 40] != load_tokenizer(str(SPIECE)).encode(MIXED_TEXT)  # the cased ids
    batch = next(iter(build_train_loader(cfg.data, 4, 0, 1)))
    text = " ".join(map(str, reference))
    found = [seg for row, labels in zip(batch["input_ids"], batch["mlm_labels"]) for seg in _segments(row, labels)]
    assert len(found) >= 8 and all(f" {' '.join(map(str, seg))} " in f" {text} " for seg in found), found
    model = AlbertForPreTraining(cfg.model)
    assert load_into(model, check(cfg)) == []


def test_the_config_takes_the_source_architecture_and_tokenizer_unless_set_after_it(hub, tmp_path, monkeypatch):
    cfg = load_config(RECIPE, [f"model.init_from={hub}", "model.hidden_dropout_prob=0.1"])
    hf = transformers.AlbertConfig.from_pretrained(hub)
    assert (cfg.model.hidden_size, cfg.model.embedding_size, cfg.model.num_hidden_layers, cfg.model.vocab_size,
            cfg.model.max_position_embeddings) == (hf.hidden_size, hf.embedding_size, hf.num_hidden_layers,
                                                   hf.vocab_size, hf.max_position_embeddings)
    assert cfg.model.hidden_dropout_prob == 0.1  # set after init_from: the recipe's
    assert cfg.data.tokenizer_path == str(hub)  # the recipe's data/sample/spiece.model came before init_from
    # the run's config.yaml holds everything: reloading it reads no source (gone, or an MLflow download)
    (tmp_path / "config.yaml").write_text(to_yaml(cfg))
    monkeypatch.setattr("albert_dist.apps.pretrain.init_from.resolve", lambda *a: pytest.fail("source read"))
    assert load_config(str(tmp_path / "config.yaml")) == cfg


def test_the_first_batch_gives_the_source_models_logits(hub):
    """Same weights, same ids: the MLM and SOP logits of the run's first batch equal transformers' on the
    source directory."""
    from albert_dist.data.loader import build_train_loader

    cfg = load_config(RECIPE, [f"model.init_from={hub}", *SMALL])
    model = AlbertForPreTraining(cfg.model).eval()
    assert load_into(model, check(cfg)) == []
    batch = next(iter(build_train_loader(cfg.data, 4, 0, 1)))
    inputs = [batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")]
    with torch.no_grad():
        mlm, sop = model.logits(*inputs)
        ref = _hf(hub)(*inputs)
    torch.testing.assert_close(mlm, ref.prediction_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sop, ref.sop_logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("change", [dict(sharing="none"), dict(sharing="attention"), dict(sharing="ffn"),
                                    dict(num_hidden_groups=2), dict(num_hidden_groups=2, sharing="none")])
def test_untying_gives_the_shared_models_outputs_exactly(hub, change):
    cfg = load_config(RECIPE, [f"model.init_from={hub}", *SMALL])
    shared = AlbertForPreTraining(cfg.model).eval()
    load_into(shared, check(cfg))
    untied_cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **change))
    untied = AlbertForPreTraining(untied_cfg.model).eval()
    load_into(untied, check(untied_cfg))
    assert sum(p.numel() for p in untied.parameters()) > sum(p.numel() for p in shared.parameters())
    ids = torch.randint(5, 8000, (2, 24), generator=torch.Generator().manual_seed(0))
    mask, types = torch.ones_like(ids), (torch.arange(24) >= 12).long().expand(2, 24)
    with torch.no_grad():
        for a, b in zip(shared.logits(ids, mask, types), untied.logits(ids, mask, types)):
            assert torch.equal(a, b)


@pytest.mark.parametrize("target, source", [
    (dict(sharing="all", num_hidden_groups=1), dict(sharing="all", num_hidden_groups=2)),
    (dict(sharing="all", num_hidden_groups=1), dict(sharing="none", num_hidden_groups=1)),
    (dict(sharing="attention", num_hidden_groups=1), dict(sharing="ffn", num_hidden_groups=1)),
])
def test_more_sharing_than_the_source_is_refused_with_the_reason(target, source):
    base = dict(vocab_size=50, embedding_size=8, hidden_size=16, num_hidden_layers=4, num_attention_heads=2,
                intermediate_size=32, max_position_embeddings=16)
    with pytest.raises(ValueError, match=r"model\.sharing=.* keeps apart: init_from can untie"):
        source_names(AlbertConfig(**base, **target), AlbertConfig(**base, **source))


def test_heads_the_source_lacks_start_fresh_and_are_named(tmp_path, caplog):
    masked_lm = make_hub_albert(tmp_path / "mlm", head="AlbertForMaskedLM")
    cfg = load_config(RECIPE, [f"model.init_from={masked_lm}", *SMALL])
    model = AlbertForPreTraining(cfg.model)
    fresh_pooler = model.albert.pooler.weight.detach().clone()
    assert sorted(load_into(model, check(cfg))) == ["albert.pooler.bias", "albert.pooler.weight",
                                                    "sop_classifier.classifier.bias",
                                                    "sop_classifier.classifier.weight"]
    assert torch.equal(model.albert.pooler.weight, fresh_pooler)
    assert "no weights for albert.pooler, sop_classifier.classifier" in caplog.text
    reference = transformers.AlbertForMaskedLM.from_pretrained(masked_lm)
    assert torch.equal(model.predictions.dense.weight, reference.predictions.dense.weight)


def _bad(tmp_path: Path, hub: Path, case: str) -> tuple[list[str], str]:
    if case == "bert":
        source = tmp_path / "bert"
        source.mkdir()
        (source / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 32}))
        return [f"model.init_from={source}"], "model_type 'bert'"
    if case == "folder":
        (tmp_path / "notes").mkdir()
        (tmp_path / "notes" / "a.txt").write_text("x")
        return [f"model.init_from={tmp_path / 'notes'}"], "neither a transformers ALBERT directory"
    if case == "no tokenizer":
        source = tmp_path / "bare"
        source.mkdir()
        for name in ("config.json", "model.safetensors"):
            shutil.copyfile(hub / name, source / name)
        return [f"model.init_from={source}"], "the source has no tokenizer"
    if case in ("truncated", "truncated run"):  # a copy cut short: half of model.safetensors
        if case == "truncated":
            source = tmp_path / "cut"
            shutil.copytree(hub, source)
            weights = source / "model.safetensors"
        else:
            from albert_dist.runs.weights import write_trained_model

            source = tmp_path / "run-cut"
            cfg = load_config(RECIPE, [f"model.init_from={hub}", *SMALL])
            write_trained_model(AlbertForPreTraining(cfg.model), str(source / "final_model"), cfg.data.tokenizer_path)
            (source / "config.yaml").write_text(to_yaml(cfg))
            weights = source / "final_model" / "fp32" / "model.safetensors"
        data = weights.read_bytes()
        weights.write_bytes(data[:len(data) // 2])
        return [f"model.init_from={source}"], f"model.init_from='{source}': {weights}: the weights do not read"
    if case == "vocabulary":
        return [f"model.init_from={hub}", "model.vocab_size=30000"], \
            "model.vocab_size=30000 does not fit the source"
    if case == "resume":
        return [f"model.init_from={hub}", "--resume", str(tmp_path / "ckpt")], "continues a checkpoint"
    return [f"model.init_from={tmp_path / 'absent'}"], "no such directory, and not an MLflow run id"


@pytest.mark.parametrize("case", ["bert", "folder", "no tokenizer", "truncated", "truncated run", "vocabulary",
                                  "resume", "missing"])
def test_a_bad_source_is_exit_2_with_one_line_before_any_process_group(hub, tmp_path, capsys, no_process_group,
                                                                         case):
    args, expected = _bad(tmp_path, hub, case)
    capsys.readouterr()  # what making the source printed
    assert cli.main(["train", "--config", RECIPE, *SMALL, f"run_dir={tmp_path / 'run'}", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err


def test_a_run_directory_and_an_mlflow_run_give_the_same_start_and_keep_the_tokenizer(hub, tmp_path,
                                                                                       monkeypatch):
    """A run's final_model/ (as the trainer writes it, tokenizer directory included) read from the run directory
    and from its MLflow run's `model/` artifacts starts the same weights as the transformers source; its hf/
    export tokenizes as the source does."""
    from mlflow import MlflowClient

    from albert_dist.runs.weights import write_trained_model

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cfg = load_config(RECIPE, [f"model.init_from={hub}", *SMALL])
    source = AlbertForPreTraining(cfg.model)
    load_into(source, check(cfg))
    run = tmp_path / "run"
    written = write_trained_model(source, str(run / "final_model"), cfg.data.tokenizer_path)
    (run / "config.yaml").write_text(to_yaml(cfg))
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(written["hf"])
    assert hf_tokenizer(MIXED_TEXT)["input_ids"] == transformers.AutoTokenizer.from_pretrained(hub)(MIXED_TEXT)[
        "input_ids"]

    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("pretrain", artifact_location=(tmp_path / "artifacts").as_uri())
    run_id = client.create_run(experiment).info.run_id
    client.log_artifacts(run_id, str(run / "final_model"), "model")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)

    started = []
    for ref in (str(run), run_id):
        again = load_config(RECIPE, [f"model.init_from={ref}", *SMALL])
        assert again.model == dataclasses.replace(cfg.model, init_from=again.model.init_from)
        found = resolve(again.model.init_from)
        assert load_tokenizer(again.data.tokenizer_path).encode(MIXED_TEXT) == load_tokenizer(str(hub)).encode(
            MIXED_TEXT)
        model = AlbertForPreTraining(again.model)
        assert load_into(model, found) == []
        started.append(model.state_dict())
    assert found.kind == "state_dict" and found.run_id == run_id  # the final model, downloaded
    for state in started:
        assert state.keys() == source.state_dict().keys()
        assert all(torch.equal(state[k], v) for k, v in source.state_dict().items())
