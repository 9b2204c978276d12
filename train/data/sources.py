"""Where documents come from, and their pre-tokenised form.

Sources: "stdlib" (every *.py file of this interpreter's standard library, site-/dist-
packages excluded: real text on every machine; the set depends on the Python version), a
directory (all non-hidden files, recursively), a glob or single file, or
"arrayrecord:<glob or directory>" of shards written by `write_arrayrecord_shards` (one
record per document: int32 little-endian token ids without EOS; `manifest.json` beside the
shards holds the document keys, their token counts, each shard's size in bytes (a shard that
changed since is refused) and the tokenizer fingerprint). Files are read as UTF-8 with
undecodable bytes replaced by U+FFFD; empty files are skipped.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import json
import logging
import os
import sysconfig
from pathlib import Path
from typing import Any


from train.data.tokenizer import Tokenizer

log = logging.getLogger(__name__)


ARRAYRECORD_PREFIX = "arrayrecord:"


MANIFEST_FILENAME = "manifest.json"


RECORD_FORMAT = "int32-le token ids per document, no EOS, v1"


_EXCLUDED_STDLIB_DIRS = {"site-packages", "dist-packages", "__pycache__"}


@dataclasses.dataclass(frozen=True)
class TextCorpus:
    """Text files under `root`; document i is `root / relative_paths[i]`, key = that path."""

    root: str
    relative_paths: tuple[str, ...]

    @property
    def keys(self) -> tuple[str, ...]:
        return self.relative_paths

    def read_text(self, index: int) -> str:
        return (Path(self.root) / self.relative_paths[index]).read_bytes().decode(
            "utf-8", errors="replace"
        )


@dataclasses.dataclass(frozen=True)
class ArrayRecordCorpus:
    """Pre-tokenised ArrayRecord shards; document i is global record i (shards in order)."""

    shard_paths: tuple[str, ...]
    keys: tuple[str, ...]
    tokenizer_fingerprint: str | None  # from manifest.json; None for foreign shards
    lengths: tuple[int, ...] | None = None  # tokens per document (manifest), None: unknown


Corpus = TextCorpus | ArrayRecordCorpus


@functools.cache
def _stdlib_corpus() -> TextCorpus:
    root = sysconfig.get_paths()["stdlib"]
    relative = []
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = [d for d in subdirectories if d not in _EXCLUDED_STDLIB_DIRS]
        for name in files:
            path = os.path.join(directory, name)
            if name.endswith(".py") and os.path.isfile(path) and os.path.getsize(path) > 0:
                relative.append(Path(path).relative_to(root).as_posix())
    return TextCorpus(root, tuple(sorted(relative)))


def _directory_corpus(root: Path) -> TextCorpus:
    relative = []
    for path in root.rglob("*"):
        parts = path.relative_to(root).parts
        if any(part.startswith(".") for part in parts):
            continue
        if path.is_file() and path.stat().st_size > 0:
            relative.append(path.relative_to(root).as_posix())
    return TextCorpus(str(root), tuple(sorted(relative)))


def _glob_corpus(pattern: str) -> TextCorpus:
    matches = [Path(p) for p in glob.glob(pattern, recursive=True)]
    files = [p.resolve() for p in matches if p.is_file() and p.stat().st_size > 0]
    if not files:
        return TextCorpus(str(Path(pattern).parent), ())
    root = Path(os.path.commonpath([str(p.parent) for p in files]))
    return TextCorpus(str(root), tuple(sorted(p.relative_to(root).as_posix() for p in files)))


def _arrayrecord_corpus(spec: str) -> ArrayRecordCorpus:
    from array_record.python.array_record_module import ArrayRecordReader

    pattern = spec[len(ARRAYRECORD_PREFIX):]
    if not glob.has_magic(pattern) and not Path(pattern).exists():
        raise FileNotFoundError(f"source: {spec!r}: {pattern!r} does not exist")
    whole_directory = Path(pattern).is_dir()
    if whole_directory:
        pattern = str(Path(pattern) / "*.arrayrecord")
    shards = sorted(str(Path(p).resolve()) for p in glob.glob(pattern) if Path(p).is_file())
    if not shards:
        raise ValueError(f"source: no ArrayRecord shards match {pattern!r}")
    keys: list[str] = []
    lengths: list[int] | None = []
    fingerprints = set()
    manifests: dict[Path, dict | None] = {}
    for shard in shards:
        directory = Path(shard).parent
        if directory not in manifests:
            manifest_path = directory / MANIFEST_FILENAME
            manifests[directory] = _read_manifest(manifest_path)
        manifest = manifests[directory]
        reader = ArrayRecordReader(shard)
        num_records = reader.num_records()
        reader.close()
        name = Path(shard).name
        if manifest is None:
            log.warning("no %s beside %s: tokenizer compatibility is not checked",
                        MANIFEST_FILENAME, shard)
            fingerprints.add(None)
            keys.extend(f"{name}:{i}" for i in range(num_records))
            lengths = None
            continue
        entry = {s["file"]: s for s in manifest["shards"]}.get(name)
        if entry is None or len(entry["keys"]) != num_records:
            raise ValueError(
                f"source: shard {shard} does not match {directory / MANIFEST_FILENAME} "
                f"(expected {len(entry['keys']) if entry else 'no'} records, got {num_records})"
            )
        size = Path(shard).stat().st_size
        if entry.get("bytes", size) != size:
            raise ValueError(
                f"source: shard {shard} changed after it was written ({size} bytes, "
                f"{directory / MANIFEST_FILENAME} says {entry['bytes']}); re-run prepare")
        fingerprints.add(manifest["tokenizer"]["fingerprint"])
        keys.extend(entry["keys"])
        if lengths is not None and len(entry.get("lengths", ())) == num_records:
            lengths.extend(entry["lengths"])
        else:   # shards written before the manifest kept lengths
            lengths = None
    if whole_directory:     # a glob may choose some shards; a directory means all of them
        directory = Path(shards[0]).parent
        _require_listed_shards(directory, manifests[directory])
    if len(fingerprints) != 1:
        raise ValueError(f"source: shards of {spec!r} come from different tokenizers")
    return ArrayRecordCorpus(tuple(shards), tuple(keys), fingerprints.pop(),
                             tuple(lengths) if lengths is not None else None)


def _require_listed_shards(directory: Path, manifest: dict | None) -> None:
    """FileNotFoundError naming a shard that the directory's manifest lists but is missing."""
    for entry in (manifest or {}).get("shards", ()):
        if not (directory / entry["file"]).is_file():
            raise FileNotFoundError(
                f"source: shard {directory / entry['file']} listed in "
                f"{directory / MANIFEST_FILENAME} does not exist; re-run prepare or restore it")


