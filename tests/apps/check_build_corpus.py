#!/usr/bin/python3
"""tools/build_corpus.py on small made-up sources in the real layouts (standard library only):
NLTK-style zips and folders, an aclImdb tar.gz; the corpus's layout rules (a book's blocks joined,
an address's lines, a review's <br />, whitespace collapsed, Latin-1 files, 2005's Bartleby edition,
file-name order, addresses after 2005 left out) against hand-written expected text; --compare
naming the first document that differs; the sha256 check; bad sources named.

The real sources are 100,000 reviews and 133 books and addresses: the test shrinks the expected
counts through the module's constants.

usage: check_build_corpus.py WORKDIR
"""
import contextlib
import io
import os
import shutil
import sys
import tarfile
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import build_corpus as bc  # noqa: E402

work = sys.argv[1]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
P = lambda *a: os.path.join(work, *a)  # noqa: E731

bc.BOOKS = ["austen-emma.txt", "blake-poems.txt"]
bc.IMDB_FOLDERS = [("train/pos", 2), ("train/neg", 1), ("test/pos", 1), ("test/neg", 1), ("train/unsup", 2)]
bc.COUNTS = {"gutenberg": 2, "inaugural": 3, "state_union": 2, "imdb": 7}

# ---- sources -----------------------------------------------------------------------------------
with zipfile.ZipFile(P("gutenberg.zip"), "w") as z:
    z.writestr("gutenberg/austen-emma.txt", "[Emma by Jane Austen 1816]\r\n\r\nVOLUME I\r\n\r\n\r\n"
               "Emma Woodhouse, handsome,\r\nclever, and  rich.\r\n   \r\nShe was\tthe youngest.\r\n")
    z.writestr("gutenberg/blake-poems.txt", "[Poems by William Blake 1789]\n\nPiping down\nthe valleys wild\n")
    z.writestr("gutenberg/carroll-alice.txt", "not one of the thirteen\n")
os.makedirs(P("inaugural"))
for name, text in [("1789-Washington.txt", b"Fellow-Citizens:\n\nAmong  the vicissitudes.\n"),
                   ("1793-Washington.txt", b"Fellow citizens, caf\xe9 \n"),  # Latin-1
                   ("2005-Bush.txt", b"Vice President Cheney:\n  On this day.\nMay God bless you.\n"),
                   ("2009-Obama.txt", b"My fellow citizens.\n"), ("README", b"the corpus\n")]:
    with open(P("inaugural", name), "wb") as f:
        f.write(text)
with zipfile.ZipFile(P("state_union.zip"), "w") as z:
    z.writestr("state_union/1945-Truman.txt", "PRESIDENT TRUMAN'S ADDRESS\n \nApril 16, 1945\n\nMr. Speaker:\nIt is.\n")
    z.writestr("state_union/2006-GWBush.txt", "THE PRESIDENT:  Thank you.\n")
    z.writestr("state_union/README", "the corpus\n")
reviews = {"train/pos": [("0_9.txt", "Bromwell High.<br /><br />A classic."), ("10000_8.txt", "If you like<br/>it.")],
           "train/neg": [("0_3.txt", "Story of a man. <bt><br> A gang.")], "test/pos": [("0_10.txt", "I admit.")],
           "test/neg": [("0_2.txt", "Once again.")], "train/unsup": [("0_0.txt", "Probably one."), ("1_0.txt", "Two.")]}
with tarfile.open(P("aclImdb_v1.tar.gz"), "w:gz") as t:
    for folder, files in reviews.items():
        for name, text in files:
            data = text.encode()
            info = tarfile.TarInfo(f"aclImdb/{folder}/{name}")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    info = tarfile.TarInfo("aclImdb/README")
    info.size = 3
    t.addfile(info, io.BytesIO(b"abc"))

expected = ("[Emma by Jane Austen 1816]\nVOLUME I\nEmma Woodhouse, handsome, clever, and rich.\nShe was the youngest.\n\n"
            "[Poems by William Blake 1789]\nPiping down the valleys wild\n\n"
            "Fellow-Citizens:\nAmong the vicissitudes.\n\n"
            "Fellow citizens, caf\u00e9\n\n"
            "Inaugural Addresses of the Presidents of the United States. 1989.\nGeorge W. Bush\n"
            "Second Inaugural Address\nThursday, January 20, 2005\n"
            "Vice President Cheney: 1\nOn this day. 2\nMay God bless you. 3\n\n"
            "PRESIDENT TRUMAN'S ADDRESS\nApril 16, 1945\nMr. Speaker:\nIt is.\n\n"
            "THE PRESIDENT: Thank you.\n\n"
            "Bromwell High. A classic.\n\nIf you like it.\n\nStory of a man. <bt><br> A gang.\n\n"
            "I admit.\n\nOnce again.\n\nProbably one.\n\nTwo.\n\n")


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    old = sys.argv
    sys.argv = ["build_corpus.py"] + argv
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            bc.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            err.write(str(e.code))
    finally:
        sys.argv = old
    return code, out.getvalue() + err.getvalue()


