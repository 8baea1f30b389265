"""Hub sources (``format: hub``) are resolved before any process group (`albert_dist.data.sources.hub.check_hub_source`,
from the preflight of `train` and from `data plan`): an unreachable or misspelt dataset, a wrong configuration
or split is exit 2 with one line naming the config key, not a traceback after ~30 s of start-up. No test touches
the network: offline mode is set (as HF_HUB_OFFLINE=1 sets it at import), or the hub request is simulated."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from albert_dist import cli
from fixtures.hub_folder import write_hub_folder

REPO = Path(__file__).resolve().parents[2]
RECIPE = str(REPO / "configs/pretrain/albert-tiny-wikitext.yaml")
MADE_UP = "albert-dist-tests/no-such-dataset-4f2a"


@pytest.fixture
def offline(monkeypatch):
    """HF_HUB_OFFLINE=1 / HF_DATASETS_OFFLINE=1, also in the modules that read them at import (this process may
    have imported them before); a request to the hub fails the test."""
    import datasets.config
    from huggingface_hub import HfApi, constants

    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(HfApi, "dataset_info", lambda *a, **k: pytest.fail("asked the hub while offline"))



@pytest.mark.parametrize("command", ["train", "data plan"])
def test_an_unreachable_hub_dataset_is_exit_2_in_one_line(capsys, offline, no_process_group, command):
    """The new user's case: a hub dataset on a node without network (here: offline mode, a made-up name) failed
    after ~30 s with an 85-line traceback, and `data plan` did not look at it."""
    source = f"data.train=[{{paths: [{MADE_UP}], format: hub}}]"
    args = (["train", "--config", RECIPE, "tracking.enabled=false", source] if command == "train"
            else ["data", "plan", "--config", RECIPE, "--ranks", "2", source])
    t0 = time.monotonic()
    assert cli.main(args) == 2
    assert time.monotonic() - t0 < 10
    assert capsys.readouterr().err == (f"albert-dist {command}: data.train[0]: hub dataset {MADE_UP!r}: offline "
                                       "(HF_HUB_OFFLINE/HF_DATASETS_OFFLINE set) and not in the local HF cache\n")


def test_online_the_check_tells_no_network_from_a_misspelt_name(tmp_path, monkeypatch):
    """Online (simulated: the quick dataset_info request is replaced, nothing is sent), no network and a name
    the hub does not know are told apart in one request, without datasets' 5 retries (23 s on a node with no
    DNS); a dataset in the local HF cache passes with a warning when the hub cannot be reached."""
    import importlib

    import datasets
    import datasets.config
    from huggingface_hub import HfApi, constants, errors
    from huggingface_hub.errors import RepositoryNotFoundError

    from albert_dist.data.config import SourceConfig
    from albert_dist.data.sources.hub import check_hub_source

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    monkeypatch.setattr(datasets, "load_dataset_builder", lambda *a, **k: pytest.fail("datasets' retries"))
    src = SourceConfig(paths=[MADE_UP], format="hub")
    httpx = importlib.import_module(errors.Response.__module__.split(".")[0])  # huggingface_hub's HTTP client

    def no_dns(self, repo_id, **kwargs):
        assert kwargs.get("timeout") is not None  # a hung connection must not hold the job
        raise httpx.ConnectError("[Errno -2] Name or service not known")

    monkeypatch.setattr(HfApi, "dataset_info", no_dns)
    with pytest.raises(ValueError, match=rf"^data\.train\[1\]: hub dataset '{MADE_UP}': cannot reach the Hugging "
                                         r"Face hub \(ConnectError: \[Errno -2\] Name or service not known\) and it "
                                         r"is not in the local HF cache: no network on this node\?"):
        check_hub_source(src, "data.train[1]")
    (tmp_path / "hub" / ("datasets--" + MADE_UP.replace("/", "--"))).mkdir(parents=True)
    check_hub_source(src, "data.train[1]")  # cached: the stream falls back to it

    def not_found(self, repo_id, **kwargs):
        request = httpx.Request("GET", f"https://huggingface.co/api/datasets/{repo_id}")
        raise RepositoryNotFoundError("404 Client Error", response=httpx.Response(404, request=request))

    monkeypatch.setattr(HfApi, "dataset_info", not_found)
    with pytest.raises(ValueError, match=rf"^data\.train\[1\]: hub dataset '{MADE_UP}' was not found on the "
                                         r"Hugging Face hub \(misspelt\?"):
        check_hub_source(src, "data.train[1]")


def test_a_local_hub_dataset_passes_and_a_wrong_config_or_split_is_named(tmp_path, offline):
    """A dataset folder laid out as a hub repository (two configurations, train and validation splits) and a
    packaged builder with data files (``json``) pass the preflight; a configuration, split or data file it does
    not have is one line naming the key (data.train[0].hub_config, .hub_split, .hub_data_files)."""
    from albert_dist.apps.pretrain import preflight
    from albert_dist.config import load_config

    write_hub_folder(tmp_path)

    def check(source: str) -> None:
        cfg = load_config(None, [f"data.train=[{{paths: ['{tmp_path}'], format: hub, {source}}}]",
                                 f"data.validation=[{{paths: [json], format: hub, hub_data_files: "
                                 f"['{tmp_path}/small-validation.jsonl']}}]"])
        preflight.check_inputs(cfg, world_size=2)

    check("hub_config: large, hub_split: validation")
    with pytest.raises(ValueError, match=r"^data\.train\[0\]\.hub_config='huge': not a configuration of hub "
                                         r"dataset .*Available: \['small', 'large'\]"):
        check("hub_config: huge")
    with pytest.raises(ValueError, match=r"^data\.train\[0\]\.hub_config=None: unset, but hub dataset .* has "
                                         r"several configurations"):
        check("hub_split: train")
    with pytest.raises(ValueError, match=r"^data\.train\[0\]\.hub_split='test': no such split of hub dataset .* "
                                         r"configuration 'small' \(splits: train, validation\)$"):
        check("hub_config: small, hub_split: test")
    cfg = load_config(None, ["data.train=[{paths: [json], format: hub, hub_data_files: [/nonexistent/a.jsonl]}]"])
    with pytest.raises(ValueError, match=r"^data\.train\[0\]\.hub_data_files=\['/nonexistent/a.jsonl'\]: "
                                         r"FileNotFoundError"):
        preflight.check_inputs(cfg, world_size=1)
