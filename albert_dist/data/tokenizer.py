"""sentencepiece tokenizer with ALBERT's special ids (``albert-dist tokenizer train``; its front end is
`albert_dist.cli.tokenizer`).

Ids (as in google-research/albert's released ``30k-clean.model``): ``<pad>``=0, ``<unk>``=1, ``[CLS]``=2,
``[SEP]``=3, ``[MASK]``=4. ``[CLS]``/``[SEP]``/``[MASK]`` are sentencepiece *control* symbols: they own an id but
the encoder never produces them from text, so a document containing the literal string "[MASK]" is encoded as
ordinary pieces and the pipeline inserts special tokens by id only. (User-defined symbols would be matched in
text, which is why they are not used.) The model loads in transformers' ``AlbertTokenizer`` with the same ids.

Byte fallback (``--byte-fallback``, sentencepiece ``byte_fallback``) adds the 256 pieces ``<0x00>``..``<0xFF>``
(ids 5..260, right after the special ids) and encodes a character outside the vocabulary as its UTF-8 bytes
instead of ``<unk>``. It is off by default because transformers' ALBERT tokenizer ignores it (checked with
transformers 5.24 in tests/unit/test_tokenizer.py: ``AlbertTokenizer``, which ``AlbertTokenizerFast`` aliases,
builds its Unigram model with byte fallback off, so it encodes those characters as ``<unk>`` and decodes byte
pieces as their literal names): an exported model would see other ids than it was trained on. Train with
``--character-coverage 1.0`` instead to keep every character of the training text (what the bundled model does).
"""
from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import sentencepiece as spm

from albert_dist.sizes import fmt_bytes

logger = logging.getLogger(__name__)

PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = 0, 1, 2, 3, 4
SPECIAL_PIECES = {"<pad>": PAD_ID, "<unk>": UNK_ID, "[CLS]": CLS_ID, "[SEP]": SEP_ID, "[MASK]": MASK_ID}
#: first id of an ordinary piece; random replacement tokens are drawn from [FIRST_NORMAL_ID, vocab_size)
FIRST_NORMAL_ID = 5
#: Bytes of document text sentencepiece trains on by default: the unigram trainer's peak RSS grows by ~22 bytes
#: per byte of (ASCII) sample (vocab 8000; `bench/data_scale.py --full`, docs/data-tokenizer.md), so 64 MiB peaks at
#: ~1.5 GB, under 2 GB with headroom.
DEFAULT_SAMPLE_BYTES = 64 * 2**20
#: ``albert-dist tokenizer train`` default for byte fallback: off while transformers' AlbertTokenizer ignores it.
BYTE_FALLBACK_DEFAULT = False
#: sentencepiece normalisation rules ``tokenizer train --normalization`` offers: "nmt_nfkc" (sentencepiece's
#: default: NFKC, whitespace collapsed; full-width ，：？ become ASCII) or "whitespace_only" (the text as written,
#: but for every Unicode whitespace character mapped to a space: what the Chinese recipe uses to keep full-width
#: forms, as Chinese BERT vocabularies do; docs/data-chinese.md). Plain "identity" is not offered: it keeps
#: U+3000 and tabs as pieces, where transformers' ALBERT tokenizer splits on them (WhitespaceSplit), so an
#: exported model would get other ids.
NORMALIZATIONS = ("nmt_nfkc", "whitespace_only")
#: Unicode White_Space (what transformers' WhitespaceSplit splits on) but the ASCII space itself.
_WHITESPACE = (0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F,
               0x205F, 0x3000)


def _sentences(texts: Iterator[str], max_sentence_bytes: int) -> Iterator[str]:
    """Training lines: the sentences of every document, split exactly as the pretraining pipeline splits them."""
    from albert_dist.data.text import split_sentences

    for text in texts:
        for sentence in split_sentences(text):
            if len(sentence.encode("utf-8")) <= max_sentence_bytes:
                yield sentence


