"""`bash bench/gpu_check.sh --cpu`: the one-shot GPU check's six phases at tiny sizes on CPU (no GPU in CI), so the
command a GPU session runs once does not rot; and its refusal, in seconds, on a Python without the kit."""
import json
import subprocess
import sys

import pytest
import torch
from fixtures.finetune_run import write_sst2
from helpers import REPO, clean_env

pytestmark = pytest.mark.integration
PHASES = ["env", "attention", "step", "exactness", "pretrain", "downstream"]


@pytest.mark.timeout(1200)
def test_gpu_check_cpu_runs_every_phase(tmp_path):
    # the downstream phase's data: SST-2's layout (sentence, label), generated (the phase reads 16 + 16 rows)
    sst2 = write_sst2(tmp_path / "sst2", n_train=32, n_dev=16)
    out = tmp_path / "out"
    proc = subprocess.run(["bash", "bench/gpu_check.sh", "--cpu"], cwd=REPO,
                          env=clean_env(OUT=str(out), PYTHON=sys.executable, GPU_DATA=str(sst2)),
                          capture_output=True, text=True, timeout=1150)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["phases"]) == PHASES and summary["ok"]
    r = {name: p["result"] for name, p in summary["phases"].items()}
    assert all(p["status"] == "ok" and p["seconds"] <= p["limit_s"] for p in summary["phases"].values())
    assert r["env"]["versions"]["torch"] == torch.__version__ and r["env"]["peaks"]["measured_float32_tflops"] > 0
    assert r["env"]["peaks"]["datasheet_float32_tflops"] is None  # a CPU has no datasheet row
    assert isinstance(r["attention"]["forward_backward"]["math_no_mask_ms"], float)
    assert all(r["attention"]["default_kernels"][k] for k in ("no_mask", "mask", "model_unpadded_batch"))
    timer_off, timer_on = r["step"]["runs"]
    # DeepSpeed's throughput timer synchronizes the device (counted through its accelerator API); off, nothing does
    assert timer_off["device_syncs_per_step"] == {"accelerator": 0.0, "torch.cuda": 0.0}
    assert timer_on["device_syncs_per_step"]["accelerator"] >= 1 and timer_on["optimizer"] == "lamb"
    assert 0 < timer_off["mfu_measured_peak_median"] <= 1 and "mfu_median" not in timer_off
    # the "device" is the CPU: its bf16 is the floor itself and its fp32 the reference
    assert r["exactness"]["ratio_to_floor"] == {"per_tensor_max": 1.0, "whole_model": 1.0}
    assert r["exactness"]["device_fp32_vs_cpu_fp32 (TF32 off)"]["whole_model"] == 0.0
    assert 1e-3 < r["exactness"]["cpu_bf16_vs_cpu_fp32 (floor)"]["whole_model"] < 0.1
    pre = r["pretrain"]
    assert (pre["first_exit"], pre["resumed_exit"], pre["export_exit"]) == (75, 0, 0) and pre["steps_continue"]
    assert pre["last_step"] == pre["max_steps"] == 2 * pre["stopped_at_step"]
    assert "config.json" in pre["export_files"]
    assert 0 < pre["perf_last"]["perf/mfu_measured_peak"] <= 1 and "perf/mfu" not in pre["perf_last"]
    for init in ("pretrained", "random"):
        down = r["downstream"][init]
        assert sorted(down["accuracy"]) == ["1", "2", "3"] and down["dev_examples"] == 16
        assert all(0 <= a <= 1 for a in down["accuracy"].values())


def test_gpu_check_without_the_kit_names_what_to_carry(tmp_path):
    bare = tmp_path / "python"  # a Python with the standard library only (-I -S: no site-packages, no PYTHONPATH)
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n")
    bare.chmod(0o755)
    proc = subprocess.run(["bash", "bench/gpu_check.sh"], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env=clean_env(OUT=str(tmp_path / "out"), PYTHON=str(bare), WHEELS=str(tmp_path / "none")))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "lacks torch transformers" in proc.stdout and 'carry [".whl", ".gpu_data"]' in proc.stdout
    assert not (tmp_path / "out" / "summary.json").exists()


def test_gpu_kit_without_sst2_is_refused_at_once_saying_what_sst2_must_point_to(tmp_path):
    """`make gpu-kit` on a clone with no SST-2 corpus beside it failed after minutes of downloads with "set SST2=DIR",
    which no doc mentioned (issue 46). Now the folder is checked before anything is fetched: the stand-in Python
    fails the test if the script gets as far as calling it."""
    never = tmp_path / "python"
    never.write_text("#!/bin/sh\necho 'python was called' >&2\nexit 99\n")
    never.chmod(0o755)
    (tmp_path / "sst2").mkdir()
    (tmp_path / "sst2" / "train.tsv").write_text("sentence\tlabel\n")  # dev.tsv missing
    proc = subprocess.run(["bash", "bench/gpu_wheels.sh"], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env=clean_env(PYTHON=str(never), SST2=str(tmp_path / "sst2"), WHEELS=str(tmp_path / "whl"),
                                        GPU_DATA=str(tmp_path / "data")))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr == (f"gpu kit: no SST-2 at {tmp_path / 'sst2'} (dev.tsv missing): set SST2 to a folder with "
                           "GLUE SST-2's train.tsv and dev.tsv (GLUE's SST-2.zip unpacked), e.g. make gpu-kit "
                           "SST2=/data/glue/SST-2\n")
    assert not (tmp_path / "whl").exists()
