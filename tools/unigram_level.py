#!/usr/bin/python3
"""The masked-LM loss of a model that knows nothing but token frequencies (the unigram level), on
a run's validation batches: the cross-entropy of the predicted tokens' frequencies in the run's
training batches (add-one-half smoothing) over the validation batches' predicted tokens. Reads what
`pretrain_app --export-batches DIR` wrote (numpy only).

usage: unigram_level.py DIR
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference"))
import safetensors_io as st  # noqa: E402


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    d = sys.argv[1]
    for name in ("train.safetensors", "valid.safetensors", "init.safetensors"):
        if not os.path.exists(os.path.join(d, name)):
            sys.exit(f"unigram_level.py: {os.path.join(d, name)}: missing (pretrain_app --export-batches)")
    train, _ = st.read(os.path.join(d, "train.safetensors"))
    valid, _ = st.read(os.path.join(d, "valid.safetensors"))
    vocab = st.read(os.path.join(d, "init.safetensors"))[0]["bert.embeddings.token"].shape[0]
    t = train["labels"].numpy().ravel()
    t = t[t != -100]
    v = valid["labels"].numpy().ravel()
    v = v[v != -100]
    p = np.bincount(t, minlength=vocab) + 0.5
    p /= p.sum()
    print(f"unigram level: {-np.log(p[v]).mean():.4f} nats over {v.size} predicted validation tokens "
          f"(frequencies of {t.size} predicted training tokens, vocabulary {vocab})")


if __name__ == "__main__":
    main()
