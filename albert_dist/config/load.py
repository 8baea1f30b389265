"""The strict loader of `TrainConfig`: recipes, model presets, source shorthands, dotted and indexed overrides,
`model.init_from`'s architecture, paths resolved, and the values derived from the world size.

A recipe (configs/pretrain/*.yaml) is a YAML mapping of `TrainConfig`'s fields (`albert_dist.config.schema`).
`load_config` merges it and any dotted `key=value` overrides into the structured schema with OmegaConf: an
unknown key, a value of the wrong type or a value that fails a section's `__post_init__` check is a `ValueError`
naming the key and the value first, then the file or override that set it (`_blamed`). Values derived from
several sections (the global batch size) are checked in `check_derived`, the one place that knows the world size;
the preflight calls it before any process group starts.
"""
from __future__ import annotations

import copy
import functools
import re
from dataclasses import fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, get_args, get_type_hints

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from albert_dist.config.schema import TrainConfig, to_container
from albert_dist.data.sources.discover import resolve_location, resolve_path
from albert_dist.engine.config import global_batch_size, resolve_accumulation
from albert_dist.model.config import ARCHITECTURE, AlbertConfig

#: What reads `model.init_from`'s source for the loader: (reference, tracking URI) -> (the source's `ARCHITECTURE`
#: fields, its tokenizer or None); the app's `albert_dist.apps.pretrain.init_from.read_source` (`albert_dist.runs`, above this
#: layer): the loader itself reads no run. Raises ValueError naming `model.init_from`.
SourceReader = Callable[[str, Optional[str]], tuple[dict, Optional[str]]]


#: Model presets for `model: {preset: NAME}` / `model.preset=NAME`: configs/model/NAME.yaml (flat AlbertConfig
#: fields) of the source checkout.
PRESET_DIR = Path(__file__).resolve().parents[2] / "configs" / "model"


