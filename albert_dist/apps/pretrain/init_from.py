"""A new run from existing weights (`model.init_from`): the preflight's check of the job against its source
(`check`), and the weights loaded into the model on every rank before `deepspeed.initialize` (`load_into`), so
ZeRO-3 partitions the loaded values. Which weights a reference means is `albert_dist.runs`' rule (one for every
command: a run's newest verified checkpoint, or its final model when that holds the same step); the config loader
has already taken from the source the model fields and the tokenizer the recipe left unset (`read_source`).

What may differ from the source: fields that keep every tensor's shape and meaning (dropout, initializer_range,
layer_norm_eps, hidden_act) and less sharing (`sharing`, more `num_hidden_groups`: each block starts from its
group's weights, `albert_dist.model.unroll.source_names`). Heads the source lacks (a transformers
`AlbertForMaskedLM` has no SOP head nor pooler, an `AlbertModel` no MLM head) start from random initialisation,
logged by name. Optimizer, schedule, data streams and the MLflow run are new.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import torch

from albert_dist.config import TrainConfig
from albert_dist.model.config import ARCHITECTURE, HF_FIELDS, AlbertConfig
from albert_dist.runs import Source

logger = logging.getLogger(__name__)

#: Fields a run must share with its source: every tensor's shape, or (heads, depth) what the weights compute.
SAME_AS_SOURCE = ("vocab_size", "embedding_size", "hidden_size", "intermediate_size", "num_attention_heads",
                  "num_hidden_layers", "inner_group_num", "max_position_embeddings", "type_vocab_size")
#: Parameter name prefixes of the heads a source may lack (started fresh, logged).
HEADS = ("albert.pooler.", "sop_classifier.", "predictions.")
#: Weight files of a transformers directory (`save_pretrained`, safetensors or bin, whole or sharded).
HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
              "pytorch_model.bin.index.json")


def _fail(ref: str, why: str) -> ValueError:
    return ValueError(f"model.init_from={ref!r}: {why}")


def _hf_architecture(path: Path, ref: str) -> dict:
    """A transformers directory's `ARCHITECTURE` fields (transformers' defaults for what its config.json omits)."""
    import json

    try:
        raw = json.loads((path / "config.json").read_text())
    except ValueError as err:
        raise _fail(ref, f"{path / 'config.json'} is not JSON ({err})") from None
    if raw.get("model_type") != "albert":
        raise _fail(ref, f"model_type {raw.get('model_type')!r} in {path / 'config.json'}: not an ALBERT model")
    if raw.get("position_embedding_type", "absolute") != "absolute":
        raise _fail(ref, f"position_embedding_type {raw['position_embedding_type']!r}: albert_dist has absolute "
                         "positions only")
    from transformers import AlbertConfig as HFConfig  # here: only a transformers source needs it

    hf = HFConfig.from_dict(raw)
    return {**{f: getattr(hf, f) for f in HF_FIELDS}, "sharing": "all"}


def architecture(source: Source) -> dict:
    """The source's `ARCHITECTURE` fields (albert_dist's names; a transformers model's sharing is "all").

    Raises:
        ValueError: naming `model.init_from`: not an ALBERT, or a model config without those fields.
    """
    if source.kind == "hf":
        return _hf_architecture(source.weights, source.ref)
    model = source.model or {}
    missing = [f for f in ARCHITECTURE if f not in model]
    if missing:
        raise _fail(source.ref, f"{source.config_source or source.weights} lacks the model fields {missing}")
    return {f: model[f] for f in ARCHITECTURE}


def resolve(ref: str, tracking_uri: Optional[str] = None) -> Source:
    """The `albert_dist.runs.Source` `model.init_from` = `ref` names (a local path or an MLflow run id).

    Raises:
        ValueError: naming `model.init_from`, the value and why (no such directory or run, no final model nor
            checkpoint, checkpoints that do not verify, a store that cannot be read).
    """
    from albert_dist.runs import resolve as resolve_run

    try:
        return resolve_run(ref, tracking_uri=tracking_uri)
    except (OSError, RuntimeError, ValueError) as exc:  # CheckpointError, MLflow's RunReadError: RuntimeErrors
        raise _fail(ref, str(exc)) from None


def read_source(ref: str, tracking_uri: Optional[str]) -> tuple[dict, Optional[str]]:
    """The config loader's reader of `model.init_from` (`albert_dist.config.load.SourceReader`): the source's
    `ARCHITECTURE` fields and its tokenizer (None: none found). Raises ValueError naming `model.init_from`."""
    source = resolve(ref, tracking_uri)
    tokenizer = source.tokenizer if source.tokenizer is not None and Path(source.tokenizer).exists() else None
    return architecture(source), None if tokenizer is None else str(tokenizer)


def check(cfg: TrainConfig, resume_from: Optional[str] = None, say: bool = False) -> Optional[Source]:
    """The preflight's check of `model.init_from` (None when unset): not with `--resume PATH` or `--resume-from`
    (those continue a run; `--resume auto` continues this run's own checkpoint when it has one), the source
    readable, every `SAME_AS_SOURCE` field equal to the source's, no more sharing than the source, its weights
    readable and of the shapes its config says (`check_weights`).
    With `say`, prints what it took (`albert_dist.runs.Source.took`).

    Raises:
        ValueError: naming the field (or flag) and both values.
    """
    ref = cfg.model.init_from
    if ref is None:
        return None
    if resume_from is not None:
        raise ValueError(f"model.init_from={ref!r} starts a new run; --resume-from {resume_from} continues an "
                         "MLflow run: give one of them")
    if cfg.checkpoint.resume not in (None, "auto"):
        raise ValueError(f"model.init_from={ref!r} starts a new run from the source's weights; "
                         f"--resume {cfg.checkpoint.resume} continues a checkpoint with its optimizer, schedule and "
                         "data position: give one of them")
    source = resolve(ref, cfg.tracking.tracking_uri)
    if say:
        print(f"model.init_from: {source.took()}", flush=True)
    model = architecture(source)
    for name in SAME_AS_SOURCE:
        ours, theirs = getattr(cfg.model, name), model[name]
        if ours != theirs:
            raise ValueError(f"model.{name}={ours!r} does not fit the source {ref} ({name}={theirs!r}): its weights "
                             f"keep their shapes; leave model.{name} unset to take the source's")
    source_config = AlbertConfig(**model)
    from albert_dist.model.unroll import source_names

    source_names(cfg.model, source_config)  # more sharing than the source: refused, naming the fields
    if source.kind == "hf":
        from albert_dist.model.hf import mismatched_layers

        bad = mismatched_layers(source_config.num_hidden_layers, source_config.num_hidden_groups)
        if bad:
            raise ValueError(f"model.init_from={ref!r}: num_hidden_layers={source_config.num_hidden_layers}, "
                             f"num_hidden_groups={source_config.num_hidden_groups}: transformers puts layers {bad} "
                             "in other groups than albert_dist does")
        if not any((source.weights / name).is_file() for name in HF_WEIGHTS):
            raise ValueError(f"model.init_from={ref!r}: no weights in the directory (none of {', '.join(HF_WEIGHTS)})")
    check_weights(source, source_config)
    if source.tokenizer is not None and Path(cfg.data.tokenizer_path) != source.tokenizer:
        logger.warning("model.init_from: data.tokenizer_path %s is not the source's tokenizer %s: the model will "
                       "see other ids than it was trained on unless they are the same", cfg.data.tokenizer_path,
                       source.tokenizer)
    return source


def _expected_shapes(source: Source, config: AlbertConfig) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape of the model the source's config describes, in the source's own names (a
    transformers directory: transformers' `AlbertForPreTraining`), built on the meta device (no memory)."""
    if source.kind == "hf":
        import transformers

        from albert_dist.model.hf import hf_config

        with torch.device("meta"):
            model = transformers.AlbertForPreTraining(hf_config(config))
    else:
        from albert_dist.model.albert import AlbertForPreTraining

        with torch.device("meta"):
            model = AlbertForPreTraining(config)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def check_weights(source: Source, config: AlbertConfig) -> None:
    """The preflight's read of the source's weights (issue 46): a checkpoint verifies (every file at its recorded
    size), a state dict or transformers directory reads (safetensors headers, pickles memory-mapped: a truncated
    file is caught here, not on every rank after the process group started) and every tensor it holds has the
    shape its config says (a transformers `AlbertModel`'s names lack the ``albert.`` prefix).

    Raises:
        ValueError: one line naming `model.init_from` and the file.
    """
    from albert_dist.engine.checkpoint.layout import verify
    from albert_dist.runs.weights import stored_shapes

    if source.kind == "checkpoint":
        reason = verify(source.weights)
        if reason is not None:
            raise _fail(source.ref, f"checkpoint {source.weights} does not verify: {reason}")
        return
    try:
        shapes = stored_shapes(source.weights)
    except (OSError, ValueError) as exc:
        raise _fail(source.ref, str(exc)) from None
    if not shapes:
        raise _fail(source.ref, f"{source.weights}: no weights (none of {', '.join(HF_WEIGHTS)})")
    expected = _expected_shapes(source, config)
    for name, shape in shapes.items():
        want = expected.get(name, expected.get(f"albert.{name}"))
        if want is not None and want != shape:
            raise _fail(source.ref, f"{source.weights}: {name} has shape {shape}, its config "
                                    f"({source.config_source}) says {want}")


def source_state(source: Source) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The source's weights in albert_dist's names under its own config (fp32, CPU), and the names of the heads
    (`HEADS`) it has no weights for.

    Raises:
        ValueError: a transformers directory whose non-head weights are incomplete, or weights that do not load.
    """
    if source.kind != "hf":
        from albert_dist.runs.weights import TIED_TO, load_state_dict

        state = load_state_dict(source.weights)
        for alias, tensor in TIED_TO.items():  # the tied decoder may be stored under either name
            state.setdefault(tensor, state.get(alias))
        return {k: v for k, v in state.items() if v is not None}, []
    from albert_dist.runs.weights import load_transformers

    state, missing_keys = load_transformers(source.weights)  # we name the fresh heads ourselves (load_into)
    missing = set(missing_keys) - {"predictions.decoder.bias", "predictions.decoder.weight"}
    lost = sorted(k for k in missing if not k.startswith(HEADS))
    if lost:
        raise ValueError(f"model.init_from={source.ref!r}: the directory has no weights for {lost[:5]}")
    return {k: v for k, v in state.items() if k not in missing}, sorted(missing)


def load_into(model: torch.nn.Module, source: Source) -> list[str]:
    """Copy the source's weights into `model` (an `AlbertForPreTraining` of the job's config, before
    `deepspeed.initialize`): every parameter from the source parameter `source_names` maps it to; a head the
    source lacks keeps `model`'s initialisation (the same on every rank: the trainer seeds it). Returns the names
    left fresh (logged).

    Raises:
        ValueError: as `source_state`, or a tensor whose shape differs from the model's.
    """
    from albert_dist.model.unroll import source_names

    state, _ = source_state(source)
    names = source_names(model.config, AlbertConfig(**architecture(source)))
    fresh = []
    with torch.no_grad():
        for name, param in model.named_parameters():
            tensor = state.get(names[name])
            if tensor is None:
                if not name.startswith(HEADS):
                    raise ValueError(f"model.init_from={source.ref!r}: the source has no {names[name]}")
                fresh.append(name)
                continue
            if tensor.shape != param.shape:
                raise ValueError(f"model.init_from={source.ref!r}: {names[name]} has shape {tuple(tensor.shape)}, "
                                 f"the model's {name} {tuple(param.shape)}")
            param.copy_(tensor)
    if fresh:
        logger.warning("model.init_from: the source has no weights for %s: they start from random initialisation",
                       ", ".join(sorted({n.rsplit(".", 1)[0] for n in fresh})))
    return fresh
