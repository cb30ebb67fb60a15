#!/usr/bin/python3
"""Rebuilds the English pretraining corpus of docs/results.md (combined_en.txt: 100,133 documents,
225,486 lines, sha256 f81f2802...5c53) from its public sources.

usage: build_corpus.py --gutenberg P --inaugural P --state-union P --imdb P --out FILE
       build_corpus.py [any of the four sources] --compare combined_en.txt

Sources (each a .zip / .tar.gz as distributed, or the folder it unpacks to):
  --gutenberg    NLTK's gutenberg corpus (nltk_data packages/corpora/gutenberg.zip): 13 of its 18
                 books, in the order of BOOKS below;
  --inaugural    NLTK's inaugural corpus (packages/corpora/inaugural.zip): the 55 addresses from
                 1789 to 2005, in file-name order;
  --state-union  NLTK's state_union corpus (packages/corpora/state_union.zip): all 65 addresses,
                 1945-2006, in file-name order;
  --imdb         the Large Movie Review Dataset v1.0 (Maas et al. 2011, aclImdb_v1.tar.gz):
                 train/pos, train/neg, test/pos, test/neg, train/unsup, 100,000 reviews, each
                 folder in file-name order.

The layout: one paragraph per line, a blank line after every document, UTF-8. A paragraph has its
whitespace runs collapsed to one space and is stripped; empty paragraphs are dropped. A Gutenberg
book's paragraphs are its blank-line-separated blocks (their lines joined with spaces); an
address's paragraphs are its lines; a review is one paragraph, with "<br />" read as a space.
Files that are not valid UTF-8 are read as Latin-1 (some addresses). One document differs from
NLTK's copy: the corpus's 2005 inaugural address is Bartleby's edition of the same text, with the
edition's four header lines and each paragraph's number after it; the script adds them.

--out writes the corpus and checks its sha256 against the corpus used in docs/results.md (exit 1
when it differs; --no-check skips that). --compare FILE builds the sources given and compares
each of their documents with FILE's at the same place, naming the first that differs.
"""
import argparse
import hashlib
import io
import os
import re
import sys
import tarfile
import zipfile

SHA256 = "f81f28023a931ee82621ff659c2d149fab4a7869312f690bc8d21f0ee18f5c53"
BOOKS = ["austen-emma.txt", "austen-persuasion.txt", "austen-sense.txt", "blake-poems.txt",
         "chesterton-ball.txt", "chesterton-brown.txt", "chesterton-thursday.txt", "melville-moby_dick.txt",
         "milton-paradise.txt", "shakespeare-caesar.txt", "shakespeare-hamlet.txt", "shakespeare-macbeth.txt",
         "whitman-leaves.txt"]
IMDB_FOLDERS = [("train/pos", 12500), ("train/neg", 12500), ("test/pos", 12500), ("test/neg", 12500),
                ("train/unsup", 50000)]
INAUGURAL_LAST_YEAR = 2005
COUNTS = {"gutenberg": len(BOOKS), "inaugural": 55, "state_union": 65, "imdb": 100000}
ORDER = ["gutenberg", "inaugural", "state_union", "imdb"]  # their documents' order in the corpus
BARTLEBY_2005 = ["Inaugural Addresses of the Presidents of the United States. 1989.", "George W. Bush",
                 "Second Inaugural Address", "Thursday, January 20, 2005"]


def fail(msg):
    sys.exit(f"build_corpus: {msg}")


