"""ALBERT example creation: sentences, SOP pairs from one document, truncation, whole-word n-gram masking."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from albert_dist.data.config import DataConfig, SourceConfig
from albert_dist.data.loader import PretrainingStream
from albert_dist.data.pretraining import ExampleBuilder, collate
from albert_dist.data.text import split_sentences
from albert_dist.data.tokenizer import CLS_ID, MASK_ID, PAD_ID, SEP_ID, load_tokenizer, train_tokenizer

ENGLISH = (
    "The castle was built in the twelfth century by the local lord. It was rebuilt twice after fires destroyed "
    "the wooden halls. Today the ruins attract many visitors every summer! Archaeologists found coins, pottery "
    "and weapons near the northern gate. Why the castle was abandoned remains unclear?\n"
    "Several novels are set in the castle. The most famous was written by an anonymous monk."
)
# Public-domain text (the Analects, book 1), for the no-spaces fallback.
CHINESE = (
    "子曰：學而時習之，不亦說乎？有朋自遠方來，不亦樂乎？人不知而不慍，不亦君子乎？\n"
    "有子曰：其為人也孝弟，而好犯上者，鮮矣；不好犯上，而好作亂者，未之有也。君子務本，本立而道生。孝弟也者，其為仁之本與！\n"
    "子曰：巧言令色，鮮矣仁！\n"
    "曾子曰：吾日三省吾身：為人謀而不忠乎？與朋友交而不信乎？傳不習乎？\n"
    "子曰：道千乘之國：敬事而信，節用而愛人，使民以時。\n"
    "子曰：弟子入則孝，出則弟，謹而信，汎愛眾，而親仁。行有餘力，則以學文。\n"
)


@pytest.fixture(scope="module")
def sp():
    return load_tokenizer(DataConfig().tokenizer_path)


def original(ids: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Undo the masking: the label holds the original token wherever one was chosen."""
    return np.where(labels != -100, labels, ids)


def segments(ex) -> tuple[np.ndarray, np.ndarray]:
    """(A, B) original tokens of an unpadded example, located from token_type_ids (not from the builder)."""
    ids = original(ex.input_ids, ex.mlm_labels)
    first_b = int(np.argmax(ex.token_type_ids == 1))
    assert ids[0] == CLS_ID and ids[first_b - 1] == SEP_ID and ids[-1] == SEP_ID
    return ids[1 : first_b - 1], ids[first_b:-1]


def test_split_sentences_latin_cjk_and_lines():
    assert split_sentences("One two. Three!  Four?\nFive\n\nsix.") == ["One two.", "Three!", "Four?", "Five", "six."]
    assert split_sentences("3.14 is pi. e.g.x") == ["3.14 is pi.", "e.g.x"]  # '.' needs whitespace after it
    assert split_sentences("子曰：學而時習之。不亦說乎？有朋") == ["子曰：學而時習之。", "不亦說乎？", "有朋"]


def test_sop_pairs_come_from_one_document_in_order(tmp_path, sp):
    """1- and 2-sentence documents through the whole stream: A/B are the document's own text; label 1 = swapped."""
    docs = []
    for k in range(60):
        s1 = f"The station number {k} opened in the spring of that year."
        if k % 2:
            docs.append([s1, f"Its platform {k} was extended after the war ended."])
        else:
            docs.append([s1])
    (tmp_path / "docs.txt").write_text("\n\n".join(" ".join(d) for d in docs) + "\n")
    cfg = DataConfig(train=[SourceConfig(paths=[str(tmp_path / "docs.txt")])], max_seq_length=64, short_seq_prob=0.0,
                     num_workers=0, shuffle=False)
    stream = PretrainingStream(cfg, "train", micro_batch_size=10, rank=0, world_size=1)
    encoded = [[tuple(sp.encode(s)) for s in d] for d in docs]
    it = iter(stream)
    labels = {0: 0, 1: 0}
    kinds = {1: 0, 2: 0}
    for _ in range(12):  # 120 examples = two epochs of the 60 documents
        batch = next(it)
        for row in range(10):
            n = int(batch["attention_mask"][row].sum())
            ex = type("Ex", (), {})()
            ex.input_ids = batch["input_ids"][row, :n].numpy()
            ex.mlm_labels = batch["mlm_labels"][row, :n].numpy()
            ex.token_type_ids = batch["token_type_ids"][row, :n].numpy()
            a, b = segments(ex)
            label = int(batch["sop_labels"][row])
            labels[label] += 1
            first, second = (b, a) if label else (a, b)
            matches = [d for d in encoded if tuple(first) in d or tuple(np.concatenate((first, second))) in d]
            if tuple(first) in {s for d in encoded for s in d}:  # a 2-sentence document, split between sentences
                doc = next(d for d in encoded if tuple(first) in d)
                assert len(doc) == 2 and doc == [tuple(first), tuple(second)]
                kinds[2] += 1
            else:  # a 1-sentence document, split at a word boundary inside its sentence
                whole = tuple(np.concatenate((first, second)))
                assert len(matches) == 1 and matches[0] == [whole]
                assert len(first) > 0 and len(second) > 0
                assert sp.id_to_piece(int(second[0])).startswith("\u2581")
                kinds[1] += 1
    assert kinds[1] == kinds[2] == 60
    assert 40 <= labels[1] <= 80, labels  # P(swap) = 0.5 over 120 draws


