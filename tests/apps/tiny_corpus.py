"""A small structured corpus and its WordPiece vocabulary, prepared with `pretrain_app prepare`:
shared by the corpus-training tests (standard library only)."""
import os
import random
import subprocess


def make_corpus(app, work, documents=400, seed=5):
    """Writes work/vocab.txt and work/corpus.txt and prepares work/corpus; returns the
    CompletedProcess of `prepare` (the corpus is at work/corpus when it succeeded)."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(300)]
    with open(os.path.join(work, "vocab.txt"), "w") as f:
        f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words + [".", ","]) + "\n")
    with open(os.path.join(work, "corpus.txt"), "w") as f:
        for _ in range(documents):
            for _ in range(rng.randint(1, 4)):
                # sentences with structure: a word tends to follow its predecessor + 1
                start = rng.randrange(300)
                f.write(" ".join(words[(start + k * rng.choice([1, 1, 1, 2])) % 300]
                                 for k in range(rng.randint(4, 20))) + " .\n")
            f.write("\n")
    return subprocess.run([app, "prepare", "--tokenizer", os.path.join(work, "vocab.txt"),
                           "--input", os.path.join(work, "corpus.txt"), "--out", os.path.join(work, "corpus"),
                           "--valid-ratio", "19", "--quiet"], capture_output=True, text=True)
