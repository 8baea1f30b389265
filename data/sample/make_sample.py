"""Rebuild the bundled sample corpus from WikiText-2 (run from the repository root; needs ../shared/corpora).

    python data/sample/make_sample.py [/path/to/wikitext-2] && albert-dist tokenizer train \
        --input 'data/sample/wikitext-2-train-*.txt' --vocab-size 8000 --output data/sample

One article is one document: its paragraphs on consecutive lines, section headings dropped, documents separated
by a blank line. The release's number splitting is undone (" @-@ " -> "-", " @,@ " -> ",", " @.@ " -> ".").
Train shards: the articles of test.txt dealt round-robin into 8 files; validation: the first ~300 KB of valid.txt.
"""
import re
import sys
from pathlib import Path

SRC = Path(sys.argv[1] if len(sys.argv) > 1 else "/work/shared/corpora/wikitext-2")
OUT = Path(__file__).resolve().parent
_TITLE = re.compile(r"^ = [^=].* = $")
_HEADING = re.compile(r"^ (= )+.*( =)+ $")


def articles(path: Path) -> list[str]:
    docs, cur = [], []
    for line in path.read_text(encoding="utf-8").split("\n"):
        if _TITLE.match(line):
            if cur:
                docs.append("\n".join(cur))
            cur = []
            continue
        if not line.strip() or _HEADING.match(line):
            continue
        text = line.strip().replace(" @-@ ", "-").replace(" @,@ ", ",").replace(" @.@ ", ".")
        cur.append(text)
    if cur:
        docs.append("\n".join(cur))
    return docs


def main() -> None:
    train = articles(SRC / "test.txt")
    for i in range(8):
        (OUT / f"wikitext-2-train-{i:02d}.txt").write_text("\n\n".join(train[i::8]) + "\n", encoding="utf-8")
    valid, size = [], 0
    for doc in articles(SRC / "valid.txt"):
        if size > 300_000:
            break
        valid.append(doc)
        size += len(doc.encode("utf-8"))
    (OUT / "wikitext-2-validation.txt").write_text("\n\n".join(valid) + "\n", encoding="utf-8")
    print(f"{len(train)} train articles in 8 shards, {len(valid)} validation articles ({size} bytes)")


if __name__ == "__main__":
    main()