def _examples(sp, cfg, text, draws):
    builder = ExampleBuilder(sp, cfg)
    return builder, [ex for seed in range(draws) for ex in builder.build(text, np.random.default_rng(seed))]


def test_masking_never_touches_special_or_padding_and_follows_80_10_10(sp):
    cfg = DataConfig(max_seq_length=48, max_predictions_per_seq=7, short_seq_prob=0.3)
    builder, examples = _examples(sp, cfg, ENGLISH, 300)
    batch = collate(examples, cfg.max_seq_length)
    ids, labels, attn = batch["input_ids"].numpy(), batch["mlm_labels"].numpy(), batch["attention_mask"].numpy()
    tt = batch["token_type_ids"].numpy()
    lengths = attn.sum(1)
    assert (labels[attn == 0] == -100).all() and (ids[attn == 0] == PAD_ID).all()
    assert (labels[:, 0] == -100).all() and (ids[:, 0] == CLS_ID).all()
    rows = np.arange(len(ids))
    first_b = np.argmax(tt == 1, axis=1)
    assert (ids[rows, first_b - 1] == SEP_ID).all() and (ids[rows, lengths - 1] == SEP_ID).all()
    assert (labels[rows, first_b - 1] == -100).all() and (labels[rows, lengths - 1] == -100).all()
    assert not np.isin(labels[labels != -100], [PAD_ID, CLS_ID, SEP_ID, MASK_ID]).any()
    assert ((ids == SEP_ID).sum(1) == 2).all() and ((ids == CLS_ID).sum(1) == 1).all()
    # budget: min(max_predictions_per_seq, round(0.15 * candidates)); tiles are whole words so it may fall short
    n_masked = (labels != -100).sum(1)
    budget = np.minimum(7, np.maximum(1, np.round((lengths - 3) * 0.15)))
    assert (n_masked <= budget).all() and n_masked.mean() > 0.8 * budget.mean()
    chosen = labels != -100
    frac_mask = (ids[chosen] == MASK_ID).mean()
    frac_kept = (ids[chosen] == labels[chosen]).mean()
    assert abs(frac_mask - 0.8) < 0.03 and abs(frac_kept - 0.1) < 0.03 and abs(1 - frac_mask - frac_kept - 0.1) < 0.03
    random_ids = ids[chosen][(ids[chosen] != MASK_ID) & (ids[chosen] != labels[chosen])]
    assert random_ids.min() >= 5 and random_ids.max() < sp.get_piece_size()


def test_masks_cover_whole_words(sp):
    cfg = DataConfig(max_seq_length=64, max_predictions_per_seq=10)
    builder, examples = _examples(sp, cfg, ENGLISH, 100)
    partial = 0
    for ex in examples:
        a, b = segments(ex)
        for seg, offset in ((a, 1), (b, len(a) + 2)):
            starts = np.array([sp.id_to_piece(int(t)).startswith("\u2581") for t in seg])
            starts[0] = True
            word = np.cumsum(starts)
            masked = ex.mlm_labels[offset : offset + len(seg)] != -100
            for w in np.unique(word[masked]):
                partial += not masked[word == w].all()
    assert partial == 0