def preset_names() -> list[str]:
    """Names of the bundled model presets (configs/model/*.yaml), sorted."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def _read_yaml(path: Path, what: str) -> dict:
    """A YAML mapping file as plain dicts; `ValueError` naming the file for a syntax error or a non-mapping."""
    try:
        loaded = OmegaConf.load(path)
    except yaml.MarkedYAMLError as err:  # one line "file:line:column: problem (context at line:column)"
        mark, cmark = err.problem_mark, err.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        context = err.context or ""
        if context and cmark is not None:
            context = f" ({context} that starts at line {cmark.line + 1}, column {cmark.column + 1})"
        raise ValueError(f"{where}: not valid YAML: {err.problem or err}{context}") from None
    except (OmegaConfBaseException, yaml.YAMLError) as err:
        raise ValueError(f"{path}: not valid YAML: {err}") from err
    if not OmegaConf.is_dict(loaded):
        raise ValueError(f"{path}: {what} must be a YAML mapping, got a {type(loaded).__name__}")
    return OmegaConf.to_container(loaded)


def _preset(ref: object, key: str) -> dict:
    """The AlbertConfig fields of preset `ref` (a name in PRESET_DIR, or a path to a YAML of model fields)."""
    if not isinstance(ref, str) or not ref:
        raise ValueError(f"{key}: a preset is a name ({', '.join(preset_names())}) or a YAML path, got {ref!r}")
    if ref.endswith((".yaml", ".yml")):
        path = Path(ref)
        if not path.is_absolute() and not path.is_file():  # like data paths: cwd first, then the checkout
            path = PRESET_DIR.parent.parent / ref
    else:
        path = PRESET_DIR / f"{ref}.yaml"
    if not path.is_file():
        raise ValueError(f"{key}: no model preset {ref!r} (presets: {', '.join(preset_names())}; or a path to a "
                         "YAML of model fields)")
    fields = _read_yaml(path, "a model preset")
    if "model" in fields:
        raise ValueError(f"{key}: {path} is a recipe, not a model preset (a flat mapping of model fields)")
    return fields


def _apply_layer(merged, layer: dict, source: str):
    """Merge one layer (a recipe or one override) into `merged`, applying its `model.preset` first.

    A preset replaces the model section built so far (defaults, or a recipe's fields when the preset comes
    from an override); the fields given beside it in the same layer, and later layers, override the preset.
    `model=NAME` is short for `model.preset=NAME`. Warmup given in one form (`warmup_steps` or
    `warmup_ratio`) replaces the other form of earlier layers; both in one layer is an error (OptimConfig).
    """
    try:
        layer = _source_shorthand(_fold_rare_zero_options(layer))
    except ValueError as err:
        raise ValueError(f"{source}: {err}") from None
    if _INDEXED in layer:
        return _set_indexed(merged, *layer[_INDEXED], source)
    model = layer.get("model")
    if isinstance(model, str):
        model = {"preset": model}
    if isinstance(model, dict) and "preset" in model:
        model = dict(model)
        ref = model.pop("preset")
        if merged.model.init_from is not None:  # the preset's defaults would reset it: the source silently dropped
            raise ValueError(f"{source}: model.preset={ref!r} would drop model.init_from={merged.model.init_from!r} "
                             "set before it (a preset is a from-scratch architecture; the source gives its own): "
                             "give one of them")
        fields = _preset(ref, "model.preset")
        defaults = to_container(AlbertConfig())  # the schema's defaults, plain
        merged = _merge(merged, {"model": defaults}, source)
        merged = _merge(merged, {"model": fields}, f"{source} (preset)")
        layer = {**layer, "model": model}
    optimizer = layer.get("optimizer")
    if isinstance(optimizer, dict) and len({"warmup_steps", "warmup_ratio"} & set(optimizer)) == 1:
        # the form a later layer gives replaces the other form (warmup_steps=2 on a recipe with a ratio)
        other = {"warmup_ratio": None} if "warmup_steps" in optimizer else {"warmup_steps": 0}
        merged = _merge(merged, {"optimizer": other}, source)
    return _merge(merged, layer, source)


_SOURCE_LISTS = ("train", "validation")
#: a list entry that is no section: OmegaConf's own words list its internal container types
_NOT_A_SECTION = "expected a mapping of fields (a data source may also be a path or URL string), got {} {!r}"
_SOURCE_ITEM_RE = re.compile(r"^data\.(train|validation)\[\d+\]$")


def _fold_rare_zero_options(layer: dict) -> dict:
    """`layer` with DeepSpeed's rarely set ZeRO options written as direct `engine.zero_optimization` fields (as
    every run's config.yaml held them before they moved into `engine.zero_optimization.extra`) moved into
    `extra`, and dropped where unset (None): a run written before the move still loads, resumes, exports and
    fine-tunes with its settings."""
    from albert_dist.engine.config import EXTRA_ZERO_OPTIONS

    zero = (layer.get("engine") or {}).get("zero_optimization") if isinstance(layer.get("engine"), dict) else None
    if not isinstance(zero, dict) or not set(zero) & set(EXTRA_ZERO_OPTIONS):
        return layer
    zero = dict(zero)
    extra = dict(zero.get("extra") or {})
    for name in EXTRA_ZERO_OPTIONS:
        if name in zero:
            value = zero.pop(name)
            if value is not None:
                extra[name] = value
    if extra:
        zero["extra"] = extra
    return {**layer, "engine": {**layer["engine"], "zero_optimization": zero}}


def _source_shorthand(layer: dict) -> dict:
    """`layer` with each data source given as a plain path or URL string (`data.train=[s3://b/prepared]`,
    `data.train[0]=data/x.txt`, `train: [a.txt, b.jsonl]` in a recipe) written as ``{paths: [that string]}``."""
    if _INDEXED in layer:
        key, value = layer[_INDEXED]
        if _SOURCE_ITEM_RE.match(key) and not isinstance(value, dict):
            if not isinstance(value, str):
                raise ValueError(f"{key}: {_NOT_A_SECTION.format(type(value).__name__, value)}")
            return {_INDEXED: (key, {"paths": [value]})}
        return layer
    data = layer.get("data")
    if not isinstance(data, dict) or not any(k in data for k in _SOURCE_LISTS):
        return layer
    data = dict(data)
    for key in _SOURCE_LISTS:
        value = data.get(key)
        if isinstance(value, str):  # data.train=s3://bucket/x: one source
            value = [value]
        elif key in data and not isinstance(value, list):
            raise ValueError(f"data.{key}: expected a list of sources (mappings or path/URL strings), got "
                             f"{type(value).__name__} {value!r}")
        if isinstance(value, list):
            data[key] = [{"paths": [item]} if isinstance(item, str) else item for item in value]
    return {**layer, "data": data}


#: Key of an override layer that sets a list item by index (`load_config`), never a config field.
_INDEXED = "__indexed_override__"
_INDEX_RE = re.compile(r"\[(\d+)\]")


def _set_indexed(merged, key: str, value: Any, source: str):
    """`merged` with `key` (dotted, with list indices: data.train[0].paths) set to `value`.

    Raises ValueError naming the override when an index is past the end of its list or the key is malformed.
    """
    dotted = _INDEX_RE.sub(lambda m: f".{m.group(1)}", key)
    if "[" in dotted or "]" in dotted:
        raise ValueError(f"{source}: {key!r} is not a dotted key with list indices like data.train[0].paths")
    node = merged
    parts = dotted.split(".")
    for i, part in enumerate(parts):  # OmegaConf.update would create list items past the end (then fail obscurely)
        if OmegaConf.is_list(node) and not (part.isdigit() and int(part) < len(node)):
            where = ".".join(parts[:i])
            raise ValueError(f"{source}: {where} has {len(node)} item(s), so {where}[{part}] does not exist "
                             f"(give the whole list to add items: {where}=[...])")
        node = node[int(part)] if OmegaConf.is_list(node) else (node.get(part) if OmegaConf.is_dict(node) else None)
    try:
        OmegaConf.update(merged, dotted, value, merge=True)
    except OmegaConfBaseException as err:
        raise ValueError(f"{source}: {_describe(err)}") from err
    return merged


def _merge(merged, layer: dict, source: str):
    # In place: OmegaConf.merge would deep-copy the whole config first, once per layer, ~90% of a load with a
    # few dozen overrides (tests/distributed/grad_matrix_worker.py loads one per cell). `merged` is _load's own
    # and is dropped on an error; `_in_list` reads only its node types.
    try:
        merged.merge_with(layer)
        return merged
    except OmegaConfBaseException as err:
        raise ValueError(f"{source}: {_in_list(merged, layer) or _describe(err)}") from err


def _in_list(merged, layer: dict, path: str = "") -> str | None:
    """The error of the first bad entry of a list of sections in `layer` (data.train[1].format: ...), which
    OmegaConf reports by its key inside the entry only; None when no list entry is at fault."""
    for key, value in layer.items():
        sub = f"{path}.{key}" if path else str(key)
        if isinstance(value, dict):
            found = _in_list(merged, value, sub)
            if found:
                return found
        elif isinstance(value, list) and path:
            parent = OmegaConf.select(merged, path)
            hint = get_type_hints(OmegaConf.get_type(parent)).get(key) if OmegaConf.is_config(parent) else None
            entry_type = (get_args(hint) or (None,))[0]
            if not is_dataclass(entry_type):
                continue
            for i, entry in enumerate(value):
                if not isinstance(entry, dict):  # OmegaConf's own words here list its internal container types
                    return f"{sub}[{i}]: {_NOT_A_SECTION.format(type(entry).__name__, entry)}"
                try:
                    OmegaConf.merge(OmegaConf.structured(entry_type), entry)
                except OmegaConfBaseException as err:
                    return f"{sub}[{i}].{_describe(err)}"
    return None


def _describe(err: OmegaConfBaseException) -> str:
    """OmegaConf's error as `dotted.key: what is wrong`, without its class names and object dumps."""
    key = getattr(err, "full_key", None) or "?"
    msg = str(getattr(err, "msg", None) or err).split("\n")[0]
    if "is not a ListConfig" in msg:  # OmegaConf's node class names, not the user's words
        return f"{key}: expected a list, got {getattr(err, 'value', None)!r}"
    if isinstance(err, ConfigKeyError):
        hint = msg.split("Did you mean", 1)
        return f"{key}: unknown key" + (f" (did you mean{hint[1]}" + ")" if len(hint) == 2 else "")
    return f"{key}: {msg}"


