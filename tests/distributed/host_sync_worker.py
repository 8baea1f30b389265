"""One rank of a training job whose device->host reads are counted: the real `Trainer`, loop and all.

    python tests/distributed/host_sync_worker.py --config C --out DIR [k=v ...]

On CPU there is no device to wait for, so the reads a GPU would wait on are counted instead: every call of
``Tensor.item``, ``tolist``, ``cpu``, ``numpy``, ``__bool__``, ``__int__``, ``__float__``, ``__index__`` and
``__array__`` during `Trainer.train()` (`torch.cuda.set_sync_debug_mode("error")` is the GPU's own check, in
bench/gpu_step.py), and every device drain that check cannot see: ``synchronize`` through DeepSpeed's accelerator
(``get_accelerator().synchronize``, a no-op on CPU) and torch's (``torch.cpu``, ``torch.cuda``,
``torch.accelerator``), recorded as method ``synchronize``. Each call is attributed to

* a *phase* of the loop: ``stop`` (`Trainer._agree_stop`, the documented stop-flag read after every step),
  ``log`` (`_log_train`, at log steps only), ``divergence`` (`_check_divergence`: the divergence flags, read at
  log steps and before saves), ``eval`` (`evaluate`), ``save`` (`save`), ``batch``
  (`Trainer._to_device`: the loader's host copy of a micro-batch, read before it is copied, so host memory on a
  GPU too), else ``step``: the micro-steps, the optimiser step, the metric accumulation and the next batches;
* an *owner*: the innermost frame outside torch's own package: albert_dist's code (``ours``), DeepSpeed's
  (``deepspeed``) or anything else (``other``), with that frame's ``file:function``.

and to the training forward it follows: ``micro`` = training forwards begun since the step began (0 before the
step's first; 1..GA-1 inside the accumulation window; GA in the last micro-step and its optimizer step).

Writes ``{"steps": N, "ga": GA, "calls": [{"phase", "owner", "site", "method", "step", "micro"}]}`` (JSON) to
``DIR/rank<r>.json``.
RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT come from the environment.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import torch

METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "__array__")
#: (module path, attribute) of the device-wide synchronize functions counted besides the accelerator's
SYNC_FUNCTIONS = (("torch.cpu", "synchronize"), ("torch.cuda", "synchronize"), ("torch.accelerator", "synchronize"))
TORCH_DIR = str(Path(torch.__file__).parent)


class SyncCounter:
    """Counts the `METHODS` calls made while `active`, with the phase set by `phase()` and the trainer's step."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer
        self.calls: list[dict] = []
        self.active = False
        self._phase = "step"
        self._busy = False  # a counted call that itself calls a counted method (__bool__ inside tolist...)
        self.forwards = 0  # training forwards begun (`count_forwards`)

    @contextlib.contextmanager
    def phase(self, name: str):
        before, self._phase = self._phase, name
        try:
            yield
        finally:
            self._phase = before

    def record(self, method: str) -> None:
        frame = sys._getframe(2)
        while frame is not None and frame.f_code.co_filename.startswith(TORCH_DIR):
            frame = frame.f_back
        filename = frame.f_code.co_filename if frame is not None else "?"
        owner = "ours" if "/albert_dist/" in filename else "deepspeed" if "/deepspeed/" in filename else "other"
        site = f"{filename.rsplit('/site-packages/', 1)[-1].rsplit('/albert_dist/', 1)[-1]}:" \
               f"{frame.f_code.co_name if frame is not None else '?'}"
        ga = getattr(self.trainer, "ga_steps", 1)
        self.calls.append({"phase": self._phase, "owner": owner, "site": site, "method": method,
                           "step": self.trainer.step, "micro": self.forwards - self.trainer.step * ga})

    def wrap(self, method: str, original=None):
        """`original` (default: ``torch.Tensor.<method>``) counted as `method` while active."""
        original = getattr(torch.Tensor, method) if original is None else original

        def counted(*args, **kwargs):
            if self.active and not self._busy:
                self._busy = True
                try:
                    self.record(method)
                finally:
                    self._busy = False
            return original(*args, **kwargs)

        return counted

    def count_synchronize(self, mp) -> None:
        """Count every device synchronize (`SYNC_FUNCTIONS` and DeepSpeed's accelerator's) through `mp`, a
        `pytest.MonkeyPatch`."""
        import importlib

        from deepspeed.accelerator import get_accelerator

        accel = get_accelerator()  # DeepSpeed's singleton: every get_accelerator() call returns this object
        mp.setattr(accel, "synchronize", self.wrap("synchronize", accel.synchronize))
        for module, name in SYNC_FUNCTIONS:
            try:
                owner = importlib.import_module(module)
            except ImportError:
                continue
            if hasattr(owner, name):
                mp.setattr(owner, name, self.wrap("synchronize", getattr(owner, name)))

    def count_forwards(self, mp, engine) -> None:
        """Count `engine`'s training forwards (``micro`` of each record) through `mp`."""
        original = engine.forward

        def forward(*args, **kwargs):
            if self.active and self._phase == "step":
                self.forwards += 1
            return original(*args, **kwargs)

        mp.setattr(engine, "forward", forward)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    import deepspeed.ops
    import pytest

    from albert_dist.config import load_config
    from albert_dist.distributed.env import discover
    from albert_dist.apps.pretrain.preflight import plan_job
    from albert_dist.apps.pretrain.trainer import Trainer

    cfg, env = load_config(args.config, args.overrides), discover()
    trainer = Trainer(plan_job(cfg, env))
    counter = SyncCounter(trainer)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(deepspeed.ops.__compatible_ops__, "deepspeed_shm_comm", False)  # plain gloo (ckpt_worker.py)
        for method in METHODS:
            if hasattr(torch.Tensor, method):
                mp.setattr(torch.Tensor, method, counter.wrap(method))
        counter.count_synchronize(mp)
        for name, phase in (("_agree_stop", "stop"), ("_log_train", "log"), ("evaluate", "eval"), ("save", "save"),
                            ("_to_device", "batch"), ("_check_divergence", "divergence")):
            original = getattr(Trainer, name)

            def in_phase(self, *a, _original=original, _phase=phase, **kw):
                with counter.phase(_phase):
                    return _original(self, *a, **kw)

            mp.setattr(Trainer, name, in_phase)
        try:
            trainer.setup()
            counter.count_forwards(mp, trainer.engine)
            counter.active = True
            code = trainer.train()
            counter.active = False
        finally:
            counter.active = False
            trainer.close("FINISHED")
    out = Path(args.out) / f"rank{trainer.dist_env.rank}.json"
    out.write_text(json.dumps({"steps": trainer.step, "ga": trainer.ga_steps, "calls": counter.calls}))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