def _partial_words(sp, ex) -> int:
    """Words of an example only partly masked (a word starts at a "▁" piece or at the segment's start)."""
    a, b = segments(ex)
    partial = 0
    for seg, offset in ((a, 1), (b, len(a) + 2)):
        starts = np.array([sp.id_to_piece(int(t)).startswith("\u2581") for t in seg])
        starts[0] = True
        word = np.cumsum(starts)
        masked = ex.mlm_labels[offset : offset + len(seg)] != -100
        partial += sum(not masked[word == w].all() for w in np.unique(word[masked]))
    return partial


def test_piece_masking_picks_single_pieces_and_fills_the_budget(sp):
    """whole_word_masking=False, max_ngram=1 (transformers' collator's unit): pieces are chosen independently,
    so words get partly masked, and single-piece tiles always fit, so every example gets its whole budget."""
    cfg = DataConfig(max_seq_length=64, max_predictions_per_seq=10, max_ngram=1, whole_word_masking=False)
    _, examples = _examples(sp, cfg, ENGLISH, 100)
    multi_piece = sum(not sp.id_to_piece(int(t)).startswith("\u2581") for ex in examples for t in ex.input_ids[1:])
    assert multi_piece > 0  # the text has words of several pieces, else the test could not fail
    assert sum(_partial_words(sp, ex) for ex in examples) > 0
    for ex in examples:
        budget = min(10, max(1, round((len(ex.input_ids) - 3) * 0.15)))
        assert len(ex.masked_positions) == budget
    whole = DataConfig(max_seq_length=64, max_predictions_per_seq=10, max_ngram=1)
    _, examples = _examples(sp, whole, ENGLISH, 100)
    assert sum(_partial_words(sp, ex) for ex in examples) == 0


def test_ngram_lengths_follow_one_over_n(sp):
    """Tiles of single-token words: chosen n-gram lengths ~ 6/11, 3/11, 2/11 (ALBERT paper, section 4.1)."""
    builder = ExampleBuilder(sp, DataConfig(max_ngram=3))
    rng = np.random.default_rng(0)
    counts = np.zeros(4)
    for _ in range(400):
        words, tokens, chosen = builder.choose_ngrams(np.arange(500), 500, budget=75, rng=rng)
        assert tokens[chosen].sum() <= 75 and (words == tokens).all() and tokens.sum() == 500
        assert words.max() <= 3
        counts += np.bincount(words[chosen][:-1], minlength=4)  # drop one: the last tile may be cut short
    hist = counts[1:] / counts.sum()
    np.testing.assert_allclose(hist, [6 / 11, 3 / 11, 2 / 11], atol=0.015)


def test_truncation_matches_bert_truncate_seq_pair_lengths(sp):
    builder = ExampleBuilder(sp, DataConfig(max_seq_length=40))  # max_num_tokens = 37
    rng = np.random.default_rng(1)

    def reference(la, lb, limit):  # BERT create_pretraining_data.truncate_seq_pair, lengths only
        while la + lb > limit:
            if la > lb:
                la -= 1
            else:
                lb -= 1
        return la, lb

    fronts = []
    for la in range(1, 60, 3):
        for lb in range(1, 60, 4):
            a, b = np.arange(la), np.arange(100, 100 + lb)
            ta, tb = builder._truncate_pair(a, b, rng)
            assert (len(ta), len(tb)) == reference(la, lb, 37)
            # kept tokens stay contiguous pieces of the original segments
            assert (np.diff(ta) == 1).all() and (np.diff(tb) == 1).all()
            if la > len(ta):
                fronts.append((ta[0] - a[0]) / (la - len(ta)))
    assert abs(np.mean(fronts) - 0.5) < 0.1  # each trimmed token from the front with p = 1/2