def _locate(node, path: str = "") -> str | None:
    """Dotted path of the deepest section of `node` whose ``__post_init__`` raises (data.train[0], model, ...)."""
    children = (node.items() if OmegaConf.is_dict(node) else enumerate(node)) if OmegaConf.is_config(node) else ()
    for key, child in children:
        if OmegaConf.is_config(child):
            sub = f"{path}[{key}]" if OmegaConf.is_list(node) else (f"{path}.{key}" if path else str(key))
            found = _locate(child, sub)
            if found is not None:
                return found
    if OmegaConf.is_dict(node) and OmegaConf.get_type(node) not in (dict, None):
        try:
            OmegaConf.to_object(node)
        except ValueError:
            return path
    return None


def find_config_file(path: str | Path) -> Path:
    """A recipe or config file as the data paths are found (`albert_dist.data.sources.discover.resolve_path`): as given when
    absolute or present relative to the working directory, else relative to the repository root, so
    ``--config configs/pretrain/<recipe>.yaml`` works from any directory, as the recipe's own data paths do.

    Raises:
        FileNotFoundError: in neither place, naming both.
    """
    given = Path(path)
    if given.is_file():
        return given
    found = resolve_path(str(given))
    if found.is_file():
        return found
    where = "" if given.is_absolute() else f" (looked for {Path.cwd() / given} and {found})"
    raise FileNotFoundError(f"config file not found: {given}{where}")


