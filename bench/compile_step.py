"""What `engine.compile` and the static MLM gather cost and gain on CPU: one training step, four ways, one run.

The quickstart's shapes (configs/pretrain/albert-tiny-wikitext.yaml: albert-tiny, micro batch 16 x 128, 30%
masking capped at 40 per row), real batches from the project's loader, fp32, 1 thread, plain PyTorch steps
(forward, backward, AdamW; DeepSpeed adds the same work to every variant). The variants, each on its own copy
of the same initial weights:

* ``eager_dynamic``: the MLM gather padded to each batch's longest row (``max_predictions_per_seq=None``: a
  host sync and a new shape per batch);
* ``eager_static``: the static gather (``data.prediction_slots`` + 1 slots per row), what the trainer runs;
* ``block``: static + `engine.compile_scope=block` (the executed-block function compiled once);
* ``model``: static + `engine.compile_scope=model` (``model.compile()``, what DeepSpeed's ``engine.compile()``
  calls).

Compile time = the first step of a compiled variant minus an eager step, from cold caches (inductor's on-disk
caches off; its one-time start-up paid beforehand by a throw-away function) with inductor compiling in this
process (``compile_threads=1``), so its CPU seconds (this process + the C++ compiler it waits for) measure the
work whatever else the machine runs; wall seconds beside them. Step time:
process CPU seconds per step, variants taking turns step by step after a warm-up, median over the repeats.
After the first step every compiled variant runs under ``error_on_recompile``. The first step's loss of every
variant must agree with eager_dynamic's to 1e-5 (checked, reported).

    python bench/compile_step.py [--repeats 5]

`run(repeats=...)` returns the figures as a dict for bench/run_all.py.
"""
from __future__ import annotations

import argparse
import resource
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs" / "pretrain" / "albert-tiny-wikitext.yaml"
VARIANTS = ("eager_dynamic", "eager_static", "block", "model")


