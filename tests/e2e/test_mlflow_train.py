"""The real trainer under the real deepspeed launcher (2 CPU ranks, ZeRO-2) logging to a real MLflow server:
one run per job, killed with SIGKILL mid-run, continued with `--resume-from runs:/<id>` on a fresh run
directory (no step logged twice, none missing, the re-run steps' values equal, run FINISHED; the one test of
`--resume-from`), and the final model exported from MLflow loads in transformers with the same MLM logits
as ours.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import read_metrics
from mlflow import MlflowClient

from albert_dist.distributed.env import free_port

from albert_dist.engine import metric_names as names
from albert_dist.tracking.checkpoints import complete_checkpoints

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "configs" / "pretrain" / "albert-tiny-wikitext.yaml"
MAX_STEPS = 16
OVERRIDES = [f"max_steps={MAX_STEPS}", "log_interval_steps=1", "eval_interval_steps=0", "data.eval_examples=8",
             "checkpoint.save_interval_steps=4", "optimizer.warmup_steps=2", "progress_bar=false",
             "tracking.experiment_name=train_e2e", "tracking.flush_interval_s=0.5", "tracking.retry_backoff_s=0.5"]


def launch(uri: str, run_dir: Path, *extra: str) -> subprocess.Popen:
    """`deepspeed --num_gpus 2 ... -m albert_dist.cli train` (as launch/pretrain_local.sh), own process group."""
    deepspeed = str(Path(sys.executable).with_name("deepspeed"))
    env = dict(os.environ, MLFLOW_TRACKING_URI=uri, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               MLFLOW_HTTP_REQUEST_MAX_RETRIES="2", MLFLOW_HTTP_REQUEST_TIMEOUT="20")
    cmd = [deepspeed, "--num_gpus", "2", "--master_port", str(free_port()), "--no_local_rank", "--module",
           "albert_dist.cli", "train", "--config", str(RECIPE), f"run_dir={run_dir}", *OVERRIDES, *extra]
    log = open(run_dir.parent / f"{run_dir.name}.log", "w")
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def log_tail(run_dir: Path) -> str:
    return (run_dir.parent / f"{run_dir.name}.log").read_text(errors="replace")[-5000:]


@pytest.fixture(scope="module")
def resumed_run(mlflow_server, tmp_path_factory):
    """Run A is SIGKILLed once step >= 6 is logged past its newest complete checkpoint (4, 8 or 12); run B
    resumes it from MLflow."""
    tmp = tmp_path_factory.mktemp("train_e2e")
    client = MlflowClient(mlflow_server.uri)
    run_a = tmp / "a"
    proc = launch(mlflow_server.uri, run_a)
    run_id, killed = None, False
    try:
        deadline = time.monotonic() + 400
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            if run_id is None and (run_a / "mlflow_run.json").is_file():
                run_id = json.loads((run_a / "mlflow_run.json").read_text())["run_id"]
            if run_id is not None:
                steps = [m.step for m in client.get_metric_history(run_id, names.TRAIN_LOSS)]
                complete = complete_checkpoints(client, run_id)  # newest first
                # kill only while steps past the newest complete checkpoint are logged, so that run B must
                # re-run steps the run already holds (a kill right at a checkpoint would test no de-duplication)
                if max(steps, default=0) >= 6 and complete and max(steps) > complete[0][0]:
                    os.killpg(proc.pid, signal.SIGKILL)
                    killed = True
                    break
    finally:
        if proc.poll() is None and not killed:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert killed, f"run A ended before it could be killed (rc {proc.returncode}):\n{log_tail(run_a)}"
    logged_before_kill = sorted(m.step for m in client.get_metric_history(run_id, names.TRAIN_LOSS))
    run_b = tmp / "b"
    proc = launch(mlflow_server.uri, run_b, "--resume-from", f"runs:/{run_id}")
    rc = proc.wait(timeout=400)
    assert rc == 0, log_tail(run_b)
    return {"client": client, "run_id": run_id, "run_b": run_b, "tmp": tmp, "logged_before_kill": logged_before_kill}


def test_two_rank_job_is_one_run_resumed_without_duplicate_or_missing_step(resumed_run):
    client, run_id = resumed_run["client"], resumed_run["run_id"]
    exp = client.get_experiment_by_name("train_e2e")
    assert [r.info.run_id for r in client.search_runs([exp.experiment_id])] == [run_id]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["resumed_count"] == "1"
    for key in (names.TRAIN_LOSS, names.TRAIN_MLM_ACCURACY, names.TRAIN_LR, names.PERF_MFU_MEASURED_PEAK, names.mem_peak_rank(1)):
        assert sorted(m.step for m in client.get_metric_history(run_id, key)) == list(range(1, MAX_STEPS + 1)), key
    assert [m.step for m in client.get_metric_history(run_id, names.VAL_LOSS)] == [MAX_STEPS]
    assert "interval_s" not in run.data.metrics and not any(k.startswith("peak_mem") for k in run.data.metrics)
    assert run.info.run_name == "a"  # the first job's run directory
    assert "engine.peak_tflops_per_device" not in run.data.params  # null options are not logged
    # run B restarted from the newest complete checkpoint and re-ran steps run A had already logged
    records = read_metrics(resumed_run["run_b"])
    resumed_at = min(r["step"] for r in records) - 1
    # a checkpoint can complete between the poll and the kill, so run B may start exactly at the last logged step
    assert resumed_at in (4, 8, 12) and resumed_at <= max(resumed_run["logged_before_kill"])
    # the run holds one value per step: run A's for the steps B re-ran, equal to B's (the resume is exact)
    held = {m.step: m.value for m in client.get_metric_history(run_id, names.TRAIN_LOSS)}
    assert {r["step"]: held[r["step"]] for r in records if names.TRAIN_LOSS in r} == \
        {r["step"]: r[names.TRAIN_LOSS] for r in records if names.TRAIN_LOSS in r}
    # params: the resolved config and derived values, checked against the closed-form count
    from albert_dist.config import load_config
    from albert_dist.model.sharing import block_parameter_counts, parameter_count

    cfg = load_config(str(RECIPE), OVERRIDES)
    params = run.data.params
    assert params["model.num_hidden_groups"] == "2" and params["engine.zero_stage"] == "2"
    global_batch = cfg.engine.train_micro_batch_size_per_gpu * cfg.engine.gradient_accumulation_steps * 2
    assert params["derived.world_size"] == "2" and params["derived.train_batch_size"] == str(global_batch)
    assert params["derived.unique_parameters"] == str(parameter_count(cfg.model))
    attn, ffn = block_parameter_counts(cfg.model)
    groups, layers = cfg.model.num_hidden_groups, cfg.model.num_hidden_layers
    assert params["derived.total_parameters"] == str(parameter_count(cfg.model) + (layers - groups) * (attn + ffn))
    assert params["derived.group_0_parameters"] == str(attn + ffn)
    assert "version.deepspeed" in run.data.tags and "mlflow.source.git.commit" in run.data.tags
    assert run.data.tags["num_hosts"] == "1" and "version.torch" in run.data.tags
    artifacts = {a.path for a in client.list_artifacts(run_id, "config")} | \
        {a.path for a in client.list_artifacts(run_id, "tokenizer")}
    assert artifacts == {"config/config.yaml", "config/ds_config.json", "tokenizer/spiece.model"}
    newest, marker = complete_checkpoints(client, run_id)[0]
    assert newest == MAX_STEPS and {"zero_pp_rank_0_mp_rank_00_optim_states.pt",  # every rank's shard
                                    "zero_pp_rank_1_mp_rank_00_optim_states.pt"} <= set(marker["files"])


def test_final_model_from_mlflow_loads_in_transformers_with_our_logits(resumed_run):
    from transformers import AlbertForPreTraining as HFAlbert
    from transformers import AlbertTokenizer

    import sentencepiece as spm

    from albert_dist.config import load_model_config

    client, run_id, tmp = resumed_run["client"], resumed_run["run_id"], resumed_run["tmp"]
    hf_dir = client.download_artifacts(run_id, "model/hf", str(tmp / "dl_hf"))
    fp32_dir = Path(client.download_artifacts(run_id, "model/fp32", str(tmp / "dl_fp32")))
    ckpt_dir = Path(client.download_artifacts(run_id, f"checkpoints/step_{MAX_STEPS}", str(tmp / "dl_ckpt")))

    # the consolidated fp32 model (DeepSpeed's zero_to_fp32 over both ranks' partitions) equals the full
    # module weights each ZeRO-2 rank keeps in its model-states file: every group and the tied decoder intact
    from albert_dist.runs.weights import load_model

    ours = load_model(fp32_dir / "model.safetensors", load_model_config(fp32_dir / "model.yaml"))
    module = torch.load(ckpt_dir / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)["module"]
    state = ours.state_dict()
    assert set(module) == set(state)
    for name, tensor in module.items():
        assert torch.equal(tensor.float(), state[name]), name
    assert any(".albert_layer_groups.1." in n for n in state)
    assert ours.predictions.decoder.weight is ours.albert.embeddings.word_embeddings.weight

    hf = HFAlbert.from_pretrained(hf_dir).eval()
    tok = AlbertTokenizer.from_pretrained(hf_dir)
    text = ["The tower was built in 1889 .", "Valkyria Chronicles III is a tactical role @-@ playing game ."]
    sp = spm.SentencePieceProcessor(model_file=str(REPO / "data" / "sample" / "spiece.model"))
    batch = tok(text, padding=True, return_tensors="pt", return_token_type_ids=True)
    assert batch["input_ids"][0, : len(sp.encode(text[0])) + 2].tolist() == [2, *sp.encode(text[0]), 3]
    with torch.no_grad():
        out = hf(**batch)
        mlm, sop = ours.logits(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(out.prediction_logits[real], mlm[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.sop_logits, sop, rtol=1e-5, atol=1e-5)
