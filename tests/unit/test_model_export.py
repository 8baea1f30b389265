"""`albert-dist export`: a saved state dict becomes a transformers directory with the same logits."""
from pathlib import Path

import pytest
import torch

from albert_dist.model import AlbertConfig, AlbertForPreTraining
from albert_dist import cli as albert_dist_cli

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=90, embedding_size=16, hidden_size=32, num_hidden_layers=3, num_hidden_groups=3,
            num_attention_heads=4, intermediate_size=48, max_position_embeddings=16)


def cli(argv: list[str]) -> int:
    """`albert-dist export ARGV`."""
    return albert_dist_cli.main(["export", *argv])


def write_yaml(path: Path, fields: dict, section: bool) -> Path:
    lines = [f"{'  ' if section else ''}{k}: {v}" for k, v in fields.items()]
    path.write_text(("model:\n" if section else "") + "\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("as_dir, section", [(False, False), (True, True)])
def test_export_round_trip(tmp_path, as_dir, section):
    torch.manual_seed(0)
    model = AlbertForPreTraining(AlbertConfig(**TINY)).eval()
    state = {("module." + k if as_dir else k): v for k, v in model.state_dict().items()}
    ckpt = tmp_path / "ckpt"
    if as_dir:
        ckpt.mkdir()
        torch.save(state, ckpt / "pytorch_model.bin")
    else:
        torch.save(state, ckpt)
    config = write_yaml(tmp_path / "model.yaml", TINY, section)
    assert cli([str(ckpt), "--config", str(config), "--output", str(tmp_path / "hf")]) == 0
    hf = transformers.AlbertForPreTraining.from_pretrained(tmp_path / "hf").eval()
    ids = torch.randint(0, 90, (2, 7))
    mask, types = torch.ones_like(ids), torch.zeros_like(ids)
    with torch.no_grad():
        mlm, sop = model.logits(ids, mask, types)
        ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
    torch.testing.assert_close(mlm, ref.prediction_logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(sop, ref.sop_logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("change, fragments", [
    ({"num_hidden_groups": 1}, ["unexpected keys"]),
    # e.g. the main recipe's checkpoint (128 positions) with the albert-tiny preset (512)
    ({"max_position_embeddings": 32}, ["albert.embeddings.position_embeddings.weight", "(16, 16)", "(32, 16)"]),
])
def test_mismatching_checkpoint_is_a_clear_error(tmp_path, capsys, change, fragments):
    model = AlbertForPreTraining(AlbertConfig(**TINY))
    torch.save(model.state_dict(), tmp_path / "ckpt.pt")
    config = write_yaml(tmp_path / "model.yaml", {**TINY, **change}, False)
    assert cli([str(tmp_path / "ckpt.pt"), "--config", str(config), "--output", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("albert-dist export: ") and "does not match" in err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


def test_missing_checkpoint_file(tmp_path, capsys):
    config = write_yaml(tmp_path / "model.yaml", TINY, False)
    assert cli([str(tmp_path), "--config", str(config), "--output", str(tmp_path / "hf")]) == 2
    assert "pytorch_model.bin" in capsys.readouterr().err
    assert cli([str(tmp_path / "nope.pt"), "--config", str(config), "--output", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("albert-dist export: ") and "nope.pt" in err and "Traceback" not in err


def test_export_finds_the_config_and_tokenizer_beside_a_runs_final_model(tmp_path, capsys):
    """A run's final_model/fp32/ exports with no --config and no --tokenizer: model.yaml beside it, the
    tokenizer named by the run's config.yaml; without anything beside it, --config is asked for."""
    import dataclasses
    import shutil

    import yaml

    from albert_dist.config import load_config, to_yaml
    from albert_dist.runs.weights import save_state_dict

    run = tmp_path / "run"
    fp32 = run / "final_model" / "fp32"
    cfg = load_config(None, [f"model.{k}={v}" for k, v in TINY.items()] + [f"run_dir={run}"])
    fp32.mkdir(parents=True)
    (run / "config.yaml").write_text(to_yaml(cfg))
    torch.manual_seed(0)
    model = AlbertForPreTraining(cfg.model).eval()
    save_state_dict(model.state_dict(), fp32 / "model.safetensors")
    (fp32 / "model.yaml").write_text(yaml.safe_dump(dataclasses.asdict(cfg.model)))
    assert cli([str(fp32), "--output", str(tmp_path / "hf")]) == 0
    assert f"model config from {fp32 / 'model.yaml'}; tokenizer {cfg.data.tokenizer_path}" in capsys.readouterr().out
    assert (tmp_path / "hf" / "spiece.model").is_file()
    hf = transformers.AlbertForPreTraining.from_pretrained(tmp_path / "hf").eval()
    ids = torch.randint(0, 90, (2, 7))
    with torch.no_grad():
        mlm, _ = model.logits(ids, torch.ones_like(ids), torch.zeros_like(ids))
        ref = hf(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids))
    torch.testing.assert_close(mlm, ref.prediction_logits, rtol=0, atol=1e-5)

    alone = tmp_path / "alone.safetensors"
    save_state_dict(model.state_dict(), alone)
    assert cli([str(alone), "--output", str(tmp_path / "hf2")]) == 2
    assert "no config beside it" in capsys.readouterr().err
    # a run without checkpoints: its final model (albert_dist.runs' rule, as model.init_from and finetune read it)
    assert cli([str(run), "--output", str(tmp_path / "hf3")]) == 0
    took = f"{run} -> final model (step {cfg.max_steps}), the final model, no checkpoint left"
    assert took in capsys.readouterr().out
    shutil.rmtree(run / "final_model")
    assert cli([str(run), "--output", str(tmp_path / "hf4")]) == 2  # nothing left to export
    assert f"{run}: a run directory without a final model and without a checkpoint in {run / 'checkpoints'}" in \
        capsys.readouterr().err
