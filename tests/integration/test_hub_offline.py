"""A hub source on a node without network, as a new user met it: `albert-dist train` in a fresh process with
HF_HUB_OFFLINE=1 / HF_DATASETS_OFFLINE=1 in its environment (read by huggingface_hub and datasets at import, which
the unit tests can only imitate: tests/unit/test_hub_sources.py) and a made-up dataset name. It failed after
~30 s of start-up with an 85-line traceback; now exit 2 with one line, in the time the imports take."""
from __future__ import annotations

import time

import pytest

from helpers import REPO, clean_env, run_cli

pytestmark = pytest.mark.integration
RECIPE = str(REPO / "configs/pretrain/albert-tiny-wikitext.yaml")


def test_an_unreachable_hub_dataset_is_one_line_and_exit_2_in_a_fresh_process(tmp_path):
    name = "albert-dist-tests/no-such-dataset-4f2a"
    t0 = time.monotonic()
    proc = run_cli("train", "--config", RECIPE, "tracking.enabled=false", f"run_dir={tmp_path / 'run'}",
                   f"data.train=[{{paths: [{name}], format: hub}}]",
                   env=clean_env(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1"), timeout=120)
    took = time.monotonic() - t0
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1] == (f"albert-dist train: data.train[0]: hub dataset {name!r}: offline "
                         "(HF_HUB_OFFLINE/HF_DATASETS_OFFLINE set) and not in the local HF cache"), proc.stderr
    assert "Traceback" not in proc.stderr and took < 30, (took, proc.stderr)
    assert not (tmp_path / "run").exists()