srcs = ["--gutenberg", P("gutenberg.zip"), "--inaugural", P("inaugural"), "--state-union", P("state_union.zip"),
        "--imdb", P("aclImdb_v1.tar.gz")]
code, text = run(srcs + ["--out", P("corpus.txt"), "--no-check"])
got = open(P("corpus.txt"), encoding="utf-8").read() if os.path.exists(P("corpus.txt")) else ""
check(code == 0 and got == expected, "the corpus from zips, a folder and a tar.gz, in the corpus's layout",
      text + "\n" + repr(got))
check("14 documents" in text and "sha256" in text, "the summary line", text)

# The same from unpacked folders (the tar's top folder found one level down).
with tarfile.open(P("aclImdb_v1.tar.gz")) as t:
    t.extractall(P("unpacked"))
with zipfile.ZipFile(P("gutenberg.zip")) as z:
    z.extractall(P("unpacked"))
code, text = run(["--gutenberg", P("unpacked"), "--inaugural", P("inaugural"), "--state-union", P("state_union.zip"),
                  "--imdb", P("unpacked"), "--out", P("corpus2.txt"), "--no-check"])
check(code == 0 and open(P("corpus2.txt"), encoding="utf-8").read() == expected, "unpacked folders", text)

# The sha256 check: these bytes are not the real corpus.
code, text = run(srcs + ["--out", P("corpus3.txt")])
check(code == 1 and "differs from the corpus of docs/results.md" in text, "the sha256 check", text)

# --compare: all equal, then one document changed.
code, text = run(["--inaugural", P("inaugural"), "--state-union", P("state_union.zip"), "--compare", P("corpus.txt")])
check(code == 0 and "inaugural: 3 of 3 documents equal to" in text and "'s 3-5" in text
      and "state_union: 2 of 2 documents equal" in text, "--compare, two sources", text)
with open(P("changed.txt"), "w", encoding="utf-8") as f:
    f.write(expected.replace("Once again.", "Once more."))
code, text = run(srcs + ["--compare", P("changed.txt")])
check(code == 1 and "imdb: 6 of 7 documents equal; the first that differs is its document 5 (" in text
      and "'s 12)" in text and "gutenberg: 2 of 2" in text, "--compare names the first document that differs", text)

# Bad sources and command lines.
code, text = run(["--inaugural", P("nowhere"), "--compare", P("corpus.txt")])
check(code == 1 and "--inaugural" in text and "no such file or folder" in text, "a missing source", text)
code, text = run(["--gutenberg", P("state_union.zip"), "--compare", P("corpus.txt")])
check(code == 1 and "no austen-emma.txt in the archive (is it the right source?)" in text, "the wrong archive", text)
code, text = run(["--state-union", P("corpus.txt"), "--compare", P("corpus.txt")])
check(code == 1 and "neither a folder, a .zip nor a tar archive" in text, "not an archive", text)
code, text = run(["--inaugural", P("inaugural"), "--out", P("x.txt")])
check(code == 2 and "--out needs all four sources: missing --gutenberg, --state-union, --imdb" in text,
      "--out with missing sources", text)
code, text = run(["--inaugural", P("inaugural"), "--compare", P("nowhere.txt")])
check(code == 1 and "--compare" in text and "cannot read it" in text, "a missing --compare file", text)
code, text = run(srcs + ["--out", P("no_dir", "corpus.txt"), "--no-check"])
check(code == 1 and "--out" in text and "cannot write it" in text, "an --out that cannot be written", text)
bc.IMDB_FOLDERS[0] = ("train/pos", 3)
code, text = run(["--imdb", P("aclImdb_v1.tar.gz"), "--compare", P("corpus.txt")])
check(code == 1 and "train/pos has 2 reviews, expected 3" in text, "a review folder of the wrong size", text)

finish("build_corpus")
