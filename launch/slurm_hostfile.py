#!/usr/bin/env python3
"""Write a DeepSpeed hostfile (``<host> slots=<N>`` per line) for the nodes of a Slurm job.

    python launch/slurm_hostfile.py -o hostfile                 # inside a job: $SLURM_JOB_NODELIST
    python launch/slurm_hostfile.py --nodelist 'gpu[01-04]' --slots 8 -o hostfile

Slots per host = GPUs per node: ``--slots``, else ``$SLURM_GPUS_PER_NODE`` (``8``, ``a100:8`` or
``gpu:a100:8``), else ``$SLURM_NTASKS_PER_NODE``, else 1 (CPU mode: one rank per node). The node list is
expanded with ``scontrol show hostnames`` when available (albert_dist.distributed.slurm.expand_nodelist).
Host names are kept as Slurm names them: DeepSpeed's Slurm launcher hands them to ``srun --nodelist``; with
``--no_ssh`` they only count slots. Format: DeepSpeed's ``fetch_hostfile`` (deepspeed/launcher/runner.py).
Exit status 2 with a message when the node list is missing or malformed or a slot count is not positive.
"""
from __future__ import annotations

import argparse
import os
import re
import sys


def slots_from_env(environ: dict[str, str]) -> int:
    """Slots per node from the job's variables (see the module docstring).

    Raises:
        ValueError: a variable that is set but holds no positive count.
    """
    for name in ("SLURM_GPUS_PER_NODE", "SLURM_NTASKS_PER_NODE"):
        value = environ.get(name)
        if value:
            m = re.fullmatch(r"(?:[\w-]+:)*(\d+)", value.strip())
            if m is None or int(m.group(1)) < 1:
                raise ValueError(f"{name}={value!r}: expected a positive count like 8 or a100:8")
            return int(m.group(1))
    return 1


def hostfile_text(hosts: list[str], slots: int) -> str:
    """``"<host> slots=<slots>\\n"`` per host, in node-list order (the first host holds rank 0).

    Raises:
        ValueError: ``slots < 1``, no hosts or a host listed twice.
    """
    if slots < 1:
        raise ValueError(f"slots={slots} must be >= 1")
    if not hosts:
        raise ValueError("no hosts")
    if len(set(hosts)) != len(hosts):
        raise ValueError(f"hosts listed twice in {hosts}")
    return "".join(f"{h} slots={slots}\n" for h in hosts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodelist", default=os.environ.get("SLURM_JOB_NODELIST"),
                        help="Slurm node list (default $SLURM_JOB_NODELIST)")
    parser.add_argument("--slots", type=int, default=None, help="slots (GPUs) per host")
    parser.add_argument("-o", "--output", default="-", help="file to write ('-': stdout)")
    args = parser.parse_args(argv)
    from albert_dist.distributed.slurm import expand_nodelist

    try:
        if not args.nodelist:
            raise ValueError("no node list: pass --nodelist or run inside a Slurm job (SLURM_JOB_NODELIST)")
        slots = args.slots if args.slots is not None else slots_from_env(dict(os.environ))
        text = hostfile_text(expand_nodelist(args.nodelist), slots)
    except ValueError as err:
        print(f"slurm_hostfile: {err}", file=sys.stderr)
        return 2
    if args.output == "-":
        sys.stdout.write(text)
    else:
        with open(args.output, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