def load_config(path: str | Path | None, overrides: Sequence[str] = (),
                read_source: Optional[SourceReader] = None) -> TrainConfig:
    """Load a recipe YAML (or only the defaults when `path` is None) plus dotted overrides, strictly.

    The one YAML loader of the package (recipes, a run's config.yaml, model presets via `model.preset`).
    `overrides` are `dotted.key=value` strings whose values are parsed as YAML (`engine.zero_stage=3`,
    `data.train=[...]`), applied in order. `model: {preset: NAME, ...}` in the recipe or `model.preset=NAME`
    (`model=NAME`) as an override takes the model section from configs/model/NAME.yaml (or a YAML path); fields
    beside it and later overrides change the preset's values. With `model.init_from`, the model fields and the
    tokenizer the layers leave unset come from `read_source` (the app's; `_apply_init_from`).

    Raises:
        ValueError: naming the file or the override and the dotted YAML path (`data.max_seq_length`, never a
            class name) for an unknown key, a wrong type or a value rejected by a section's validation; also a
            malformed override, an unknown preset, or a model preset given as the recipe.
        FileNotFoundError: `path` does not exist.
    """
    layers: list[tuple[str, dict]] = []
    if path is not None:
        path = find_config_file(path)
        recipe = _read_yaml(path, "a recipe")
        if _is_model_preset(recipe):
            raise ValueError(f"{path} is a model preset, not a recipe: use --config <recipe> "
                             f"model.preset={path.stem if path.resolve().parent == PRESET_DIR else path}")
        layers.append((str(path), recipe))
    return resolve_paths(_load(layers + _override_layers(overrides), read_source))


def apply_overrides(cfg: TrainConfig, overrides: Sequence[str]) -> TrainConfig:
    """A copy of `cfg` with dotted `key=value` `overrides` applied, parsed and validated as `load_config` does
    (the preflight's memory advice tries its candidate changes with it).

    Raises:
        ValueError: as `load_config` for a malformed override or a value a section rejects.
    """
    return resolve_paths(_load([("config", to_container(cfg))] + _override_layers(overrides)))


