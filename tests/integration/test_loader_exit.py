"""A training loader left unfinished in the main process (0 workers: its stream a live generator) when the
interpreter exits: nothing on stderr. The generator is closed during shutdown, after module globals may be gone;
an ``except`` clause naming a module attribute then printed "Exception ignored in ... PretrainingStream.__iter__
... AttributeError: 'NoneType' object has no attribute 'StoreUnavailable'" (issue 45)."""
import subprocess
import sys

import pytest
from helpers import REPO, clean_env

pytestmark = pytest.mark.integration

SCRIPT = """
from albert_dist.job.console import install_noise_filters
install_noise_filters()  # torchdata's set_vital warning, filtered as a job filters it
from albert_dist.data.config import DataConfig, SourceConfig
from albert_dist.data.loader import build_train_loader
cfg = DataConfig(train=[SourceConfig(paths=["data/sample/wikitext-2-train-0*.txt"])],
                 tokenizer_path="data/sample/spiece.model", max_seq_length=64, num_workers=0)
loader = build_train_loader(cfg, 2, rank=0, world_size=1)
it = iter(loader)
print(sorted(next(it)))  # `it` stays referenced by a module global: closed only at interpreter exit
"""


def test_an_unfinished_loader_exits_without_a_message(tmp_path):
    script = tmp_path / "unfinished.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], cwd=REPO, env=clean_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['attention_mask', 'input_ids', 'mlm_labels', 'sop_labels', 'token_type_ids']"
    assert proc.stderr == ""
