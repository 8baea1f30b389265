"""The node cache's settings (data.cache_dir, data.cache_max_bytes): defaults, errors naming the field, the
preflight's check of the folder. The cache itself is tested against an S3 server in tests/e2e/test_object_cache.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from albert_dist.config import load_config
from albert_dist.data.sources import cache
from albert_dist.apps.pretrain.preflight import check_output_dirs, output_dirs


def test_the_default_folder_follows_xdg_cache_home_then_the_home_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.default_dir() == str(tmp_path / "xdg" / "albert_dist" / "objects")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.default_dir() == str(tmp_path / "home" / ".cache" / "albert_dist" / "objects")


@pytest.mark.parametrize("override, message", [
    ("data.cache_max_bytes=-1", "data.cache_max_bytes must be >= 0 (0 turns the cache off), got -1"),
    ("data.cache_dir=' '", "data.cache_dir must be a folder or null"),
])
def test_a_bad_setting_names_the_field(override, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, [override])


def test_a_folder_that_cannot_be_made_is_one_line_naming_data_cache_dir(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match=r"data.cache_dir=.*a-file/objects.*: cannot create or write there"):
        cache.ObjectCache(str(blocker / "objects"), 1 << 20)
    with pytest.raises(ValueError, match="data.cache_max_bytes must be >= 1"):
        cache.ObjectCache(str(tmp_path / "ok"), 0)


def test_the_preflight_checks_the_folder_only_when_an_object_store_validation_source_uses_it(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    where = f"data.cache_dir={blocker / 'objects'}"
    local = load_config(None, [where, f"run_dir={tmp_path / 'run'}"])
    assert "data.cache_dir" not in dict(output_dirs(local))  # local validation sources: no cache, no check
    remote = load_config(None, [where, f"run_dir={tmp_path / 'run'}", "data.validation=[s3://bucket/valid.txt]"])
    assert dict(output_dirs(remote))["data.cache_dir"] == Path(blocker / "objects")
    with pytest.raises(ValueError, match=r"data.cache_dir=.*a-file/objects.*is not a directory"):
        check_output_dirs(remote)
    off = load_config(None, [where, f"run_dir={tmp_path / 'run'}", "data.validation=[s3://bucket/valid.txt]",
                             "data.cache_max_bytes=0"])
    assert "data.cache_dir" not in dict(output_dirs(off))
    check_output_dirs(off)