def train_tokenizer(
    inputs: list[str],
    output_dir: str,
    vocab_size: int,
    model_type: str = "unigram",
    lowercase: bool = False,
    input_sentence_size: int = 0,
    character_coverage: float = 0.9995,
    seed: int = 0,
    max_sentence_bytes: int = 4192,
    text_field: str = "text",
    num_threads: int = 1,
    byte_fallback: bool = BYTE_FALLBACK_DEFAULT,
    sample_bytes: int = DEFAULT_SAMPLE_BYTES,
    normalization: str = "nmt_nfkc",
) -> Path:
    """Train ``<output_dir>/spiece.model`` (+ ``spiece.vocab``, and the transformers files of
    `write_transformers_config`) from local files, directories or globs.

    Trains on a sample of at most ``sample_bytes`` of document text drawn from *every* input file
    (:class:`albert_dist.data.sample.ByteBudgetSample`: quotas proportional to each file's size, evenly spaced
    windows in uncompressed files and row groups, a prefix of .gz/.zst files), so peak memory is set by the
    budget, not by the corpus: sentencepiece's unigram trainer needs ~22 bytes of RSS per byte of sample
    (docs/data-tokenizer.md), hence the default `DEFAULT_SAMPLE_BYTES`. ``input_sentence_size`` > 0 additionally caps the
    sentences sentencepiece keeps (its reservoir sample); 0 keeps every sampled sentence. Normalisation is NFKC
    (``nmt_nfkc``), with case folding (``nmt_nfkc_cf``) when ``lowercase``, or only whitespace mapped to
    spaces with ``normalization`` "whitespace_only" (see `NORMALIZATIONS`). ``byte_fallback``: characters outside the vocabulary become byte
    pieces instead of ``<unk>`` (see the module docstring for why it is off by default). Raises ValueError for a bad argument, inputs that match no file or
    hold no text, or a vocab_size larger than the corpus supports (sentencepiece's own limit, in the message).
    Returns the model path.
    """
    from albert_dist.data.config import SourceConfig
    from albert_dist.data.sample import ByteBudgetSample, describe

    if model_type not in ("unigram", "bpe"):
        raise ValueError(f"model_type must be 'unigram' or 'bpe', got {model_type!r}")
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
    if lowercase and normalization != "nmt_nfkc":
        raise ValueError(f"lowercase needs normalization 'nmt_nfkc' (sentencepiece's nmt_nfkc_cf), got {normalization!r}")
    if vocab_size <= FIRST_NORMAL_ID:
        raise ValueError(f"vocab_size must be > {FIRST_NORMAL_ID}, got {vocab_size}")
    if not inputs:
        raise ValueError("inputs must name at least one file, directory or glob")
    if sample_bytes < 1:
        raise ValueError(f"sample_bytes must be >= 1, got {sample_bytes}")
    if input_sentence_size < 0:
        raise ValueError(f"input_sentence_size must be >= 0 (0 = no cap), got {input_sentence_size}")
    sources = [SourceConfig(paths=[p], text_field=text_field) for p in inputs]
    sample = ByteBudgetSample(sources, "--input", sample_bytes)
    logger.info("tokenizer: %s", describe(sample))
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    spm.set_random_generator_seed(seed)
    try:
        rule = "nmt_nfkc_cf" if lowercase else normalization
        _train_sentencepiece(iter(sample), out, vocab_size, model_type, rule, character_coverage,
                             input_sentence_size, max_sentence_bytes, num_threads, byte_fallback)
    except RuntimeError as err:  # sentencepiece's C++ checks: too large a vocabulary, no sentences at all
        detail = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        if "sentences_.empty()" in detail:
            skipped = dict(sample.skipped)
            detail = (f"the inputs hold no text ({sample.documents} usable documents; skipped records: "
                      f"{skipped or 'none'})")
        raise ValueError(f"sentencepiece could not train vocab_size={vocab_size} ({model_type}) from "
                         f"{list(inputs)!r}: {detail}") from err
    model = out / "spiece.model"
    logger.info("tokenizer: trained on %s of text (%d documents) from %d of %d files%s",
                fmt_bytes(sum(sample.taken.values())), sample.documents, sum(1 for v in sample.taken.values() if v),
                len(sample.plan), f"; skipped {dict(sample.skipped)}" if sample.skipped else "")
    if byte_fallback:
        logger.warning("byte fallback is on: transformers' AlbertTokenizer encodes the characters its vocabulary lacks as "
                       "<unk> and decodes byte pieces literally, so an exported model's tokenizer differs from this one")
    check_special_ids(load_tokenizer(str(model)))
    write_transformers_config(out)
    return model