def _override_layers(overrides: Sequence[str]) -> list[tuple[str, dict]]:
    """(source, mapping) layers of dotted `key=value` overrides, values parsed as YAML, in order."""
    layers: list[tuple[str, dict]] = []
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ValueError(f"override {item!r} must look like dotted.key=value")
        key, value = item.split("=", 1)
        if (m := re.search(r"\.(\d+)(?=\.|$)", key)) is not None:  # the MLflow param's spelling data.train.0.paths
            raise ValueError(f"override {item!r}: a list item is written with its index in brackets: "
                             f"{key[:m.start()]}[{m.group(1)}]{key[m.end():]}={value}")
        try:
            if "[" in key:  # a list item by index (data.train[0].paths=[...]): set into what is merged so far
                value = OmegaConf.to_container(OmegaConf.from_dotlist([f"value={value}"]))["value"]
                layers.append((f"override {item!r}", {_INDEXED: (key, value)}))
            else:
                layers.append((f"override {item!r}", OmegaConf.to_container(OmegaConf.from_dotlist([item]))))
        except OmegaConfBaseException as err:
            raise ValueError(f"override {item!r}: {_describe(err)}") from err
        except yaml.YAMLError as err:  # e.g. an unclosed [ or {: yaml's multi-line report, in one line
            problem = getattr(err, "problem", None) or str(err).splitlines()[0]
            raise ValueError(f"override {item!r}: the value {value!r} is not valid YAML ({problem}); close its "
                             "brackets, or quote the whole override for the shell ('key=[a, b]')") from err
    return layers


def resolve_paths(cfg: TrainConfig) -> TrainConfig:
    """A copy of `cfg` with every relative path made absolute, once, at load (so config.yaml, the MLflow params
    and every later reader see the same file whatever their working directory).

    Inputs (the local `data.train`/`data.validation` paths and globs, `hub_data_files`, `data.tokenizer_path`,
    an explicit `checkpoint.resume`, a `model.init_from` directory): against the working directory if they exist
    there, else against the repository root (`albert_dist.data.sources.discover.resolve_path`, the rule the data section
    always had).
    Outputs (`run_dir`, `checkpoint.dir`): against the working directory. Hub dataset names stay as given.
    """
    def inputs(paths: list[str]) -> list[str]:
        return [resolve_location(p) for p in paths]

    def source(src):
        if src.format == "hub":
            return replace(src, hub_data_files=inputs(src.hub_data_files))
        return replace(src, paths=inputs(src.paths), hub_data_files=inputs(src.hub_data_files))

    def output(path: Optional[str]) -> Optional[str]:
        return None if path is None else str(Path(path).expanduser().absolute())

    data = replace(cfg.data, train=[source(s) for s in cfg.data.train],
                   validation=[source(s) for s in cfg.data.validation],
                   tokenizer_path=str(resolve_path(cfg.data.tokenizer_path)))
    resume = cfg.checkpoint.resume
    init_from = cfg.model.init_from  # a directory (an MLflow run id stays as given)
    if init_from is not None and resolve_path(init_from).exists():
        cfg = replace(cfg, model=replace(cfg.model, init_from=str(resolve_path(init_from))))
    checkpoint = replace(cfg.checkpoint, dir=output(cfg.checkpoint.dir),
                         resume=resume if resume in (None, "auto") else str(resolve_path(resume)))
    return replace(cfg, data=data, checkpoint=checkpoint, run_dir=output(cfg.run_dir))


def _is_model_preset(mapping: dict) -> bool:
    """A flat mapping of AlbertConfig fields (configs/model/*.yaml; typos included), as opposed to a recipe."""
    keys = set(mapping)
    return not keys & {f.name for f in fields(TrainConfig)} and bool(keys & {f.name for f in fields(AlbertConfig)})