def _read_manifest(path: Path) -> dict | None:
    """manifest.json beside shards (None when there is none); ValueError naming a bad one."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"source: {path} is not valid JSON ({error})") from None


def resolve_source(source: str, *, max_documents: int | None = None) -> Corpus:
    """The sorted documents of `source` (see module docstring), capped to `max_documents`."""
    if not isinstance(source, str) or not source:
        raise ValueError(f"source: expected a non-empty string, got {source!r}")
    if max_documents is not None and (not isinstance(max_documents, int) or max_documents < 1):
        raise ValueError(f"max_documents: expected None or an int >= 1, got {max_documents!r}")
    if source == "stdlib":
        corpus: Corpus = _stdlib_corpus()
    elif source.startswith(ARRAYRECORD_PREFIX):
        corpus = _arrayrecord_corpus(source)
    elif Path(source).is_dir():
        corpus = _directory_corpus(Path(source).resolve())
    elif not glob.has_magic(source) and not Path(source).exists():
        raise FileNotFoundError(f"source: {source!r} does not exist")
    elif not glob.glob(source, recursive=True):
        raise ValueError(f"source: no file matches {source!r}")
    else:
        corpus = _glob_corpus(source)
    if not corpus.keys:
        raise ValueError(f"source: {source!r} holds no non-empty documents")
    if max_documents is not None:
        if isinstance(corpus, TextCorpus):
            corpus = dataclasses.replace(
                corpus, relative_paths=corpus.relative_paths[:max_documents])
        else:
            corpus = dataclasses.replace(
                corpus, keys=corpus.keys[:max_documents],
                lengths=corpus.lengths[:max_documents] if corpus.lengths else None)
    return corpus


def check_int(name: str, value: Any, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value!r}")


def write_arrayrecord_shards(
    *,
    source: str,
    tokenizer: Tokenizer,
    out_dir: str | os.PathLike,
    num_shards: int,
    max_documents: int | None = None,
) -> list[Path]:
    """Tokenises every document of a text `source` into `num_shards` ArrayRecord files.

    Documents keep their sorted order in contiguous blocks (shard s holds documents
    [s N / S, (s+1) N / S)), so reading the shards back as "arrayrecord:<out_dir>" gives the
    same documents, keys, held-out split and batches as the text source. Writes
    `tokens-SSSSS-of-SSSSS.arrayrecord`, `manifest.json` (keys, tokenizer fingerprint) and the
    tokenizer (`out_dir/tokenizer`). Refuses a directory that already has a manifest.
    Returns the shard paths.
    """
    from array_record.python.array_record_module import ArrayRecordWriter

    check_int("num_shards", num_shards, 1)
    corpus = resolve_source(source, max_documents=max_documents)
    if not isinstance(corpus, TextCorpus):
        raise ValueError(f"source: expected a text source, got {source!r}")
    count = len(corpus.keys)
    if num_shards > count:
        raise ValueError(f"num_shards: {num_shards} exceeds the {count} documents of {source!r}")
    out = Path(out_dir)
    if (out / MANIFEST_FILENAME).exists():
        raise FileExistsError(f"out_dir: {out} already holds shards ({MANIFEST_FILENAME})")
    out.mkdir(parents=True, exist_ok=True)

    shard_entries, paths = [], []
    for shard in range(num_shards):
        start, stop = shard * count // num_shards, (shard + 1) * count // num_shards
        name = f"tokens-{shard:05d}-of-{num_shards:05d}.arrayrecord"
        writer = ArrayRecordWriter(str(out / name), "group_size:1")
        lengths = []
        for index in range(start, stop):
            ids = tokenizer.encode_array(corpus.read_text(index))
            writer.write(ids.astype("<i4").tobytes())
            lengths.append(len(ids))
        writer.close()
        shard_entries.append({"file": name, "keys": list(corpus.keys[start:stop]),
                              "lengths": lengths, "bytes": (out / name).stat().st_size})
        paths.append(out / name)
    tokenizer.save(out / "tokenizer")
    manifest = {
        "format": RECORD_FORMAT,
        "source": source,
        "num_documents": count,
        "tokenizer": {"kind": tokenizer.kind, "vocab_size": tokenizer.vocab_size,
                      "eos_id": tokenizer.eos_id, "fingerprint": tokenizer.fingerprint},
        "shards": shard_entries,
    }
    (out / MANIFEST_FILENAME).write_text(json.dumps(manifest, indent=1) + "\n")
    log.info("wrote %d documents into %d shards in %s", count, num_shards, out)
    return paths