def test_text_without_spaces_masks_pieces(tmp_path):
    (tmp_path / "zh.txt").write_text(CHINESE * 3)
    model = train_tokenizer([str(tmp_path / "zh.txt")], str(tmp_path / "tok"), vocab_size=100, character_coverage=1.0)
    sp = load_tokenizer(str(model))
    cfg = DataConfig(max_seq_length=40, max_predictions_per_seq=6)
    builder, examples = _examples(sp, cfg, CHINESE, 50)
    assert examples
    assert builder.word_start[[sp.piece_to_id(c) for c in "子曰學" if sp.piece_to_id(c) != 1]].all()
    spans, filled = [], []
    for ex in examples:
        masked = ex.mlm_labels != -100
        budget = min(6, round(0.15 * (len(ex.input_ids) - 3)))
        assert masked.sum() <= budget
        filled.append(masked.sum() / budget)
        spans.append(np.count_nonzero(np.diff(masked.astype(int)) == 1))
    assert np.mean(filled) > 0.85  # pieces are words, so the budget is (nearly) met
    assert np.mean(spans) > 1.5  # several separate n-grams, not one whole "word" per sentence


def test_batched_ngram_choice_respects_example_boundaries_and_budgets(sp):
    builder = ExampleBuilder(sp, DataConfig(max_ngram=3))
    rng = np.random.default_rng(3)
    greedy = total = 0
    for _ in range(100):
        n_ex = int(rng.integers(1, 6))
        lengths = rng.integers(1, 40, size=n_ex)  # tokens per example
        offsets = np.concatenate(([0], np.cumsum(lengths)))
        starts = rng.random(offsets[-1]) < 0.6
        starts[offsets[:-1]] = True  # every example starts a word
        word_starts = starts.nonzero()[0]
        word_example = np.searchsorted(offsets, word_starts, side="right") - 1
        budgets = rng.integers(1, 8, size=n_ex)
        words, tokens, tile_ex, chosen = builder.choose_ngrams_batch(word_starts, word_example, offsets[-1], budgets, rng)
        assert tokens.sum() == offsets[-1] and (words >= 1).all() and (words <= 3).all()
        tile_first = np.concatenate(([0], np.cumsum(tokens)[:-1]))
        tile_last = tile_first + tokens - 1
        # a tile lies inside one example (the one it is attributed to)
        assert (np.searchsorted(offsets, tile_first, side="right") - 1 == tile_ex).all()
        assert (np.searchsorted(offsets, tile_last, side="right") - 1 == tile_ex).all()
        masked_per_ex = np.bincount(tile_ex[chosen], weights=tokens[chosen], minlength=n_ex)
        assert (masked_per_ex <= budgets).all()
        # the sequential loop's property, met in (nearly) every example: no unchosen tile would still fit
        left = budgets - masked_per_ex
        for e in range(n_ex):
            unchosen = tokens[(tile_ex == e) & ~chosen]
            total += 1
            greedy += not len(unchosen) or unchosen.min() > left[e]
    assert greedy / total > 0.97, (greedy, total)


def test_the_masking_budget_is_one_formula_for_a_row_and_for_a_batch():
    """`masking_budget` (pipeline, cap note, memory estimate): BERT's num_to_predict, the int and array forms equal."""
    import numpy as np

    from albert_dist.data.config import masking_budget

    cand = np.arange(0, 600)
    assert masking_budget(cand, 0.15, 20).tolist() == [masking_budget(int(c), 0.15, 20) for c in cand]
    assert [min(20, max(1, round(c * 0.15))) for c in range(600)] == masking_budget(cand, 0.15, 20).tolist()
    assert (masking_budget(509, 0.15, 20), masking_budget(125, 0.15), masking_budget(2, 0.15)) == (20, 19, 1)


@pytest.mark.parametrize("random_token_prob", [0.0, 0.25, 0.5])
def test_random_token_prob_sets_the_share_of_random_and_kept_tokens(sp, random_token_prob):
    """`data.random_token_prob` = p generalises BERT's 80/10/10 rule (create_pretraining_data.py: of the chosen
    tokens 80% [MASK], 10% kept, 10% a random token): 1 - 2p [MASK], p kept, p random, measured here. p = 0 and
    p = 0.5 are exact (no random token / no [MASK]); a random draw may hit the original token (1 in ~100 ids)."""
    p = random_token_prob
    cfg = DataConfig(max_seq_length=48, max_predictions_per_seq=7, random_token_prob=p)
    _, examples = _examples(sp, cfg, ENGLISH, 300)
    batch = collate(examples, cfg.max_seq_length)
    ids, labels = batch["input_ids"].numpy(), batch["mlm_labels"].numpy()
    chosen = labels != -100
    masked = ids[chosen] == MASK_ID
    kept = ids[chosen] == labels[chosen]
    assert chosen.sum() > 1500
    if p == 0.0:
        assert masked.all()
    elif p == 0.5:
        assert not masked.any()
    random_hits_original = p / (sp.get_piece_size() - 5)  # a random id (5 .. vocab-1) equal to the label
    assert masked.mean() == pytest.approx(1 - 2 * p, abs=0.03)
    assert kept.mean() == pytest.approx(p + random_hits_original, abs=0.03)
    assert (~masked & ~kept).mean() == pytest.approx(p - random_hits_original, abs=0.03)