def _cpu_s() -> float:
    """CPU seconds of this process and of its waited-for children (the C++ compiler inductor runs)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _batches(n: int) -> tuple[Any, list[dict[str, torch.Tensor]]]:
    from albert_dist.config import load_config
    from albert_dist.data.loader import build_train_loader

    cfg = load_config(str(RECIPE), ["data.num_workers=0"])
    it = iter(build_train_loader(cfg.data, cfg.engine.train_micro_batch_size_per_gpu, 0, 1))
    return cfg, [next(it) for _ in range(n)]


def run(repeats: int = 5) -> dict[str, Any]:
    """Compile times, step times and ratios of the four variants (module docstring).

    Keys: ``compile_{block,model}_cpu_s`` / ``_wall_s`` (first step minus an eager step), ``step_cpu_s.<variant>``
    (per-repeat lists), ``speedup_block`` / ``speedup_model`` (eager_static / compiled step time, per repeat),
    ``static_over_dynamic`` (eager_dynamic / eager_static step time, > 1: the static gather is faster),
    ``break_even_steps_{block,model}`` (compile CPU s / CPU s saved per step; absent when nothing is saved),
    ``first_loss_max_abs_diff``, ``graphs_{block,model}``.
    """
    import torch._dynamo
    import torch._inductor.config as inductor_config

    from albert_dist.engine.compile import compile_model, dynamo_counters
    from albert_dist.model import AlbertForPreTraining

    torch.set_num_threads(1)
    inductor_config.force_disable_caches = True  # cold: what a fresh machine pays
    inductor_config.compile_threads = 1  # compile in this process: its CPU time is measurable
    cfg, batches = _batches(repeats + 2)
    # Inductor's one-time costs (its imports, the C++ precompiled header) go to a throw-away function first, so
    # neither scope's compile time carries them.
    warm = torch.compile(lambda x: torch.nn.functional.gelu(x).sum(), dynamic=False)
    warm(torch.randn(8, requires_grad=True)).backward()
    torch.manual_seed(0)
    base = AlbertForPreTraining(cfg.model)
    state = base.state_dict()
    slots = cfg.data.prediction_slots

    models: dict[str, torch.nn.Module] = {}
    steps: dict[str, Callable[[dict], float]] = {}
    for name in VARIANTS:
        model = AlbertForPreTraining(cfg.model, max_predictions_per_seq=None if name == "eager_dynamic" else slots)
        model.load_state_dict(state)
        model.train()
        if name in ("block", "model"):
            compile_model(model, name)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(batch, model=model, opt=opt) -> float:
            opt.zero_grad(set_to_none=True)
            out = model(**batch)
            out.loss.backward()
            opt.step()
            return float(out.loss.detach())

        models[name], steps[name] = model, step

    result: dict[str, Any] = {"slots_per_row": slots + 1, "batch": list(batches[0]["input_ids"].shape),
                              "step_cpu_s": {v: [] for v in VARIANTS}, "step_wall_s": {v: [] for v in VARIANTS}}
    first_loss: dict[str, float] = {}
    first_cost: dict[str, tuple[float, float]] = {}
    for name in VARIANTS:  # first steps: the compiled variants compile here
        before = dynamo_counters()["unique_graphs"]
        c0, w0 = _cpu_s(), time.perf_counter()
        first_loss[name] = steps[name](batches[0])
        first_cost[name] = (_cpu_s() - c0, time.perf_counter() - w0)
        if name in ("block", "model"):
            result[f"graphs_{name}"] = dynamo_counters()["unique_graphs"] - before
    eager_cpu, eager_wall = first_cost["eager_static"]
    for name in ("block", "model"):
        result[f"compile_{name}_cpu_s"] = first_cost[name][0] - eager_cpu
        result[f"compile_{name}_wall_s"] = first_cost[name][1] - eager_wall
    result["first_loss"] = first_loss
    result["first_loss_max_abs_diff"] = max(abs(v - first_loss["eager_dynamic"]) for v in first_loss.values())
    if result["first_loss_max_abs_diff"] > 1e-5:
        raise RuntimeError(f"the variants' first losses differ: {first_loss}")

    with torch._dynamo.config.patch(error_on_recompile=True):
        for batch in batches[1:]:  # the first of these is a warm-up
            for name in VARIANTS:
                c0, w0 = time.process_time(), time.perf_counter()
                steps[name](batch)
                result["step_cpu_s"][name].append(time.process_time() - c0)
                result["step_wall_s"][name].append(time.perf_counter() - w0)
    for per in (result["step_cpu_s"], result["step_wall_s"]):
        for name in VARIANTS:
            per[name] = per[name][1:]
    cpu = result["step_cpu_s"]
    result["speedup_block"] = [e / c for e, c in zip(cpu["eager_static"], cpu["block"])]
    result["speedup_model"] = [e / c for e, c in zip(cpu["eager_static"], cpu["model"])]
    result["static_over_dynamic"] = [d / s for d, s in zip(cpu["eager_dynamic"], cpu["eager_static"])]
    for name in ("block", "model"):
        saved = statistics.median(cpu["eager_static"]) - statistics.median(cpu[name])
        if saved > 0:
            result[f"break_even_steps_{name}"] = result[f"compile_{name}_cpu_s"] / saved
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per variant (after 1 warm-up)")
    args = parser.parse_args(argv)
    r = run(repeats=args.repeats)
    med = statistics.median
    print(f"albert-tiny step, batch {r['batch']}, {r['slots_per_row']} MLM slots per row, fp32 CPU, 1 thread, "
          f"{args.repeats} repeats; first losses agree to {r['first_loss_max_abs_diff']:.1e}")
    for name in VARIANTS:
        print(f"  {name:<14} CPU s per step median {med(r['step_cpu_s'][name]):.4f} (min {min(r['step_cpu_s'][name]):.4f}"
              f", max {max(r['step_cpu_s'][name]):.4f}); wall median {med(r['step_wall_s'][name]):.4f}")
    for name in ("block", "model"):
        even = r.get(f"break_even_steps_{name}")
        print(f"  compile {name}: {r[f'compile_{name}_cpu_s']:.1f} CPU s ({r[f'compile_{name}_wall_s']:.1f} s wall), "
              f"{r[f'graphs_{name}']} graphs; step speedup x{med(r[f'speedup_{name}']):.3f}; "
              + (f"pays off after {even:.0f} steps" if even else "no step time saved"))
    print(f"  static / dynamic gather: dynamic step time / static x{med(r['static_over_dynamic']):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