class Source:
    """A .zip, a .tar.gz or a folder, read by relative path (its top folder found by a member); a
    tar's files are read into memory in one pass (aclImdb: ~130 MB)."""

    def __init__(self, path, flag, probe):
        self.path, self.flag = path, flag
        if not os.path.exists(path):
            fail(f"{flag} {path}: no such file or folder")
        self.kind = "dir" if os.path.isdir(path) else None
        if self.kind is None:
            if zipfile.is_zipfile(path):
                self.kind, self.archive = "zip", zipfile.ZipFile(path)
                names = self.archive.namelist()
            else:
                # One sequential pass keeps every file's bytes: reading 100,000 reviews in file-name
                # order from a .tar.gz would seek backwards, and each backward seek decompresses
                # the stream again from its start.
                try:
                    self.kind, self.members = "tar", {}
                    with tarfile.open(path, "r|*") as archive:
                        for m in archive:
                            if m.isfile():
                                self.members[m.name] = archive.extractfile(m).read()
                    names = list(self.members)
                except tarfile.TarError:
                    fail(f"{flag} {path}: neither a folder, a .zip nor a tar archive")
            if self.kind == "zip":
                self.members = {n: n for n in names if not n.endswith("/")}
            hits = [n for n in self.members if n == probe or n.endswith("/" + probe)]
            if not hits:
                fail(f"{flag} {path}: no {probe} in the archive (is it the right source?)")
            self.root = hits[0][: len(hits[0]) - len(probe)]
        else:
            found = None
            for cand in [path] + [os.path.join(path, d) for d in sorted(os.listdir(path))
                                  if os.path.isdir(os.path.join(path, d))]:
                if os.path.exists(os.path.join(cand, probe)):
                    found = cand
                    break
            if found is None:
                fail(f"{flag} {path}: no {probe} in this folder or one level below (is it the right source?)")
            self.root = found

    def list(self, folder):
        if self.kind == "dir":
            d = os.path.join(self.root, folder)
            if not os.path.isdir(d):
                fail(f"{self.flag} {self.path}: no folder {folder}")
            return sorted(n for n in os.listdir(d) if os.path.isfile(os.path.join(d, n)))
        prefix = self.root + (folder.strip("/") + "/" if folder else "")
        return sorted(n[len(prefix):] for n in self.members if n.startswith(prefix) and "/" not in n[len(prefix):])

    def read(self, rel):
        if self.kind == "dir":
            p = os.path.join(self.root, rel)
            if not os.path.isfile(p):
                fail(f"{self.flag} {self.path}: no {rel}")
            with open(p, "rb") as f:
                return f.read()
        name = self.root + rel
        if name not in self.members:
            fail(f"{self.flag} {self.path}: no {rel} in the archive")
        if self.kind == "zip":
            return self.archive.read(name)
        return self.members[name]


def text_of(raw):
    try:
        t = raw.decode("utf-8")
    except UnicodeDecodeError:
        t = raw.decode("latin-1")
    return t.replace("\r\n", "\n").replace("\r", "\n")


def clean(s):
    return re.sub(r"\s+", " ", s).strip()


def blocks(text):
    """Blank-line-separated blocks, each joined into one paragraph."""
    out, cur = [], []
    for line in text.split("\n"):
        if line.strip():
            cur.append(line)
        elif cur:
            out.append(clean(" ".join(cur)))
            cur = []
    if cur:
        out.append(clean(" ".join(cur)))
    return [p for p in out if p]


def lines(text):
    return [p for p in (clean(line) for line in text.split("\n")) if p]


def gutenberg(src):
    return [blocks(text_of(src.read(b))) for b in BOOKS]


def inaugural(src):
    names = [n for n in src.list("") if re.fullmatch(r"\d{4}-.*\.txt", n) and int(n[:4]) <= INAUGURAL_LAST_YEAR]
    docs = []
    for n in names:
        paras = lines(text_of(src.read(n)))
        if n == "2005-Bush.txt":  # Bartleby's edition: its header, and each paragraph numbered
            paras = BARTLEBY_2005 + [f"{p} {k}" for k, p in enumerate(paras, 1)]
        docs.append(paras)
    return docs


def state_union(src):
    return [lines(text_of(src.read(n))) for n in src.list("") if n.endswith(".txt") and n != "README"]


