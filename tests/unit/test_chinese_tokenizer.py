"""The Chinese recipe's tokenizer (data/zhwiki/spiece.model: identity normalisation, coverage 0.9995) exported
with a model loads in transformers' AutoTokenizer and gives sentencepiece's ids on Chinese, mixed and full-width
text; full-width punctuation stays itself (docs/data-chinese.md)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from albert_dist.data import tokenizer as tok
from albert_dist.data.sources.discover import resolve_path
from albert_dist.data.text import split_sentences

ZH_TOKENIZER = "data/zhwiki/spiece.model"
#: 210 documents of the zhwiki sample (Simplified and Traditional; tests/fixtures/text/README.md)
ZHWIKI = Path(__file__).resolve().parents[1] / "fixtures/text/zhwiki.jsonl"
TEXTS = [
    "数学是研究数量、结构以及空间等概念及其变化的一门学科。",  # Simplified
    "臺灣大學的圖書館藏書豐富，學術資源齊全。",  # Traditional
    "ALBERT模型在2019年由Google提出，参数量只有BERT-large的1/18。",  # mixed Chinese / Latin / digits
    "全角标点：“引号”，问号？括号（）感叹号！分号；全角字母Ｆｕｌｌ数字１２３　全角空格",  # full-width forms
    "含有  两个空格 和\t制表符 的 句子",  # whitespace runs (collapsed by both)
]


def test_auto_tokenizer_on_the_export_gives_sentencepiece_ids(tmp_path):
    transformers = pytest.importorskip("transformers")
    from albert_dist.cli import main as cli_main
    from albert_dist.model import AlbertConfig, AlbertForPreTraining

    sp = tok.load_tokenizer(ZH_TOKENIZER)
    assert sp.get_piece_size() == 8000
    assert all(sp.piece_to_id(c) != tok.UNK_ID for c in "，：？（）！；")  # full-width marks are pieces of their own
    cfg = dict(vocab_size=8000, embedding_size=8, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=16, max_position_embeddings=64)
    torch.save(AlbertForPreTraining(AlbertConfig(**cfg)).state_dict(), tmp_path / "model.pt")
    (tmp_path / "model.yaml").write_text("".join(f"{k}: {v}\n" for k, v in cfg.items()))
    assert cli_main(["export", str(tmp_path / "model.pt"), "--config", str(tmp_path / "model.yaml"), "--output",
                       str(tmp_path / "hf"), "--tokenizer", str(resolve_path(ZH_TOKENIZER))]) == 0
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    with ZHWIKI.open(encoding="utf-8") as f:  # and real text: every sentence of the fixture's documents
        docs = [json.loads(line)["text"] for line in f]
    texts = TEXTS + [s for d in docs for s in split_sentences(d)]
    assert len(texts) > 1700
    got = hf(texts, add_special_tokens=False)["input_ids"]
    mismatched = [t for t, ids in zip(texts, got) if ids != sp.encode(t)]
    assert not mismatched, mismatched[:3]
    assert hf(TEXTS[3])["input_ids"] == [tok.CLS_ID, *sp.encode(TEXTS[3]), tok.SEP_ID]
    pieces = "".join(sp.encode(TEXTS[3], out_type=str))
    assert all(c in pieces for c in "：，？（）！；Ｆ１") and ":" not in pieces  # full-width forms kept as written
