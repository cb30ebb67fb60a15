#!/usr/bin/python3
"""Turns the GNU Collaborative International Dictionary of English (Debian package dict-gcide,
/usr/share/dictd/gcide.dict.dz) into a pretraining corpus: real English prose (definitions and
quotations from Webster's 1913 and WordNet) that needs no network beyond the Debian archive.

Output format (what `pretrain_app prepare` reads): one paragraph per line, a blank line between
documents. Each dictionary entry becomes a document; each sense or paragraph one line. Markup is
removed: pronunciations (\\Ab*do"men\\), {braces}, [1913 Webster] source tags.

usage: gcide_corpus.py OUT.txt [--max-mb N] [--dict PATH]
"""
import argparse
import gzip
import re
import sys

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("out")
ap.add_argument("--max-mb", type=float, default=0, help="stop after this many MB of output (0 = all)")
ap.add_argument("--dict", default="/usr/share/dictd/gcide.dict.dz")
args = ap.parse_args()

try:
    src = gzip.open(args.dict, "rt", encoding="utf-8", errors="replace")  # dictzip is gzip
except OSError as e:
    sys.exit(f"gcide_corpus: cannot read {args.dict}: {e} (apt-get install dict-gcide)")

SOURCE_TAG = re.compile(r"\[(?:1913 Webster|WordNet 1\.5|PJC|Webster 1913 Suppl\.|[^\]]{0,30}Webster[^\]]{0,20})\]")
PRON = re.compile(r"\\[^\\\n]*\\")
BRACES = re.compile(r"[{}]")
SPACES = re.compile(r"\s+")
limit = int(args.max_mb * 1e6) if args.max_mb > 0 else None
written = docs = 0
started = False


def clean(text):
    text = SOURCE_TAG.sub("", text)
    text = PRON.sub("", text)
    text = BRACES.sub("", text)
    return SPACES.sub(" ", text).strip()


with open(args.out, "w", encoding="utf-8") as out:
    doc, para = [], []

    def flush_para():
        if para:
            line = clean(" ".join(para))
            if len(line) > 1:
                doc.append(line)
            para.clear()

    def flush_doc():
        global written, docs
        flush_para()
        if len(doc) >= 1 and sum(len(x) for x in doc) > 40:
            block = "\n".join(doc) + "\n\n"
            out.write(block)
            written += len(block)
            docs += 1
        doc.clear()

    for raw in src:
        line = raw.rstrip("\n")
        if not started:  # skip the database header and licence: start at the first headword
            started = bool(re.match(r"^[A-Za-z][^\\]*\\[^\\]+\\", line))
            if not started:
                continue
        if not line.strip():
            flush_para()
            continue
        if not line[0].isspace():  # a headword line starts a new entry
            flush_doc()
            para.append(line)
            continue
        if re.match(r"\s+\d+\.\s", line) or re.match(r"\s+\(\w\)\s", line):
            flush_para()  # a numbered sense starts a new paragraph
        para.append(line.strip())
        if limit and written >= limit:
            break
    flush_doc()
print(f"gcide_corpus: {docs} documents, {written / 1e6:.1f} MB -> {args.out}")
