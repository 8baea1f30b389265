"""Hub sources (``format: hub``): the arguments every reader passes to ``datasets``, and the check that resolves
one before any process group (`check_hub_source`, from the preflight and ``albert-dist data plan`` through
`albert_dist.data.sources.pieces.source_slots`).

A hub dataset used to be resolved only when the first slot streamed it: a misspelt name, or a node without
network, failed after about 30 s of start-up (huggingface_hub retries each request 5 times, 23 s on a node with
no DNS) with an 85-line traceback. The check resolves it the way the stream will (`load_args`, through
``datasets.load_dataset_builder``: the dataset's files and configurations, no data read), after one quick
``HfApi.dataset_info`` request (no retries, `HUB_TIMEOUT_S`) that tells "no network" and "no such dataset"
apart in well under a second. Offline (``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE``, as ``datasets`` read them)
nothing goes to the network: the dataset must be in the local HF cache, as the stream would need it. A local
dataset folder or a packaged builder (``json`` + ``hub_data_files``) is resolved locally.
"""
from __future__ import annotations

import logging
import os
from typing import Any

from albert_dist.data.config import SourceConfig
from albert_dist.data.sources.discover import resolve_path

logger = logging.getLogger(__name__)

#: Seconds the quick ``dataset_info`` request may take (connect and read) before the hub counts as unreachable.
HUB_TIMEOUT_S = 10.0


def load_args(source: SourceConfig) -> tuple[str, dict[str, Any]]:
    """``(path, kwargs)`` of ``datasets.load_dataset(path, **kwargs, streaming=True)`` for a hub source: the name
    (or local folder, or packaged builder), ``name=hub_config``, ``split=hub_split``, ``data_files`` (resolved
    paths of ``hub_data_files``, or None)."""
    data_files = [str(resolve_path(f)) for f in source.hub_data_files] or None
    return source.paths[0], {"name": source.hub_config, "split": source.hub_split, "data_files": data_files}


def _one_line(err: BaseException) -> str:
    """The error's message on one line, without datasets' "Example of usage:" tail."""
    text = str(err).split("Example of usage:")[0]
    text = " ".join(text.split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _is_local(path: str) -> bool:
    """A dataset folder or file on this node, or one of datasets' packaged builders ("json", "parquet", ...)."""
    from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES

    return path in _PACKAGED_DATASETS_MODULES or os.path.exists(os.path.expanduser(path))


def _cached(name: str) -> list[str]:
    """The local HF caches that hold something of hub dataset ``name`` (huggingface_hub's repository cache,
    datasets' own cache)."""
    import datasets.config
    from huggingface_hub import constants

    places = [os.path.join(constants.HF_HUB_CACHE, "datasets--" + name.replace("/", "--")),
              os.path.join(datasets.config.HF_DATASETS_CACHE, name.replace("/", "___"))]
    return [p for p in places if os.path.isdir(p)]


def check_hub_source(source: SourceConfig, where: str) -> None:
    """Resolve hub source ``source`` (config key ``where``, e.g. ``data.train[0]``) without reading its data:
    the dataset exists (on the hub, in the local HF cache when offline, or on disk), ``hub_config`` is one of its
    configurations (or it needs none) and ``hub_split`` one of its splits (when it lists them).

    A hub that cannot be reached while the dataset sits in the local HF cache is let through with a warning (the
    stream falls back to the cache after its retries; ``HF_HUB_OFFLINE=1`` skips them).

    Raises:
        ValueError: one line naming ``where``, the dataset (and ``hub_config``/``hub_split``) and the cause:
            offline and not cached, the hub unreachable, no such dataset, no such configuration or split, or
            missing ``hub_data_files``.
    """
    import datasets
    import datasets.config

    path, kwargs = load_args(source)
    what = f"{where}: hub dataset {path!r}"
    offline = bool(datasets.config.HF_HUB_OFFLINE)
    if not _is_local(path) and not offline:
        from huggingface_hub import HfApi
        from huggingface_hub.errors import RepositoryNotFoundError

        try:
            HfApi().dataset_info(path, timeout=HUB_TIMEOUT_S)
        except RepositoryNotFoundError:
            raise ValueError(f"{what} was not found on the Hugging Face hub (misspelt? a private or gated one "
                             "needs a token: huggingface-cli login or HF_TOKEN)") from None
        except Exception as err:  # noqa: BLE001 - a network failure shows as one of many exception types
            cached = _cached(path)
            if not cached:
                raise ValueError(f"{what}: cannot reach the Hugging Face hub ({_one_line(err)}) and it is not in "
                                 "the local HF cache: no network on this node? Use local files, or fetch it where "
                                 "there is network and set HF_HUB_OFFLINE=1 here") from None
            logger.warning("%s: cannot reach the Hugging Face hub (%s); streaming it from the local HF cache %s "
                           "(set HF_HUB_OFFLINE=1 to skip the retries)", what, _one_line(err), cached[0])
            return
    try:
        builder = datasets.load_dataset_builder(path, name=kwargs["name"], data_files=kwargs["data_files"])
    except ConnectionError as err:  # offline, or the hub failed between the two requests
        cause = ("offline (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE set) and not in the local HF cache"
                 if offline else f"cannot reach the Hugging Face hub ({_one_line(err)})")
        raise ValueError(f"{what}: {cause}") from None
    except Exception as err:  # noqa: BLE001 - datasets raises ValueError, FileNotFoundError, its own errors
        cause = _one_line(err)
        if isinstance(err, ValueError) and ("Config name is missing" in cause or "BuilderConfig" in cause):
            which = ("unset, but hub dataset {path!r} has several configurations" if source.hub_config is None
                     else "not a configuration of hub dataset {path!r}").format(path=path)
            raise ValueError(f"{where}.hub_config={source.hub_config!r}: {which} ({cause})") from None
        if isinstance(err, FileNotFoundError) and source.hub_data_files:
            raise ValueError(f"{where}.hub_data_files={source.hub_data_files!r}: {cause}") from None
        raise ValueError(f"{what} cannot be loaded: {cause}") from None
    splits = _splits(builder)
    if splits and source.hub_split not in splits:
        raise ValueError(f"{where}.hub_split={source.hub_split!r}: no such split of hub dataset {path!r}"
                         f"{f' configuration {source.hub_config!r}' if source.hub_config else ''} "
                         f"(splits: {', '.join(sorted(splits))})")


def _splits(builder) -> list[str]:
    """The splits a ``datasets`` builder knows without reading data: its data files' (a folder or data-files
    dataset), else its info's; [] when it lists none."""
    data_files = getattr(builder.config, "data_files", None)
    if data_files:
        return [str(s) for s in data_files]
    return [str(s) for s in (builder.info.splits or {})]
