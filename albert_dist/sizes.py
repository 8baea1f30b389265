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


def fmt_bytes(nbytes: float) -> str:
    """``nbytes`` for messages, in powers of 1024 as `parse_byte_size` reads them: "512 B", "12.3 KiB",
    "45.1 MiB", "2.34 GiB", "1.07 TiB" (one decimal below 1 GiB, two from there: the memory line tells 7.95 from
    8.00 GiB). The package's one byte formatter (the memory line, `data plan`, `data prepare`, the tokenizer)."""
    n = float(nbytes)
    if abs(n) < 2**10:
        return f"{n:.0f} B"
    for unit, scale in (("KiB", 2**10), ("MiB", 2**20), ("GiB", 2**30)):
        if abs(n) < 1023.95 * scale:  # what would print as "1024.0" goes up a unit
            return f"{n / scale:.{2 if unit == 'GiB' else 1}f} {unit}"
    return f"{n / 2**40:.2f} TiB"


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