def _given(layers: list[tuple[str, dict]]) -> set[str]:
    """Dotted `model.<field>` and `data.tokenizer_path` keys written in the last layer that sets
    `model.init_from` or after it: the source replaces what earlier layers (a from-scratch recipe's preset and
    tokenizer) set, what is written beside `init_from` or later overrides the source. A model preset's fields are
    never given: a preset is a from-scratch architecture."""
    def sets_init_from(layer: dict) -> bool:
        return isinstance(layer.get("model"), dict) and "init_from" in layer["model"]

    starts = [i for i, (_, layer) in enumerate(layers) if sets_init_from(layer)]
    given: set[str] = set()
    for _, layer in layers[starts[-1] if starts else len(layers):]:
        model = layer.get("model")
        if isinstance(model, dict):
            given |= {f"model.{k}" for k in model if k != "preset"}
        if isinstance(layer.get("data"), dict) and "tokenizer_path" in layer["data"]:
            given.add("data.tokenizer_path")
    return given


def _apply_init_from(merged, given: set[str], read_source: Optional[SourceReader]) -> None:
    """With `model.init_from` set: the model fields and the tokenizer the layers left unset come from the source
    (`read_source`), so the resolved config (config.yaml, MLflow params) holds what the run trains.
    Whether what the layers did set fits the source's weights is the preflight's check
    (`albert_dist.apps.pretrain.init_from.check`). A config that sets all of them (a run's config.yaml) reads no source.

    Raises:
        ValueError: the source cannot be read (or no `read_source` was given), or has no tokenizer when
            `data.tokenizer_path` is unset.
    """
    ref = merged.model.init_from
    if ref is None:
        return
    unset = [f for f in ARCHITECTURE if f"model.{f}" not in given]
    if not unset and "data.tokenizer_path" in given:
        return
    if read_source is None:
        raise ValueError(f"model.init_from={ref!r}: this command does not read a source: set the model fields "
                         "and data.tokenizer_path the source has")
    model, tokenizer = read_source(ref, merged.tracking.tracking_uri)
    for name in unset:
        merged.model[name] = model[name]
    if "data.tokenizer_path" not in given:
        if tokenizer is None:
            raise ValueError(f"model.init_from={ref!r}: the source has no tokenizer (spiece.model or tokenizer.json) "
                             "to train with: set data.tokenizer_path to the one it was trained with")
        merged.data.tokenizer_path = str(tokenizer)


@functools.lru_cache(maxsize=1)
def _schema():
    """The defaults as OmegaConf's structured config, built once: `OmegaConf.structured` walks the dataclasses
    (~70 ms a call), a deep copy of its result ~12 ms, and every load starts from one."""
    return OmegaConf.structured(TrainConfig)


def _load(layers: list[tuple[str, dict]], read_source: Optional[SourceReader] = None) -> TrainConfig:
    """Defaults <- each (source, mapping) layer in order (presets applied) -> the unset model fields and tokenizer
    from `model.init_from`'s source (`_apply_init_from`) -> a validated TrainConfig."""
    merged = copy.deepcopy(_schema())  # _merge changes it in place
    for source, layer in layers:
        merged = _apply_layer(merged, layer, source)
    try:
        _apply_init_from(merged, _given(layers), read_source)
    except OmegaConfBaseException as err:  # a source's value the schema's type refuses
        raise ValueError(_blamed(f"model.init_from: {_describe(err)}", layers)) from err
    except ValueError as err:
        raise ValueError(_blamed(str(err), layers)) from err
    try:
        cfg = OmegaConf.to_object(merged)
    except ValueError as err:  # a section's __post_init__: prefix where that section sits in the YAML
        where = _locate(merged)
        msg = str(err)
        if where and not msg.startswith(where + "."):
            msg = f"{where}.{msg}"
        raise ValueError(_blamed(msg, layers)) from err
    except OmegaConfBaseException as err:
        raise ValueError(_blamed(_describe(err), layers)) from err
    assert isinstance(cfg, TrainConfig)
    return cfg


_LEADING_KEY_RE = re.compile(r"[A-Za-z_]\w*(?:\[\d+\]|\.[A-Za-z_]\w*)*")


