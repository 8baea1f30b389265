"""`engine.compile`: torch.compile (inductor) of the training step's forward and backward, opt-in.

Two scopes (`engine.compile_scope`), both measured by `bench/compile_step.py` (docs/benchmarks.md):

* ``"model"`` (default): DeepSpeed's `engine.compile()` (0.19.8: ``module.compile(backend=<the accelerator's
  compile backend>)``, inductor on CPU and CUDA): the whole forward (embeddings, blocks, heads, losses) in one
  graph, its backward compiled with it by AOTAutograd. ZeRO 0-2 only (the config refuses it at ZeRO-3: dynamo
  recompiles for every submodule's ZeRO-3 hooks). Measured on CPU: 1.17x the eager step, twice the block
  scope's compile time, which grows with depth (dynamo unrolls the L x K blocks).
* ``"block"``: `torch.compile` of the function that runs one executed block (`AlbertTransformer.run_block`),
  once per process. Every executed block of every sharing mode has the same structure and dynamo treats the
  parameters of the module passed in as graph inputs, so two graphs serve all L x K block calls: the blocks
  before the last, and the last one, which computes only the output positions. Embeddings, heads and losses
  stay eager. At ZeRO-3 DeepSpeed's hooks are kept out of the graphs (`keep_hooks_out_of_graphs`): a graph break
  at every submodule, exact, no recompilation.

Both need static shapes: the model's MLM gather must have a fixed size (`AlbertForPreTraining`'s
``max_predictions_per_seq``, which the trainer sets from the data config), or every batch would recompile.
`compile_engine` refuses a model without it. After the first step nothing recompiles (asserted by
tests/distributed/test_compile.py with ``torch._dynamo.config.error_on_recompile``) but the first batch without
padding, which the trainer passes without ``attention_mask`` (`albert_dist.data.pretraining.drop_full_mask`): that
form compiles once, beside the masked one, and the two then alternate without recompiling
(tests/unit/test_attention_mask.py). Evaluation runs eagerly
(`eager`): its batches have other shapes and no backward, and compiling them would spend the recompilation
budget of the training graphs.

ZeRO-3 without DeepSpeed's DeepCompile (its compiler for ZeRO-3, CUDA only, not used here) gains little: the
parameters are gathered by hooks around every submodule call, so the graphs are small pieces between them.
Dropout: compiled code draws its own random numbers (inductor's RNG), so with dropout > 0 a compiled run is
not bit-identical to an eager one (ALBERT v2 trains with dropout 0).
"""
from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Iterator

import torch

from albert_dist.engine.config import CompileScope

logger = logging.getLogger(__name__)

#: Backend of every compilation here (inductor generates C++ on CPU, Triton on CUDA); "eager" or "aot_eager"
#: only trace (the CPU smoke run of bench/gpu_check.sh uses them to check the code path in seconds).
DEFAULT_BACKEND = "inductor"
_compiled_blocks: dict[str, Callable] = {}


def compiled_block_fn(backend: str = DEFAULT_BACKEND) -> Callable:
    """The compiled `albert_dist.model.albert._run_block`, created once per process and backend (one dynamo
    cache for every model built in it). Not `fullgraph`: ZeRO-3's hooks break the graph at every submodule; at
    ZeRO 0-2 a block has no graph break (tests/distributed/test_compile.py counts them)."""
    if backend not in _compiled_blocks:
        from albert_dist.model.albert import _run_block

        _compiled_blocks[backend] = torch.compile(_run_block, backend=backend, dynamic=False)
    return _compiled_blocks[backend]


def compile_model(model: torch.nn.Module, scope: CompileScope, backend: str = DEFAULT_BACKEND) -> None:
    """Compile `model` (an `AlbertForPreTraining`, not wrapped) in place for `scope` without DeepSpeed: "block"
    swaps the encoder's `run_block`, "model" calls `model.compile()` (what DeepSpeed's `engine.compile()` calls).
    For benchmarks and tests of the model alone; training goes through `compile_engine`. Raises `ValueError`
    like `compile_engine`."""
    _check_static(model)
    if scope == "block":
        model.albert.encoder.run_block = compiled_block_fn(backend)
    elif scope == "model":
        model.compile(backend=backend, dynamic=False)
    else:
        raise ValueError(f"engine.compile_scope must be 'block' or 'model', got {scope!r}")


