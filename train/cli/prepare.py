"""`python -m train prepare --source S --out DIR [--vocab-size V]`: a tokenizer (byte, or a
trained BPE) and pre-tokenised ArrayRecord shards."""

from __future__ import annotations

import sys
from pathlib import Path

from train.cli import UserError
from train.cli.common import non_negative_int, positive_int
from train.data.sources import resolve_source, write_arrayrecord_shards
from train.data.tokenizer import ByteTokenizer, train_bpe


def add_prepare_command(commands) -> None:
    sub = commands.add_parser("prepare", help="tokenizer + pre-tokenised ArrayRecord shards",
                              description="tokenizer + pre-tokenised ArrayRecord shards")
    sub.add_argument("--source", default="stdlib",
                     help="stdlib, a directory or a glob (default: %(default)s)")
    sub.add_argument("--out", required=True, help="output directory")
    sub.add_argument("--vocab-size", type=non_negative_int, default=0,
                     help="train a byte-level BPE of this size (default: %(default)s, the byte "
                          "tokenizer)")
    sub.add_argument("--num-shards", type=positive_int, default=4,
                     help="ArrayRecord shards to write (default: %(default)s)")
    sub.add_argument("--max-documents", type=positive_int, default=None,
                     help="read at most this many documents (default: all)")
    sub.set_defaults(handler=command_prepare)


def command_prepare(args) -> int:
    """Every ValueError (and an existing manifest) here is about the user's --source, --out or
    sizes: raised as a one-line UserError."""
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out: {out} is a file, expected a directory")
    try:
        if args.vocab_size:
            corpus = resolve_source(args.source, max_documents=args.max_documents)
            if not hasattr(corpus, "relative_paths"):
                raise ValueError(f"--source: BPE training needs a text source, got "
                                 f"{args.source!r}")
            files = [Path(corpus.root) / p for p in corpus.relative_paths]
            tokenizer = train_bpe(files, args.vocab_size)
        else:
            tokenizer = ByteTokenizer()
        shards = write_arrayrecord_shards(source=args.source, tokenizer=tokenizer, out_dir=out,
                                          num_shards=args.num_shards,
                                          max_documents=args.max_documents)
    except (ValueError, FileExistsError) as error:
        raise UserError(str(error)) from error
    if args.vocab_size and tokenizer.vocab_size < args.vocab_size:
        print(f"note: the tokenizer has {tokenizer.vocab_size} entries, fewer than --vocab-size "
              f"{args.vocab_size}: BPE adds a merge only for a pair of adjacent tokens seen at "
              f"least twice, and the text had no more such pairs (more text gives more)",
              file=sys.stderr, flush=True)
    print(f"wrote {len(shards)} shards and the tokenizer ({tokenizer!r}) to {out}\n"
          f"use: data.source=arrayrecord:{out} data.tokenizer={out / 'tokenizer'}")
    return 0
