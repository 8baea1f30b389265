"""`data prepare`'s process pool (albert_dist.data.prepare.pool): its allocator setting."""
from __future__ import annotations


def test_prepare_keeps_freed_memory_where_glibc_lets_it():
    """glibc accepts both mallopt values `hold_freed_memory` sets (mallopt returns 0 for a value out of its range,
    e.g. an mmap threshold above its 32 MiB maximum); elsewhere it says it did nothing."""
    import platform

    from albert_dist.data.prepare.pool import hold_freed_memory

    assert hold_freed_memory() is (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")