def compile_engine(engine: Any, scope: CompileScope, backend: str = DEFAULT_BACKEND) -> None:
    """Compile a DeepSpeed engine's `AlbertForPreTraining` for `scope` (module docstring) before its first step.

    "model" calls `engine.compile(backend=backend, compile_kwargs={"dynamic": False})`; "block" replaces the
    encoder's `run_block` by `compiled_block_fn(backend)`. Compilation itself happens at the first forward (and
    its backward). Raises `ValueError` for an unknown scope or a model without a static MLM gather
    (`max_predictions_per_seq` None).
    """
    model = engine.module
    _check_static(model)
    zero3 = engine.zero_optimization_stage() == 3
    if scope == "model":
        if zero3:
            raise ValueError("engine.compile_scope=model does not work with engine.zero_stage=3; use block")
        engine.compile(backend=backend, compile_kwargs={"dynamic": False})
    elif scope == "block":
        if zero3:
            keep_hooks_out_of_graphs(model)
        model.albert.encoder.run_block = compiled_block_fn(backend)
    else:
        raise ValueError(f"engine.compile_scope must be 'block' or 'model', got {scope!r}")
    logger.info("torch.compile (%s), scope %s: the first step compiles", backend, scope)


def keep_hooks_out_of_graphs(model: torch.nn.Module) -> int:
    """Wrap every module hook of `model` in `torch.compiler.disable`, in place; returns how many were wrapped.

    For ZeRO-3, whose parameter gathering and release run in forward hooks of every submodule
    (`deepspeed.runtime.zero.parameter_offload`): traced by dynamo, those hooks guard on per-submodule values (the
    submodule's ``ds_id``, its hook objects), so the compiled block recompiles for every submodule until dynamo's
    recompile limit (8) and then runs eagerly. Disabled, each hook is a graph break instead, identical for every
    block, and nothing recompiles after the first step (measured with DeepSpeed 0.19.8 and torch 2.13). Eager
    behaviour is unchanged: the wrapper only tells dynamo to leave the call alone.
    """
    wrapped = 0
    for module in model.modules():
        for hooks in (module._forward_pre_hooks, module._forward_hooks, module._backward_pre_hooks,
                      module._backward_hooks):
            for key, hook in list(hooks.items()):
                if not getattr(hook, "_torchdynamo_disable", False):
                    hooks[key] = torch.compiler.disable(hook)
                    wrapped += 1
    return wrapped


def _check_static(model: torch.nn.Module) -> None:
    if getattr(model, "max_predictions_per_seq", None) is None:
        raise ValueError("engine.compile needs static shapes: build AlbertForPreTraining with "
                         "max_predictions_per_seq (the trainer passes data.prediction_slots); without it every "
                         "batch has a new gather size and recompiles")


@contextlib.contextmanager
def eager() -> Iterator[None]:
    """Run compiled functions eagerly inside the block (``torch.compiler.set_stance("force_eager")``): for
    evaluation, whose shapes and no-grad graphs would otherwise compile anew."""
    with torch.compiler.set_stance("force_eager"):
        yield


def dynamo_counters() -> dict[str, int]:
    """Dynamo's totals so far in this process: ``unique_graphs`` compiled, ``graph_breaks``, ``frames_ok``
    (frames compiled) — a snapshot before and after steps shows whether anything (re)compiled."""
    from torch._dynamo.utils import counters

    return {"unique_graphs": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": int(sum(counters["graph_break"].values())),
            "frames_ok": int(counters["frames"]["ok"])}


__all__ = ["DEFAULT_BACKEND", "CompileScope", "compile_engine", "compile_model", "compiled_block_fn", "dynamo_counters",
           "eager", "keep_hooks_out_of_graphs"]