def write_transformers_config(model_dir: str | Path, model_max_length: Optional[int] = None) -> list[Path]:
    """Write ``tokenizer_config.json`` and ``special_tokens_map.json`` next to ``spiece.model`` so that
    transformers' ``AlbertTokenizer`` / ``AlbertTokenizerFast.from_pretrained(model_dir)`` give exactly
    sentencepiece's ids.

    The sentencepiece model's own normaliser already case-folds (``--lowercase``: ``nmt_nfkc_cf``) or not,
    keeps accents and collapses whitespace, as in training; transformers' defaults (``do_lower_case=True``,
    ``keep_accents=False``) would lower-case and strip accents on top, so a cased model's "Hello" became
    "hello"'s ids. Hence ``do_lower_case=false``, ``keep_accents=true``, ``remove_space=true`` (transformers 4's
    Python tokenizer) for both kinds. Returns the written paths.
    """
    import json

    model_dir = Path(model_dir)
    special = {"bos_token": "[CLS]", "eos_token": "[SEP]", "unk_token": "<unk>", "sep_token": "[SEP]",
               "pad_token": "<pad>", "cls_token": "[CLS]",
               # as in google's albert releases: "[MASK]" eats the space before it
               "mask_token": {"content": "[MASK]", "lstrip": True, "rstrip": False, "normalized": False,
                              "single_word": False}}
    config = {"tokenizer_class": "AlbertTokenizer", "do_lower_case": False, "keep_accents": True,
              "remove_space": True, **special}
    if model_max_length is not None:
        config["model_max_length"] = int(model_max_length)
    paths = [model_dir / "tokenizer_config.json", model_dir / "special_tokens_map.json"]
    for path, data in zip(paths, (config, special)):
        path.write_text(json.dumps(data, indent=2) + "\n")
    return paths


