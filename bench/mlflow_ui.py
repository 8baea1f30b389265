"""Look at two training runs the way a user does: in the MLflow UI (headless Chromium screenshots) and with
`albert-dist compare`.

    python bench/mlflow_ui.py --out screens/          # needs `chromium` (Debian: apt-get install -y chromium)

Starts `mlflow server` on a free port (SQLite + served artifacts in a temporary directory), trains two short
CPU runs of the tiny recipe that differ in `model.num_hidden_groups` (one rank each, system metrics every
2 s), then writes PNGs of: the experiment's run list, a run's overview, its model metrics, its system
metrics, its artifacts, the compare page of both runs, and `albert-dist compare`'s curves. Takes 3-5 minutes
on 2 cores (two trainings and the server start), too long for CI: run it by hand and look at the PNGs.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "configs" / "pretrain" / "albert-tiny-wikitext.yaml"
SHORT = ["max_steps=40", "log_interval_steps=2", "eval_interval_steps=10", "data.eval_examples=64",
         "checkpoint.save_interval_steps=20", "optimizer.warmup_ratio=0.1", "progress_bar=false",
         "engine.zero_stage=0", "tracking.experiment_name=albert_dist-ui", "tracking.system_metrics_interval_s=2",
         "tracking.flush_interval_s=1"]
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--window-size=1600,1000"]
#: Seconds a page gets to fetch and draw its charts before the screenshot (`--screenshot` with a virtual-time
#: budget shoots MLflow's charts while they still spin, so the page is driven over the DevTools protocol).
SETTLE_S = 12.0


def start_server(root: Path, port: int) -> subprocess.Popen:
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                             f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "artifacts"),
                             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                            stdout=open(root / "server.log", "wb"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    for _ in range(240):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc
        except OSError:
            time.sleep(0.5)
    raise RuntimeError((root / "server.log").read_text()[-3000:])


class Browser:
    """Headless Chromium driven over the DevTools protocol (aiohttp's websocket client): navigate, wait in real
    time, capture."""

    def __init__(self, port: int):
        self.profile = tempfile.mkdtemp(prefix="chromium_")
        self.proc = subprocess.Popen(["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}",
                                      f"--remote-debugging-port={port}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.port = port

    def shoot(self, url: str, path: Path, settle_s: float = SETTLE_S) -> None:
        import asyncio
        import base64

        import aiohttp

        async def run() -> bytes:
            async with aiohttp.ClientSession() as http:
                for _ in range(100):
                    try:
                        async with http.get(f"http://127.0.0.1:{self.port}/json/list") as r:
                            pages = [t for t in await r.json() if t["type"] == "page"]
                        break
                    except aiohttp.ClientError:
                        await asyncio.sleep(0.3)
                async with http.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                    async def call(i: int, method: str, **params) -> dict:
                        await ws.send_json({"id": i, "method": method, "params": params})
                        async for msg in ws:
                            data = msg.json()
                            if data.get("id") == i:
                                return data.get("result", {})
                        raise RuntimeError("DevTools connection closed")

                    await call(1, "Emulation.setDeviceMetricsOverride", width=1600, height=1000, deviceScaleFactor=1,
                               mobile=False)
                    await call(3, "Page.navigate", url=url)
                    await asyncio.sleep(settle_s)
                    shot = await call(2, "Page.captureScreenshot", format="png")
                    return base64.b64decode(shot["data"])

        path.write_bytes(asyncio.run(run()))
        print(f"{path}  <- {url}")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def main() -> None:
    from albert_dist.distributed.env import free_port

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="screens", help="directory for the PNGs")
    args = p.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="mlflow_ui_"))
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = start_server(root, port)
    try:
        runs = []
        for groups in (1, 2):
            run_dir = root / f"albert-tiny-groups{groups}"
            env = dict(os.environ, MLFLOW_TRACKING_URI=uri, OMP_NUM_THREADS="1")
            subprocess.run([sys.executable, "-m", "albert_dist.cli", "train", "--config", str(RECIPE), *SHORT,
                            f"model.num_hidden_groups={groups}", f"run_dir={run_dir}"], env=env, cwd=REPO, check=True)
            runs.append(json.loads((run_dir / "mlflow_run.json").read_text())["run_id"])
        import mlflow

        client = mlflow.MlflowClient(uri)
        exp = client.get_run(runs[0]).info.experiment_id
        browser = Browser(free_port())
        try:
            base, ml = f"{uri}/#/experiments/{exp}", "workflowType=machine_learning"
            browser.shoot(f"{base}", out / "0-experiment-default-view.png")  # what a fresh browser opens on
            browser.shoot(f"{base}?{ml}", out / "1-run-list.png")  # the link the tracker logs
            browser.shoot(f"{base}/runs/{runs[1]}?{ml}", out / "2-run-overview.png")
            browser.shoot(f"{base}/runs/{runs[1]}/model-metrics?{ml}", out / "3-run-model-metrics.png")
            browser.shoot(f"{base}/runs/{runs[1]}/system-metrics?{ml}", out / "4-run-system-metrics.png")
            browser.shoot(f"{base}/runs/{runs[1]}/artifacts?{ml}", out / "5-run-artifacts.png")
            browser.shoot(f"{uri}/#/compare-runs?runs={json.dumps(runs)}&experiments={json.dumps([exp])}&{ml}",
                          out / "6-compare-runs.png")
        finally:
            browser.close()
        subprocess.run([sys.executable, "-m", "albert_dist.cli", "compare", *runs, "--tracking-uri", uri,
                        "--output", str(out / "7-albert-dist-compare.png")], cwd=REPO, check=True)
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
