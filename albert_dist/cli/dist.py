"""The front end of `albert-dist dist`: print this task's rank discovery as one line (a job-script check).

    srun albert-dist dist        # every task: DIST {"rank": ..., "node_rank": ..., ..., "host": ...}

A node list or a batch-shell expansion gone wrong (every node believing it is node 0) shows before any training
starts. Imports no torch (`albert_dist.distributed.env.discover`: stdlib and python-hostlist). Exit codes: 0, or 2
with one line when discovery fails.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import socket

from albert_dist.exit_codes import EXIT_OK


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """No arguments: everything comes from the environment."""


def run(args: argparse.Namespace) -> int:
    """Print ``DIST {...}`` (`albert_dist.distributed.env.DistEnv` and the host name) on stdout.

    Raises:
        ValueError: inconsistent launcher or Slurm variables (exit 2, one line).
    """
    from albert_dist.distributed.env import discover

    env = discover()
    print("DIST " + json.dumps(dataclasses.asdict(env) | {"host": socket.gethostname()}), flush=True)
    return EXIT_OK