def _train_sentencepiece(texts, out: Path, vocab_size: int, model_type: str, normalization_rule_name: str,
                         character_coverage: float, input_sentence_size: int, max_sentence_bytes: int,
                         num_threads: int, byte_fallback: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        rule: dict[str, str] = {"normalization_rule_name": normalization_rule_name}
        if normalization_rule_name == "whitespace_only":  # a custom rule table (sentencepiece's TSV, hex code points)
            tsv = Path(tmp) / "whitespace_only.tsv"
            tsv.write_text("".join(f"{c:X}\t20\n" for c in _WHITESPACE))
            rule = {"normalization_rule_tsv": str(tsv)}
        spm.SentencePieceTrainer.train(
            sentence_iterator=_sentences(texts, max_sentence_bytes),
            model_prefix=str(out / "spiece"),
            vocab_size=vocab_size,
            model_type=model_type,
            **rule,
            character_coverage=character_coverage,
            input_sentence_size=input_sentence_size,
            shuffle_input_sentence=True,
            max_sentence_length=max_sentence_bytes,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=-1,
            eos_id=-1,
            pad_piece="<pad>",
            unk_piece="<unk>",
            control_symbols=["[CLS]", "[SEP]", "[MASK]"],
            num_threads=num_threads,
            byte_fallback=byte_fallback,
            minloglevel=2,
        )


def check_special_ids(sp: spm.SentencePieceProcessor) -> None:
    """Raise ValueError unless ``sp`` has ALBERT's special ids (<pad>=0 <unk>=1 [CLS]=2 [SEP]=3 [MASK]=4)."""
    for piece, expected in SPECIAL_PIECES.items():
        got = sp.piece_to_id(piece)
        if got != expected:
            raise ValueError(f"tokenizer: piece {piece!r} has id {got}, ALBERT needs {expected}")


#: Files of a transformers ALBERT tokenizer directory: the sentencepiece model and transformers' settings.
SPIECE = "spiece.model"
#: transformers 5's own save format of a tokenizer (`tokenizers`' JSON: normaliser, pre-tokeniser, Unigram model):
#: what ``AlbertTokenizer.from_pretrained(...).save_pretrained(dir)`` writes, with no spiece.model beside it.
TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"


@dataclass(frozen=True)
class TextPreprocessing:
    """transformers' ALBERT text preprocessing before sentencepiece (tokenizer_config.json's keys). The defaults
    are transformers' `AlbertTokenizer` defaults, which a directory whose tokenizer_config.json omits a key gets
    (the hub's albert-base-v2: lower-cased, accents stripped)."""

    do_lower_case: bool = True
    """Lower-case the text."""
    keep_accents: bool = False
    """False: NFKD, then drop the combining marks (category Mn), so "é" becomes "e"."""
    remove_space: bool = True
    """Strip the text and collapse runs of whitespace (sentencepiece's nmt_nfkc does it too)."""

    def apply(self, text: str) -> str:
        """`text` as transformers' AlbertTokenizer hands it to sentencepiece (transformers 4's
        ``preprocess_text``; transformers 5's normalizer sequence Replace, NFKD + StripAccents, Lowercase)."""
        if self.remove_space:
            text = " ".join(text.strip().split())
        text = text.replace("``", '"').replace("''", '"')
        if not self.keep_accents:
            text = "".join(c for c in unicodedata.normalize("NFKD", text) if unicodedata.category(c) != "Mn")
        return text.lower() if self.do_lower_case else text


def read_preprocessing(model_dir: str | Path) -> TextPreprocessing:
    """The preprocessing a transformers tokenizer directory asks for (its tokenizer_config.json, transformers'
    defaults for keys it lacks or without one). Raises ValueError for a tokenizer_config.json that is not JSON."""
    path = Path(model_dir) / TOKENIZER_CONFIG
    try:
        data = json.loads(path.read_text()) if path.is_file() else {}
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not JSON ({err})") from None
    keys = TextPreprocessing.__dataclass_fields__
    return TextPreprocessing(**{k: bool(data[k]) for k in keys if k in data})


class PreprocessingSentencePiece(spm.SentencePieceProcessor):
    """A sentencepiece model whose `encode` first applies a `TextPreprocessing` (a transformers tokenizer
    directory's settings), so its ids equal ``AutoTokenizer.from_pretrained(directory)``'s; None: the text as
    given (a sentencepiece file: its own normaliser only, as albert-dist's exports tell transformers)."""

    preprocessing: Optional[TextPreprocessing] = None

    def _prepare(self, text):
        if self.preprocessing is None:
            return text
        if isinstance(text, str):
            return self.preprocessing.apply(text)
        return [self.preprocessing.apply(t) for t in text]

    def Encode(self, input, *args, **kwargs):  # noqa: N802 - sentencepiece's name; `encode` is its alias
        return super().Encode(self._prepare(input), *args, **kwargs)

    encode = Encode


class TokenizersJSON:
    """A transformers 5 tokenizer directory's ``tokenizer.json`` behind the part of sentencepiece's
    `SentencePieceProcessor` the pipeline uses (`encode`, `piece_to_id`, `id_to_piece`, `get_piece_size`), so it
    is loaded and used where a spiece.model is (`load_tokenizer`): its ids are the `tokenizers` library's for that
    file (its normaliser, pre-tokeniser and Unigram model as saved), i.e. ``AutoTokenizer.from_pretrained(dir)``'s
    without the special tokens transformers adds around them. Needs the `tokenizers` package (the `hf` extra).
    """

    def __init__(self, path: str | Path):
        """Raises ValueError when `path` is not a `tokenizers` JSON (or the package is missing)."""
        try:
            from tokenizers import Tokenizer  # here: only a tokenizer.json needs it
        except ImportError as err:
            raise ValueError(f"tokenizer {str(path)!r} needs the tokenizers package (pip install -e .[hf]): "
                             f"{err}") from None
        self.path = str(path)
        try:
            self._tokenizer = Tokenizer.from_file(self.path)
        except Exception as err:  # noqa: BLE001 - tokenizers raises its own Exception type: one line
            raise ValueError(f"tokenizer {self.path!r} is not a tokenizers JSON: "
                             f"{(str(err).strip().splitlines() or [type(err).__name__])[0]}") from None

    def __getstate__(self) -> dict:
        return {"path": self.path}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"])

    def _one(self, text: str, pieces: bool) -> list:
        found = self._tokenizer.encode(text, add_special_tokens=False)
        return found.tokens if pieces else found.ids

    def encode(self, input, out_type=int, **_) -> list:  # noqa: A002 - sentencepiece's argument names
        """Ids (``out_type=int``) or pieces (``str``) of one text or of each text of a list, no special tokens;
        one text at a time (tokenizers' batch encoding starts threads that a forked loader worker would warn
        about)."""
        pieces = out_type is str
        return self._one(input, pieces) if isinstance(input, str) else [self._one(t, pieces) for t in input]

    def piece_to_id(self, piece):
        """The id of a piece (or of each of a list), <unk>'s for a piece not in the vocabulary."""
        if isinstance(piece, str):
            found = self._tokenizer.token_to_id(piece)
            return UNK_ID if found is None else found
        return [self.piece_to_id(p) for p in piece]

    def id_to_piece(self, index: int) -> str:
        """The piece of id `index`."""
        return self._tokenizer.id_to_token(int(index))

    def get_piece_size(self) -> int:
        """The vocabulary size."""
        return self._tokenizer.get_vocab_size()


def tokenizer_file(path: str | Path) -> Path:
    """The tokenizer file of a tokenizer path: the file itself, or a directory's spiece.model, else its
    tokenizer.json (transformers 5's save format)."""
    path = Path(path)
    if not path.is_dir():
        return path
    if not (path / SPIECE).is_file() and (path / TOKENIZER_JSON).is_file():
        return path / TOKENIZER_JSON
    return path / SPIECE


def copy_tokenizer(path: str | Path, out_dir: str | Path, model_max_length: Optional[int] = None) -> None:
    """Put the tokenizer `path` into the transformers directory `out_dir`: a directory's spiece.model and its
    transformers settings as they are, or written out when it has none (a model started from it keeps its
    source's ids), a sentencepiece file with `write_transformers_config`'s."""
    path, out_dir = Path(path), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if tokenizer_file(path).name == TOKENIZER_JSON:  # transformers 5's format: its files as saved
        for name in (TOKENIZER_JSON, TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP):
            if (path / name).is_file():
                shutil.copyfile(path / name, out_dir / name)
        return
    shutil.copyfile(tokenizer_file(path), out_dir / SPIECE)
    if not path.is_dir():
        write_transformers_config(out_dir, model_max_length)
        return
    for name in (TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP):
        if (path / name).is_file():
            shutil.copyfile(path / name, out_dir / name)
    if not (path / TOKENIZER_CONFIG).is_file():  # transformers' defaults applied to it (the hub's albert-base-v2)
        write_transformers_config(out_dir, model_max_length)
        config = {**json.loads((out_dir / TOKENIZER_CONFIG).read_text()), **vars(read_preprocessing(path))}
        (out_dir / TOKENIZER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")


def load_tokenizer(path: str) -> spm.SentencePieceProcessor:
    """Load a sentencepiece model (relative paths resolved as in the data config) and check ALBERT's ids.

    `path` is a sentencepiece model file (encoded with its own normaliser only), or a transformers tokenizer
    directory (spiece.model + tokenizer_config.json, e.g. a hub ALBERT's or an exported model's): then `encode`
    applies its `TextPreprocessing` first (`PreprocessingSentencePiece`), as transformers does; or a
    ``tokenizer.json`` (a file, or a directory holding one and no spiece.model: transformers 5's save format),
    used as saved through `TokenizersJSON`.

    Raises ValueError when the file is missing, is not a sentencepiece model (e.g. the ``spiece.vocab`` text
    file beside it: sentencepiece's own error is a RuntimeError "could not parse ModelProto") or the special
    ids differ.
    """
    from albert_dist.data.sources.discover import resolve_path

    directory = resolve_path(path) if resolve_path(path).is_dir() else None
    p = tokenizer_file(resolve_path(path))
    if not p.is_file():
        # The config has usually resolved the path already; repeat it only when resolving changed it.
        shown = repr(path) if str(p) == str(path) else f"{path!r} (resolved to {str(p)!r})"
        raise ValueError(f"tokenizer {shown} is not a file")
    if p.name == TOKENIZER_JSON or p.suffix == ".json":
        tokenizer = TokenizersJSON(p)
        check_special_ids(tokenizer)
        return tokenizer
    try:
        sp = PreprocessingSentencePiece(model_file=str(p))
        sp.preprocessing = read_preprocessing(directory) if directory is not None else None
    except RuntimeError as err:
        hint = " (the .vocab file is its text listing: name the .model beside it)" if p.suffix == ".vocab" else ""
        raise ValueError(f"tokenizer {str(p)!r} is not a sentencepiece model{hint}: "
                         f"{str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__}") from None
    check_special_ids(sp)
    return sp