# ---- a window of documents built at once: the examples of building them one by one ----
#: the zhwiki sample's first 150 documents (and 60 more; tests/fixtures/text/README.md)
ZHWIKI = Path(__file__).resolve().parents[1] / "fixtures/text/zhwiki.jsonl"
#: (examples, sha256[:16]) of `_digest` over the first 100 zhwiki documents, computed by the per-document builder
#: of commit da4c57e (before windows were built at once), and of the train stream's first 12 batches.
BUILT_BEFORE = {"jieba": (224, "4c751c05efbd5655"), "jieba-ngram3": (242, "0f6a0f557ed1b87d"),
                "none-ngram3": (242, "af1f93676acee3c5")}
STREAM_BEFORE = "52d9696964440c18"
ZH_SETTINGS = {"jieba": dict(chinese_word_segmentation="jieba", max_ngram=1, masked_lm_prob=0.3,
                             max_predictions_per_seq=40, short_seq_prob=0.0),  # the zhwiki recipe's
               "jieba-ngram3": dict(chinese_word_segmentation="jieba", max_ngram=3, short_seq_prob=0.1),
               "none-ngram3": dict(chinese_word_segmentation="none", max_ngram=3, short_seq_prob=0.1)}


def _zh_docs(n: int) -> list[str]:
    import itertools
    import json

    with ZHWIKI.open(encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in itertools.islice(f, n)]


def _digest(examples_per_doc) -> tuple[int, str]:
    import hashlib

    h, n = hashlib.sha256(), 0
    for examples in examples_per_doc:
        for e in examples:
            for a in (e.input_ids, e.masked_positions, e.masked_ids):
                h.update(np.ascontiguousarray(a).tobytes())
            h.update(f"{e.len_a},{e.sop_label};".encode())
            n += 1
    return n, h.hexdigest()[:16]


def _stream_digest(tmp_path) -> str:
    import hashlib
    import json

    docs = tmp_path / "zh.jsonl"
    docs.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in _zh_docs(150)),
                    encoding="utf-8")
    cfg = DataConfig(train=[SourceConfig(paths=[str(docs)])], tokenizer_path="data/zhwiki/spiece.model",
                     max_seq_length=128, num_workers=0, max_ngram=3, chinese_word_segmentation="jieba")
    it, h = iter(PretrainingStream(cfg, "train", 16, rank=0, world_size=1)), hashlib.sha256()
    for _ in range(12):
        batch = next(it)
        for key in sorted(batch):
            h.update(batch[key].numpy().tobytes())
    return h.hexdigest()[:16]


def test_a_window_built_at_once_gives_the_examples_built_one_by_one(tmp_path, monkeypatch):
    """`build_documents` (the loader's window of documents at once: the Chinese word-level pipeline's speed)
    gives exactly the examples the per-document builder gave before it, on zhwiki with jieba words and without,
    and so does the train stream (shuffle_documents=32) batch by batch."""
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    texts = _zh_docs(100)
    sp = load_tokenizer("data/zhwiki/spiece.model")
    for name, settings in ZH_SETTINGS.items():
        builder = ExampleBuilder(sp, DataConfig(max_seq_length=128, **settings))
        rngs = [np.random.default_rng([0, i]) for i in range(len(texts))]
        windows = [builder.build_documents(texts[w : w + 32], rngs[w : w + 32]) for w in range(0, len(texts), 32)]
        assert _digest(doc for window in windows for doc in window) == BUILT_BEFORE[name], name
        assert _digest(builder.build(t, np.random.default_rng([0, i])) for i, t in enumerate(texts)) == \
            BUILT_BEFORE[name], name
    assert _stream_digest(tmp_path) == STREAM_BEFORE
