"""Configuration of the pretraining data pipeline: corpora, tokenizer, ALBERT example creation, loading.

Both dataclasses are OmegaConf structured configs (int/float/str/bool/Literal/Optional/list fields) and validate in
``__post_init__`` without mutating themselves. Relative paths are resolved at load time, first against the
current directory and then against the repository root, so the defaults (the bundled WikiText-2 sample in
``data/sample/``) work from any working directory of a source checkout.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional, get_args

from albert_dist.on_resume import APPLIES, QUIET, RESTART_STREAMS, on_resume

#: source formats understood by :mod:`albert_dist.data.sources.discover`; "auto" picks one from the file suffix.
SourceFormat = Literal["auto", "txt", "jsonl", "parquet", "hub"]
FORMATS: tuple[str, ...] = get_args(SourceFormat)
#: how a ``.txt`` file is cut into documents.
TxtDocuments = Literal["blank_line", "file"]
TXT_DOCUMENTS: tuple[str, ...] = get_args(TxtDocuments)
#: where Chinese words come from for whole-word masking (albert_dist.data.text.load_chinese_segmenter).
ChineseSegmentation = Literal["none", "jieba"]
CHINESE_SEGMENTATIONS: tuple[str, ...] = get_args(ChineseSegmentation)


@dataclass
class SourceConfig:
    """One corpus: local files (paths, directories, globs) or one hub dataset, mixed with others by ``weight``."""

    paths: list[str] = field(default_factory=list)
    """Files, directories (all files inside, recursively) or globs; for format "hub": one dataset name."""
    format: SourceFormat = "auto"
    """"auto" (from the suffix: .txt, .jsonl/.json, .parquet, each optionally .gz/.zst), txt, jsonl, parquet, hub."""
    text_field: str = "text"
    """Column / JSON key holding the document text (jsonl, parquet, hub)."""
    txt_documents: TxtDocuments = "blank_line"
    """.txt files: "blank_line" = documents separated by blank lines (a line of up to 16 spaces/tabs/CRs is blank),
    "file" = one document per file."""
    weight: float = 1.0
    """Relative sampling weight when several sources are mixed (normalised over the list)."""
    hub_config: Optional[str] = None
    """format "hub": the dataset configuration name (``load_dataset(path, name=...)``)."""
    hub_split: str = "train"
    """format "hub": the split to stream."""
    hub_data_files: list[str] = field(default_factory=list)
    """format "hub": ``data_files`` for a builder dataset (e.g. paths "json" + these files); empty = none."""

    def __post_init__(self) -> None:
        # Messages name the bare field: a source does not know where it sits in the recipe, and
        # albert_dist.config.load_config prefixes the path of the one that failed (data.train[0].paths ...).
        if not self.paths:
            raise ValueError(f"paths must list at least one path, got {self.paths!r}")
        if any(not isinstance(p, str) or not p for p in self.paths):
            raise ValueError(f"paths must be non-empty strings, got {self.paths!r}")
        if self.format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {self.format!r}")
        if self.format == "hub" and len(self.paths) != 1:
            raise ValueError(f"paths must hold exactly one dataset name for format 'hub', got {self.paths!r}")
        if self.txt_documents not in TXT_DOCUMENTS:
            raise ValueError(f"txt_documents must be one of {TXT_DOCUMENTS}, got {self.txt_documents!r}")
        if not self.text_field:
            raise ValueError(f"text_field must be non-empty, got {self.text_field!r}")
        if not self.weight > 0:
            raise ValueError(f"weight must be > 0, got {self.weight!r}")


def _default_train() -> list[SourceConfig]:
    return [SourceConfig(paths=["data/sample/wikitext-2-train-*.txt"])]


def _default_validation() -> list[SourceConfig]:
    return [SourceConfig(paths=["data/sample/wikitext-2-validation.txt"])]


def masking_budget(candidates, rate: float, cap: Optional[int] = None):
    """Tokens masked in a row of `candidates` maskable tokens (every token but [CLS] and the two [SEP]s):
    round(rate x candidates) (half to even), at least 1, at most `cap` (`max_predictions_per_seq`; None: no cap).
    BERT's and ALBERT's ``num_to_predict`` (create_pretraining_data.py), the one formula the pipeline
    (`albert_dist.data.pretraining`), the cap note and the memory estimate use.

    `candidates`: an int (returns an int) or an integer numpy array (one budget per row, int64, same shape).
    """
    if isinstance(candidates, int):
        budget = max(1, round(rate * candidates))
        return budget if cap is None else min(cap, budget)
    import numpy as np

    budget = np.maximum(1, np.round(candidates * rate).astype(np.int64))
    return budget if cap is None else np.minimum(cap, budget)


#: The fixed validation set's fields (built once per job from the current config).
_VALIDATION_SET = on_resume(APPLIES, "validates on the new fixed validation set")


@dataclass
class DataConfig:
    """Corpora, tokenizer and ALBERT pretraining-example settings (names from ALBERT's create_pretraining_data)."""

    train: list[SourceConfig] = field(default_factory=_default_train, metadata=on_resume(RESTART_STREAMS))
    """Training corpora; cycled forever, a new shuffle seed every epoch."""
    validation: list[SourceConfig] = field(default_factory=_default_validation,
                                           metadata=on_resume(APPLIES, "validates on the new sources"))
    """Validation corpora: the fixed validation set is their first ``eval_examples`` examples (file order)."""
    tokenizer_path: str = field(default="data/sample/spiece.model", metadata=on_resume(RESTART_STREAMS))
    """sentencepiece model with ALBERT's special ids, or a transformers tokenizer directory (spiece.model and the
    tokenizer_config.json whose lower-casing / accent stripping is applied first; or transformers 5's tokenizer.json,
    used as saved; see albert_dist.data.tokenizer)."""
    max_seq_length: int = field(default=512, metadata=on_resume(RESTART_STREAMS))
    """Tokens per example including [CLS] and two [SEP]; every batch is padded to exactly this length."""
    short_seq_prob: float = field(default=0.1, metadata=on_resume(RESTART_STREAMS))
    """Probability that an example targets a random shorter length in [2, max_seq_length - 3] (ALBERT: 0.1)."""
    masked_lm_prob: float = field(default=0.15, metadata=on_resume(RESTART_STREAMS))
    """Fraction of the (non-special) tokens to mask (ALBERT: 0.15)."""
    max_predictions_per_seq: int = field(default=20, metadata=on_resume(RESTART_STREAMS))
    """Cap on masked tokens per example (ALBERT: 20 at sequence length 512), training and validation alike. The
    masking budget of a row is min(this, round(rate x its tokens)), so no row exceeds it by construction; the
    model carries exactly ``prediction_slots`` positions per row through its MLM head (static shapes). Where it
    is below ``masked_tokens_asked`` the cap binds and full-length rows mask fewer tokens than the rate asks
    (``masking_cap_note`` says by how much; the trainer logs it)."""
    max_ngram: int = field(default=3, metadata=on_resume(RESTART_STREAMS))
    """Longest masked n-gram in whole words; p(n) proportional to 1/n (ALBERT paper, section 4.1)."""
    whole_word_masking: bool = field(default=True, metadata=on_resume(RESTART_STREAMS))
    """Mask units are whole words (ALBERT); false: single pieces, as transformers' DataCollatorForLanguageModeling."""
    chinese_word_segmentation: ChineseSegmentation = field(default="none", metadata=on_resume(RESTART_STREAMS))
    """Whole words of Chinese text: "none" = every piece holding a CJK character is a word (character-level
    masking); "jieba" = words from the jieba segmenter (rjieba where installed), so a masked word masks all its
    pieces and ``max_ngram`` counts words (albert_zh, Chinese-BERT-wwm). Runs in the loader workers; see
    docs/data-chinese.md."""
    random_token_prob: float = field(default=0.1, metadata=on_resume(RESTART_STREAMS))
    """Of the selected tokens: this fraction gets a random token, as many are kept, the rest become [MASK]."""
    num_workers: int = field(default=2, metadata=on_resume(RESTART_STREAMS))
    """Training DataLoader worker processes per rank (0 = in the training process)."""
    seed: int = field(default=12345, metadata=on_resume(RESTART_STREAMS))
    """Seed of the training stream: shard order, document order, example lengths, SOP swaps and masks."""
    shuffle: bool = field(default=True, metadata=on_resume(RESTART_STREAMS))
    """Shuffle the order of shard pieces and of documents inside each piece, with a new seed every epoch."""
    shuffle_documents: int = field(default=32, metadata=on_resume(RESTART_STREAMS))
    """Training examples are built from this many consecutive documents of a slot at a time and shuffled together
    before batching (only when ``shuffle``), so that a micro batch mixes documents. With 1, a batch holds
    consecutive examples of one document: a WikiText article gives ~35 examples at length 128, so every batch of
    16 came from one article and learning per token was slower (docs/convergence.md). Google's
    create_pretraining_data shuffles all instances of its input; a window keeps memory and the re-reading on
    resume bounded (``shuffle_documents`` x ``max_document_bytes``)."""
    eval_examples: int = field(default=2000, metadata=_VALIDATION_SET)
    """Examples (= SOP pairs) in the fixed validation set: the first this many of one pass over ``validation``
    (fewer, with a warning, when the pass ends first). Built once per job, identical for every world size; each
    rank evaluates a contiguous 1/world of it. The default gives 2000 SOP pairs and ~36k masked tokens at
    max_seq_length 128 on the bundled sample (about ±0.011 SOP and ±0.002 MLM accuracy, one standard error)."""
    eval_masked_lm_prob: float = field(default=0.15, metadata=_VALIDATION_SET)
    """Fraction of the tokens the fixed validation set masks, whatever ``masked_lm_prob`` training uses (BERT's
    and ALBERT's 0.15), so runs that differ in masking rate are scored on the same task. The cap
    ``max_predictions_per_seq`` still applies."""
    eval_seed: int = field(default=1234, metadata=_VALIDATION_SET)
    """Seed of the validation set's example lengths, SOP swaps and masks; independent of ``seed``, so runs that
    differ only in ``seed`` are scored on the same set."""
    shard_piece_bytes: int = field(default=4194304, metadata=on_resume(RESTART_STREAMS))
    """Uncompressed .txt/.jsonl files are split into byte ranges of about this size (units of split and resume)."""
    max_document_bytes: int = field(default=4194304, metadata=on_resume(RESTART_STREAMS))
    """Documents (and JSON lines) longer than this are skipped and counted, never buffered whole."""
    cache_dir: Optional[str] = field(default=None, metadata=on_resume(QUIET))
    """Folder of the node's cache of object-store validation sources (albert_dist.data.sources.cache); None:
    ``$XDG_CACHE_HOME/albert_dist/objects``, else ``~/.cache/albert_dist/objects``."""
    cache_max_bytes: int = field(default=1 << 30, metadata=on_resume(QUIET))
    """Bound of that cache in bytes (least recently used entries evicted); 0 turns it off."""
    store_retry_s: float = field(default=300.0, metadata=on_resume(QUIET))
    """Seconds a read, list or write of an s3:// or gs:// object keeps retrying transient errors (exponential
    back-off with jitter: albert_dist.data.sources.store.RetryPolicy) before giving up; a training job then checkpoints the
    step it reached and exits 75, so ``--resume auto`` continues after the outage."""

    @property
    def prediction_slots(self) -> int:
        """The most masked positions any row can hold: min(max_predictions_per_seq, max_seq_length - 3) ([CLS] and
        two [SEP] are never masked). The model's static MLM gather (`AlbertForPreTraining`'s
        ``max_predictions_per_seq``) uses this many slots per row (plus the first token)."""
        return min(self.max_predictions_per_seq, self.max_seq_length - 3)

    def masked_tokens_asked(self, rate: float) -> int:
        """Tokens masking at ``rate`` asks for in a full-length row (max_seq_length - 3 candidates), before the cap:
        `masking_budget` without its cap."""
        return masking_budget(self.max_seq_length - 3, rate)

    def masking_cap_note(self) -> Optional[str]:
        """None when ``max_predictions_per_seq`` never lowers the masking rate of a full-length row, for training
        (``masked_lm_prob``) and validation (``eval_masked_lm_prob``); otherwise one line saying how many tokens
        such a row masks and how many the rate asks for. ALBERT's published recipe (length 512, rate 0.15, cap
        20) is such a case: 20 of 509 tokens (3.9%); BERT sets the cap near max_seq_length x masked_lm_prob."""
        candidates = self.max_seq_length - 3
        parts = []
        for field_name, rate in (("masked_lm_prob", self.masked_lm_prob),
                                 ("eval_masked_lm_prob", self.eval_masked_lm_prob)):
            asked = self.masked_tokens_asked(rate)
            if asked > self.max_predictions_per_seq:
                parts.append(f"data.{field_name}={rate:g} asks {asked}")
        if not parts:
            return None
        cap = self.max_predictions_per_seq
        return (f"data.max_predictions_per_seq={cap} caps a full-length row ({candidates} maskable tokens at "
                f"data.max_seq_length={self.max_seq_length}) at {cap} masked tokens ({cap / candidates:.1%}) where "
                f"{' and '.join(parts)}; shorter rows mask at the full rate")

    def __post_init__(self) -> None:
        if not self.train:
            raise ValueError(f"data.train must list at least one source, got {self.train!r}")
        if not self.tokenizer_path:
            raise ValueError(f"data.tokenizer_path must be non-empty, got {self.tokenizer_path!r}")
        if self.max_seq_length < 8:
            raise ValueError(f"data.max_seq_length must be >= 8, got {self.max_seq_length}")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ValueError(f"data.short_seq_prob must be in [0, 1], got {self.short_seq_prob}")
        if not 0.0 < self.masked_lm_prob < 1.0:
            raise ValueError(f"data.masked_lm_prob must be in (0, 1), got {self.masked_lm_prob}")
        if self.max_predictions_per_seq < 1:
            raise ValueError(f"data.max_predictions_per_seq must be >= 1, got {self.max_predictions_per_seq}")
        if self.max_ngram < 1:
            raise ValueError(f"data.max_ngram must be >= 1, got {self.max_ngram}")
        if self.chinese_word_segmentation not in CHINESE_SEGMENTATIONS:
            raise ValueError(f"data.chinese_word_segmentation must be one of {CHINESE_SEGMENTATIONS}, "
                             f"got {self.chinese_word_segmentation!r}")
        if not 0.0 <= self.random_token_prob <= 0.5:
            raise ValueError(f"data.random_token_prob must be in [0, 0.5], got {self.random_token_prob}")
        if self.num_workers < 0:
            raise ValueError(f"data.num_workers must be >= 0, got {self.num_workers}")
        if self.shuffle_documents < 1:
            raise ValueError(f"data.shuffle_documents must be >= 1, got {self.shuffle_documents}")
        if not 0.0 < self.eval_masked_lm_prob < 1.0:
            raise ValueError(f"data.eval_masked_lm_prob must be in (0, 1), got {self.eval_masked_lm_prob}")
        if self.eval_examples < 1:
            raise ValueError(f"data.eval_examples must be >= 1, got {self.eval_examples}")
        if self.shard_piece_bytes < 1024:
            raise ValueError(f"data.shard_piece_bytes must be >= 1024, got {self.shard_piece_bytes}")
        if self.max_document_bytes < 16:
            raise ValueError(f"data.max_document_bytes must be >= 16, got {self.max_document_bytes}")
        if self.cache_max_bytes < 0:
            raise ValueError(f"data.cache_max_bytes must be >= 0 (0 turns the cache off), got {self.cache_max_bytes}")
        if not self.store_retry_s > 0:
            raise ValueError(f"data.store_retry_s must be > 0 (seconds), got {self.store_retry_s!r}")
        if self.cache_dir is not None and not self.cache_dir.strip():
            raise ValueError(f"data.cache_dir must be a folder or null (the default), got {self.cache_dir!r}")
