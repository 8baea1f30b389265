"""`albert_dist.apps.finetune` takes `FinetuneOptions`, not argparse's namespace, and raises bad input for the front end
(`albert_dist.cli`) to print as the one error line."""
from __future__ import annotations

import dataclasses

import pytest

from albert_dist.cli import build_parser, _parse
from albert_dist.cli.finetune import options
from albert_dist.apps.finetune.options import FinetuneOptions


def test_the_flags_and_the_options_are_one_set_with_the_same_defaults():
    args = _parse(build_parser("finetune"), ["finetune", "runs/x", "--task", "sst2"])
    own = {"command", "command_line", "command_path"}
    assert set(vars(args)) - own == {f.name for f in dataclasses.fields(FinetuneOptions)}
    assert options(args) == FinetuneOptions(model="runs/x", task=["sst2"])


def test_bad_input_is_raised_not_printed(capsys):
    pytest.importorskip("transformers")
    from albert_dist.apps.finetune.run import finetune

    with pytest.raises(ValueError, match=r"--seeds has duplicates: \[1, 1\]"):
        finetune(FinetuneOptions(model="runs/x", task=["sst2"], seeds=[1, 1]))
    assert capsys.readouterr().err == ""
