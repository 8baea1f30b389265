"""Every relative path of a TrainConfig is resolved once, in `load_config`: inputs against the working directory
if they exist there, else against the repository root; outputs against the working directory."""
from __future__ import annotations

from pathlib import Path

from albert_dist.config import load_config, to_yaml

REPO = Path(__file__).resolve().parents[2]


def test_relative_paths_are_absolute_after_load_from_any_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.txt").write_text("a local corpus\n")
    cfg = load_config(None, ["run_dir=out", "checkpoint.dir=ckpts",
                             "data.train=[{paths: [mine.txt]}, {paths: ['data/sample/wikitext-2-train-*.txt']}]"])
    assert cfg.run_dir == str(tmp_path / "out") and cfg.checkpoint.dir == str(tmp_path / "ckpts")
    assert cfg.data.tokenizer_path == str(REPO / "data" / "sample" / "spiece.model")
    assert cfg.data.train[0].paths == [str(tmp_path / "mine.txt")]  # the working directory first
    assert cfg.data.train[1].paths == [str(REPO / "data" / "sample" / "wikitext-2-train-*.txt")]
    assert cfg.data.validation[0].paths == [str(REPO / "data" / "sample" / "wikitext-2-validation.txt")]
    # config.yaml holds the absolute paths, and reads back to the same config from anywhere
    (tmp_path / "config.yaml").write_text(to_yaml(cfg))
    monkeypatch.chdir(REPO)
    again = load_config(tmp_path / "config.yaml")
    assert again == cfg


def test_hub_names_and_auto_stay_as_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, ["data.train=[{paths: [wikitext], format: hub}]", "checkpoint.resume=auto"])
    assert cfg.data.train[0].paths == ["wikitext"] and cfg.checkpoint.resume == "auto" and cfg.run_dir is None
