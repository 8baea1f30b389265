"""The generated blocks of the docs: what a script writes between ``<!-- NAME start -->`` and ``<!-- NAME end -->``
of a markdown page (the benchmarks' figures, the package tree, the slowest tests); the rest is written by hand."""
from __future__ import annotations

import re
from pathlib import Path


def write_block(doc: str | Path, name: str, body: str) -> None:
    """Replace what stands between ``<!-- {name} start -->`` and ``<!-- {name} end -->`` in the markdown file `doc`
    with `body` (the figures a script measured; the rest of the page is prose written by hand).

    Raises:
        ValueError: `doc` holds no such pair of markers, or more than one.
    """
    start, end = f"<!-- {name} start -->", f"<!-- {name} end -->"
    doc = Path(doc)
    text, n = re.subn(re.escape(start) + ".*?" + re.escape(end), lambda _: f"{start}\n{body}\n{end}",
                      doc.read_text(), flags=re.S)
    if n != 1:
        raise ValueError(f"{doc}: expected one {start} ... {end} section, found {n}")
    doc.write_text(text)
