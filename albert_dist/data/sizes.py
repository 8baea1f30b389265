"""Byte sizes: "64M", "1.5G", "4096" -> bytes (powers of 1024) on command lines, back for messages, and this
process's peak resident memory."""
from __future__ import annotations

import argparse
import resource

_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_byte_size(text: str) -> int:
    """Bytes of ``text``: an integer or a number with a K/M/G/T suffix (KiB..TiB; "MB"/"MiB" read as "M").

    An argparse ``type=``: raises argparse.ArgumentTypeError (a ValueError) naming the text when it is not a
    size or is below 1 byte.
    """
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    try:
        value = float(t[:-1]) * _UNITS[t[-1]] if t and t[-1] in _UNITS else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a byte size: {text!r} (e.g. 67108864, 64M, 1G)") from None
    if not value >= 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 byte, got {text!r}")
    return int(value)


def mib(nbytes: float) -> str:
    """``nbytes`` as "12.3 MiB" for messages (KiB below 1 MiB, GiB from 10 GiB)."""
    if nbytes >= 10 * 2**30:
        return f"{nbytes / 2**30:.1f} GiB"
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.1f} KiB"


def peak_rss_bytes() -> int:
    """This process's peak resident set size in bytes: ``VmHWM`` of /proc/self/status on Linux.

    Not ``getrusage(RUSAGE_SELF).ru_maxrss``: Linux carries it across ``execve``, so a process started by a big
    parent (a benchmark, a notebook) reports at least the parent's RSS at fork time; VmHWM belongs to the new
    address space. Falls back to ru_maxrss (KiB on Linux) where /proc is absent.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