def imdb(src):
    docs = []
    for folder, count in IMDB_FOLDERS:
        names = [n for n in src.list(folder) if n.endswith(".txt")]
        if len(names) != count:
            fail(f"--imdb {src.path}: {folder} has {len(names)} reviews, expected {count}")
        for n in names:
            review = clean(re.sub(r"<br\s*/>", " ", text_of(src.read(folder + "/" + n))))
            docs.append([review] if review else [])
    return docs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gutenberg")
    ap.add_argument("--inaugural")
    ap.add_argument("--state-union")
    ap.add_argument("--imdb")
    ap.add_argument("--out", help="write the corpus here (needs all four sources)")
    ap.add_argument("--compare", metavar="FILE", help="compare the sources given with FILE's documents")
    ap.add_argument("--no-check", action="store_true", help="with --out: do not check the sha256")
    args = ap.parse_args()
    given = {"gutenberg": args.gutenberg, "inaugural": args.inaugural, "state_union": args.state_union,
             "imdb": args.imdb}
    if not args.out and not args.compare:
        ap.error("give --out FILE, --compare FILE, or both")
    if args.out and not all(given.values()):
        ap.error("--out needs all four sources: missing " +
                 ", ".join("--" + k.replace("_", "-") for k, v in given.items() if not v))
    if not any(given.values()):
        ap.error("give at least one source")

    probes = {"gutenberg": BOOKS[0], "inaugural": "1789-Washington.txt", "state_union": "1945-Truman.txt",
              "imdb": "train/pos/0_9.txt"}
    builders = {"gutenberg": gutenberg, "inaugural": inaugural, "state_union": state_union, "imdb": imdb}
    parts = {}
    for k in ORDER:
        if given[k]:
            docs = builders[k](Source(given[k], "--" + k.replace("_", "-"), probes[k]))
            if len(docs) != COUNTS[k]:
                fail(f"--{k.replace('_', '-')} {given[k]}: {len(docs)} documents, expected {COUNTS[k]}")
            parts[k] = docs

    status = 0
    if args.compare:
        try:
            with open(args.compare, encoding="utf-8", errors="strict") as f:
                ref = f.read().split("\n\n")[:-1]
        except (OSError, UnicodeDecodeError) as e:
            fail(f"--compare {args.compare}: cannot read it as UTF-8 text ({e})")
        start = 0
        for k in ORDER:
            if k in parts:
                mine = ["\n".join(d) for d in parts[k]]
                theirs = ref[start:start + len(mine)]
                bad = [i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b] + \
                      list(range(len(theirs), len(mine)))
                if bad:
                    i = bad[0]
                    status = 1
                    print(f"{k}: {len(mine) - len(bad)} of {len(mine)} documents equal; the first that differs is "
                          f"its document {i + 1} ({args.compare}'s {start + i + 1}): "
                          f"{(mine[i][:80])!r} against {(theirs[i][:80] if i < len(theirs) else '<none>')!r}")
                else:
                    print(f"{k}: {len(mine)} of {len(mine)} documents equal to {args.compare}'s {start + 1}-"
                          f"{start + len(mine)}")
            start += COUNTS[k]

    if args.out:
        text = "".join("\n".join(d) + "\n\n" for k in ORDER for d in parts[k])
        data = text.encode("utf-8")
        try:
            with open(args.out, "wb") as f:
                f.write(data)
        except OSError as e:
            fail(f"--out {args.out}: cannot write it ({e})")
        digest = hashlib.sha256(data).hexdigest()
        n_docs = sum(len(parts[k]) for k in ORDER)
        print(f"wrote {args.out}: {n_docs} documents, {text.count(chr(10))} lines (the blank ones too), "
              f"{len(text.split())} words, sha256 {digest}")
        if not args.no_check:
            if digest != SHA256:
                print(f"build_corpus: {args.out} differs from the corpus of docs/results.md (sha256 {SHA256}); "
                      "check the sources' versions (--compare names the first document that differs)",
                      file=sys.stderr)
                status = 1
            else:
                print("the same bytes as the corpus of docs/results.md")
    sys.exit(status)


if __name__ == "__main__":
    main()
