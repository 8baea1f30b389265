"""`bash bench/gpu_check.sh --cpu`: the GPU check's own code paths on CPU (no GPU in CI), so the one command a GPU
session runs does not rot. Tiny model, two steps, the "eager" compile backend (dynamo traces, inductor generates
nothing): it checks the check, it measures nothing. The figures of a real run are in docs/benchmarks.md."""
import json
import subprocess

import pytest
from helpers import REPO, clean_env

pytestmark = pytest.mark.integration


@pytest.mark.timeout(900)
def test_gpu_check_cpu_smoke_run(tmp_path):
    proc = subprocess.run(["bash", "bench/gpu_check.sh", "--cpu"], cwd=REPO, env=clean_env(OUT=str(tmp_path)),
                          capture_output=True, text=True, timeout=850)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert (tmp_path / "gpu_check.log").stat().st_size > 0
    assert not result.get("failed") and not result["skipped"]
    variants = result["engine"]["64"]
    assert set(variants) == {"eager_dynamic", "eager_static", "block", "model"}
    for name, r in variants.items():
        assert r["steps"] == 2 and all(t > 0 for t in r["tokens_per_s"]), name
        assert r["syncs"]["checked"] is False  # sync-debug mode needs CUDA
    # the same weights and batches: every variant's first loss is the same number (bf16 rounding apart)
    first = [r["loss_first"] for r in variants.values()]
    assert max(first) - min(first) < 1e-4 * max(first), first
    assert variants["eager_dynamic"]["slots_per_row"] is None and variants["eager_static"]["slots_per_row"] == 21
    assert variants["block"]["graphs"] == 2 and variants["model"]["graphs"] == 1
    assert set(result["ratios"]["64"]) == {"static_over_dynamic", "block_over_eager", "model_over_eager"}
    assert result["model_step"]["64"]["ratio_ours_over_hf"]
