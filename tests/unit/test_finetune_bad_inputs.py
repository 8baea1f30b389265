"""`albert-dist finetune` refuses bad input with exit 2 and one line naming it, before any training (nothing
is written). In process: every case stops before the Trainer is built."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from albert_dist.cli import main as cli_main
from fixtures.finetune_run import make_run_dir, make_tokenizer, write_glue_tsv, write_sst2

pytest.importorskip("transformers")
SAMPLE_TOKENIZER = Path(__file__).resolve().parents[2] / "data" / "sample" / "spiece.model"  # 8000 pieces


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("finetune_bad")
    run = make_run_dir(root / "run", make_tokenizer(root / "tok"))
    write_sst2(root / "sst2", 8, 8)
    return root, run


def _bad(capsys, *argv) -> str:
    code = cli_main(["finetune", *argv, "--no-tracking"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("albert-dist finetune: "), err
    return err[0]


def test_unknown_task(world, capsys):
    root, run = world
    assert "unknown task 'sst3'" in _bad(capsys, str(run), "--task", "sst3", "--data-dir", str(root / "sst2"))


def test_missing_column_and_differing_label_sets(world, capsys):
    root, run = world
    write_glue_tsv(root / "f/train.tsv", ["text", "y"], [["a0 a1", "x"], ["b0 b1", "y"]])
    write_glue_tsv(root / "f/dev.tsv", ["text", "y"], [["a0 a1", "x"], ["b0", "z"]])
    files = ["--train-file", str(root / "f/train.tsv"), "--validation-file", str(root / "f/dev.tsv")]
    assert "no column 'sentence' (--text-column)" in _bad(capsys, str(run), *files, "--label-column", "y")
    line = _bad(capsys, str(run), *files, "--text-column", "text", "--label-column", "y")
    assert "label sets differ" in line and "'z'" in line


def test_model_without_tokenizer(world, capsys):
    root, run = world
    hf = root / "hf-no-tokenizer"
    hf.mkdir(exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(run / "final_model/hf" / name, hf / name)
    line = _bad(capsys, str(hf), "--task", "sst2", "--data-dir", str(root / "sst2"), "--output", str(root / "o"))
    assert "no tokenizer" in line
    no_tok = root / "run-no-tokenizer"
    shutil.copytree(run, no_tok, dirs_exist_ok=True)
    config = yaml.safe_load((no_tok / "config.yaml").read_text())
    config["data"] = {}
    (no_tok / "config.yaml").write_text(yaml.safe_dump(config))
    assert "names no tokenizer (data.tokenizer_path)" in _bad(capsys, str(no_tok), "--task", "sst2", "--data-dir",
                                                              str(root / "sst2"))


def test_vocabulary_differs_from_tokenizer(world, capsys):
    root, run = world
    other = root / "run-other-tokenizer"
    shutil.copytree(run, other, dirs_exist_ok=True)
    config = yaml.safe_load((other / "config.yaml").read_text())
    config["data"]["tokenizer_path"] = str(SAMPLE_TOKENIZER)
    (other / "config.yaml").write_text(yaml.safe_dump(config))
    line = _bad(capsys, str(other), "--task", "sst2", "--data-dir", str(root / "sst2"))
    assert "the tokenizer has 8000 pieces but the model's vocab_size is 45" in line


def test_no_such_step_model_or_length(world, capsys):
    root, run = world
    data = ["--task", "sst2", "--data-dir", str(root / "sst2")]
    assert "--step 99: no checkpoint" in _bad(capsys, str(run), "--step", "99", *data)
    assert "not an MLflow run id" in _bad(capsys, str(root / "nowhere"), *data)
    assert "--max-seq-length 64 exceeds the model's max_position_embeddings 32" in _bad(
        capsys, str(run), *data, "--max-seq-length", "64")
    assert not (run / "downstream.json").exists()


def test_bad_hyper_parameters_name_their_flag(world, capsys):
    root, run = world
    data = [str(run), "--task", "sst2", "--data-dir", str(root / "sst2")]
    assert "--learning-rate must be > 0, got -1.0" in _bad(capsys, *data, "--learning-rate", "-1")
    assert "--epochs must be > 0, got 0.0" in _bad(capsys, *data, "--epochs", "0")
    assert "--deepspeed nope.json: no such file" in _bad(capsys, *data, "--deepspeed", "nope.json")
    assert "--seeds has duplicates" in _bad(capsys, *data, "--seeds", "1", "1")


def test_hub_unreachable_asks_for_data_dir(world, capsys, monkeypatch):
    """Without --data-dir GLUE comes from the hub; unreachable (simulated: no network is touched) is exit 2."""
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'nyu-mll/glue' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    line = _bad(capsys, str(world[1]), "--task", "rte")
    assert "rte: could not load nyu-mll/glue from the hub" in line and "pass --data-dir" in line



def test_a_data_dir_without_the_task_names_the_task_and_the_folders_looked_for(world, capsys):
    """A parent of GLUE task folders that lacks one asked task: exit 2 naming the task and every folder name tried
    (not a `train.tsv` of the parent, which never was a task folder)."""
    root, run = world
    msg = _bad(capsys, str(run), "--task", "sst2", "stsb", "--data-dir", str(root))
    assert "no stsb task in it (looked for stsb/train.tsv, glue-stsb/train.tsv, STS-B/train.tsv)" in msg, msg


def test_run_id_in_a_store_that_does_not_exist(world, capsys, tmp_path):
    """A run id looked up in a missing SQLite store is refused naming the store, and no empty store is left
    behind (MLflow would create one and answer "Run ... not found")."""
    root, _ = world
    store = tmp_path / "moved" / "mlruns.db"
    line = _bad(capsys, "0123456789abcdef0123456789abcdef", "--task", "sst2", "--data-dir", str(root / "sst2"),
                "--tracking-uri", f"sqlite:///{store}", "--output", str(tmp_path / "o"))
    assert f"no MLflow store at {store}" in line and "--tracking-uri" in line
    assert not store.exists() and not store.parent.exists()


def test_a_transformers_directory_without_a_pooler_is_said(world, caplog, tmp_path):
    """run_mlm's AlbertForMaskedLM saves no pooler and no SOP head: they start fresh (as in transformers) and
    the log names them; the run's own full export loads without that warning."""
    import logging

    import transformers

    from albert_dist.finetune.source import from_transformers_dir

    _, run = world
    full = run / "final_model" / "hf"
    with caplog.at_level(logging.WARNING, logger="albert_dist.finetune.source"):
        from_transformers_dir(full).encoder_state()
    assert not [r for r in caplog.records if "random init" in r.getMessage()]
    mlm = tmp_path / "mlm"
    transformers.AlbertForMaskedLM.from_pretrained(full).save_pretrained(mlm)
    for f in full.iterdir():
        if not (mlm / f.name).exists():
            shutil.copy(f, mlm / f.name)
    with caplog.at_level(logging.WARNING, logger="albert_dist.finetune.source"):
        state = from_transformers_dir(mlm).encoder_state()
    said = [r.getMessage() for r in caplog.records if "random init" in r.getMessage()]
    assert len(said) == 1 and "albert.pooler" in said[0] and "sop_classifier" in said[0], said
    assert state  # the encoder still loads
