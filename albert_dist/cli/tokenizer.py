"""The front end of `albert-dist tokenizer train` (the work: `albert_dist.data.tokenizer.train_tokenizer`).

    albert-dist tokenizer train --input PATH [PATH ...] --vocab-size N [--model-type unigram|bpe] --output DIR

Exit codes: 0, or 2 (one line) for missing or unreadable input.
"""
from __future__ import annotations

import argparse
import time

from albert_dist.sizes import parse_byte_size, peak_rss_bytes
from albert_dist.exit_codes import EXIT_OK


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``train`` and its sentencepiece options (defaults from `albert_dist.data.tokenizer`)."""
    from albert_dist.data.tokenizer import BYTE_FALLBACK_DEFAULT, DEFAULT_SAMPLE_BYTES, NORMALIZATIONS

    sub = parser.add_subparsers(dest="subcommand", metavar="{train}")
    train = sub.add_parser("train", help="train spiece.model with ALBERT's special ids")
    # extend, not the default store: `--input A --input B` (as `data prepare` takes it) must train on both, not
    # silently on B alone
    train.add_argument("--input", nargs="+", action="extend", required=True,
                       help="files, directories or globs (txt/jsonl/parquet, .gz/.zst); repeatable")
    train.add_argument("--vocab-size", type=int, required=True)
    train.add_argument("--model-type", choices=("unigram", "bpe"), default="unigram")
    train.add_argument("--output", required=True, help="output directory for spiece.model and spiece.vocab")
    train.add_argument("--lowercase", action="store_true", help="case-fold (ALBERT's uncased models)")
    train.add_argument("--sample-bytes", type=parse_byte_size, default=DEFAULT_SAMPLE_BYTES,
                       help="bytes of text to train on, drawn from every input file (e.g. 64M, 1G; default "
                            f"{DEFAULT_SAMPLE_BYTES // 2**20}M: ~22 bytes of peak memory per byte, see docs/data-tokenizer.md)")
    train.add_argument("--input-sentence-size", type=int, default=0,
                       help="optional extra cap on the sampled sentences (sentencepiece's reservoir); 0 = none")
    train.add_argument("--character-coverage", type=float, default=0.9995)
    train.add_argument("--normalization", choices=NORMALIZATIONS, default="nmt_nfkc",
                       help="nmt_nfkc (default: NFKC, full-width ，：？ become ASCII) or whitespace_only (text as "
                            "written, only Unicode spaces mapped to a space: the Chinese recipe's choice, docs/data-chinese.md)")
    train.add_argument("--text-field", default="text", help="JSON/parquet text column")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--num-threads", type=int, default=1)
    train.add_argument("--byte-fallback", action=argparse.BooleanOptionalAction, default=BYTE_FALLBACK_DEFAULT,
                       help="encode characters outside the vocabulary as UTF-8 byte pieces, not <unk> (off: "
                            "transformers' AlbertTokenizer ignores byte fallback; see docs/data-tokenizer.md)")


def run(args: argparse.Namespace) -> int:
    """Train the tokenizer and print where it went, how long it took and the peak memory; 0.

    Raises:
        ValueError, OSError: missing or unreadable input (exit 2).
    """
    from albert_dist.data.tokenizer import train_tokenizer
    from albert_dist.job.console import configure_logging

    configure_logging(replace=False)
    t0 = time.perf_counter()
    model = train_tokenizer(
        args.input, args.output, args.vocab_size, args.model_type, args.lowercase, args.input_sentence_size,
        args.character_coverage, args.seed, text_field=args.text_field, num_threads=args.num_threads,
        byte_fallback=args.byte_fallback, sample_bytes=args.sample_bytes, normalization=args.normalization,
    )
    # the peak resident memory of this process (sentencepiece trains in-process)
    peak_mib = peak_rss_bytes() / 2**20
    print(f"wrote {model} (vocab {args.vocab_size}, {args.model_type}) in {time.perf_counter() - t0:.1f} s; "
          f"peak memory {peak_mib:.0f} MiB")
    return EXIT_OK
