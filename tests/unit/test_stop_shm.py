"""A rank's end removes DeepSpeed's CPU allreduce workspace from /dev/shm (albert_dist.job.stop.
release_shm_workspace): DeepSpeed creates one 66 MiB segment per rank and never unlinks it. The segment's name is
built here from the installed DeepSpeed's own source (shm.cpp's SHM_BUFFER_NAME and its two name formats), so a
change of DeepSpeed's naming fails this test instead of leaking silently."""
from __future__ import annotations

import os
import re
from pathlib import Path

import deepspeed

from albert_dist.job.stop import release_shm_workspace


def _deepspeed_name(uid: int, addr: str, port: str, rank: int) -> str:
    source = (Path(deepspeed.__file__).parent / "ops/csrc/cpu/comm/shm.cpp").read_text()
    base = re.search(r'#define SHM_BUFFER_NAME "([^"]+)"', source).group(1)
    assert '"%s_%d_%s_%s",\n             SHM_BUFFER_NAME,\n             getuid(),\n             addr_string,\n' \
           '             port_string);' in source  # shm_name_prefix
    assert 'snprintf(shm_name, NAME_BUF_SIZE, "%s_%d", shm_name_prefix, rank);' in source
    return f"{base}_{uid}_{addr}_{port}_{rank}"


def test_only_this_ranks_segment_of_this_job_is_removed(tmp_path, monkeypatch):
    uid = os.getuid()
    mine = tmp_path / _deepspeed_name(uid, "127.0.0.1", "29611", 1)
    others = [tmp_path / _deepspeed_name(uid, "127.0.0.1", "29611", 0),  # rank 0 of this job: its own end
              tmp_path / _deepspeed_name(uid, "127.0.0.1", "29612", 1),  # another job on this node
              tmp_path / "psm_other_segment"]
    for f in [mine, *others]:
        f.write_bytes(b"x")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29611")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert release_shm_workspace(str(tmp_path)) == [str(mine)]
    assert not mine.exists() and all(f.exists() for f in others)
    assert release_shm_workspace(str(tmp_path)) == []  # gone already: nothing to do, no error
    monkeypatch.delenv("MASTER_PORT")
    assert release_shm_workspace(str(tmp_path)) == []  # not a launched rank