def _sets(layer: dict, key: str) -> bool:
    """Whether `layer` (a recipe or one override, as `_override_layers` makes it) writes dotted `key`
    (``data.train[0].weight``), a list above it (``data.train=[...]`` sets ``data.train[0]``), or, for a model
    field, a model preset (``model.preset=NAME``, ``model=NAME``)."""
    dotted = _INDEX_RE.sub(lambda m: f".{m.group(1)}", key)
    if _INDEXED in layer:
        given = _INDEX_RE.sub(lambda m: f".{m.group(1)}", layer[_INDEXED][0])
        return dotted == given or dotted.startswith(given + ".")
    model = layer.get("model")
    if dotted.startswith("model.") and (isinstance(model, str) or isinstance(model, dict) and "preset" in model):
        return True
    node: Any = layer
    for part in dotted.split("."):
        if isinstance(node, list):  # the whole list is given: its items come from this layer
            return True
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _blamed(msg: str, layers: list[tuple[str, dict]]) -> str:
    """`msg` (which starts with the dotted key at fault: ``optimizer.lr must be > 0, got -1.0``), then in
    parentheses the layer that set that key last (``override 'optimizer.lr=-1'``, or the recipe's path); the
    last two layers that touch its section when none sets the key itself (a check across fields); "the defaults"
    when no layer does. The key comes first and only the layers that matter follow: the message once listed every layer before
    it (a recipe and five overrides: ~450 characters before the key)."""
    match = _LEADING_KEY_RE.match(msg)
    key = match.group(0) if match else ""
    setters = [source for source, layer in layers if key and _sets(layer, key)]
    if setters:
        return f"{msg} ({setters[-1]})"
    section = key.split(".")[0].split("[")[0]
    touching = [source for source, layer in layers if section and section in layer
                or (_INDEXED in layer and layer[_INDEXED][0].split(".")[0].split("[")[0] == section)]
    shown = " + ".join(touching[-2:]) if touching else "the defaults"
    return f"{msg} ({'... + ' if len(touching) > 2 else ''}{shown})"


def load_model_config(path_or_preset: str | Path) -> AlbertConfig:
    """An `AlbertConfig` from a preset name ("albert-base"), a flat YAML of model fields (configs/model/*.yaml)
    or a recipe / run config.yaml (its `model:` section), with `load_config`'s strictness and messages.

    Raises:
        ValueError: unknown preset, unknown key, wrong type or invalid value (naming `model.<field>`).
        FileNotFoundError: a path that does not exist.
    """
    ref = str(path_or_preset)
    if ref.endswith((".yaml", ".yml")):
        ref = str(find_config_file(ref))
        if not _is_model_preset(_read_yaml(Path(ref), "a config")):
            return load_config(ref).model
    return _load([(ref, {"model": {"preset": ref}})]).model


def model_config_of(config: dict, source: str) -> AlbertConfig:
    """The `AlbertConfig` of a resolved config as plain dicts (`to_container`; a checkpoint's albert_dist.json
    holds one), with `load_config`'s strictness; `source` names it in errors.

    Raises:
        ValueError: unknown key, wrong type or invalid value (naming `model.<field>`).
    """
    return _load([(source, {"model": dict(config.get("model") or {})})]).model


def for_world_size(cfg: TrainConfig, world_size: int) -> TrainConfig:
    """`cfg` as a job of `world_size` ranks runs it: ``engine.gradient_accumulation_steps: auto`` resolved
    (`albert_dist.engine.config.resolve_accumulation`), so the run's config.yaml, its MLflow params and the
    resume checks see the number used; `cfg` itself when nothing is to resolve. Raises `ValueError` as
    `resolve_accumulation`."""
    engine = resolve_accumulation(cfg.engine, world_size)
    return cfg if engine is cfg.engine else replace(cfg, engine=engine)


def check_derived(cfg: TrainConfig, world_size: int) -> int:
    """Check the values that depend on the world size and return the global batch size (sequences/step); `cfg`
    as `for_world_size` resolved it for `world_size`.

    The one place the batch triple is checked (`engine.config.global_batch_size`); raises
    `ValueError` when train_batch_size != micro x accumulation x world size.
    """
    return global_batch_size(cfg.engine, world_size)
