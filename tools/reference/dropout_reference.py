"""The engine's dropout masks, re-derived in numpy from the descriptions (docs/models.md,
"Dropout"; engine/rng.h's comment), not from the engine's code:

- Philox4x32-10 (Salmon et al., SC'11; Random123's round function and key schedule), checked
  against Random123's known-answer vectors on import;
- a stream (key, offset): word i of a draw is word i % 4 of the block at counter offset + i // 4
  (counter = (offset + i // 4) as two 32-bit words, the upper two counter words 0); a draw of n
  words moves the offset on by ceil(n / 4) blocks;
- keep element i (row-major) iff uniform(word i) >= p, uniform(w) = (w >> 8) / 2^24, and
  y = x * keep / (1 - p); p == 0 (or eval mode) takes no words, p == 1 gives zeros, no words;
- the attention probabilities' dropout (attention's rule, docs/models.md): element i keeps iff
  16-bit halfword i of the draw (halfword i % 8 of block offset + i // 8: word (i % 8) // 2, its
  low 16 bits for even i) is >= ceil(p * 2^16); a site of n elements takes ceil(n / 8) blocks;
- pretraining's stream of rank r for a run seeded s: key s ^ 0x9E3779B97F4A7C15 ^ r *
  0xD1B54A32D192ED03 (mod 2^64), offset 0, continued site after site, micro-batch after
  micro-batch, step after step.
"""
import math

import numpy as np

MASK32 = 0xFFFFFFFF
MASK64 = (1 << 64) - 1
_M0, _M1 = 0xD2511F53, 0xCD9E8D57  # round multipliers
_W0, _W1 = 0x9E3779B9, 0xBB67AE85  # Weyl key increments


def philox4x32_10(ctr, key):
    """ctr: four uint64 arrays (32-bit values) of one shape; key: (k0, k1) ints -> four arrays."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) for c in ctr)
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    m32 = np.uint64(MASK32)
    for r in range(10):
        if r:  # the key is bumped between rounds
            k0 = np.uint64((int(k0) + _W0) & MASK32)
            k1 = np.uint64((int(k1) + _W1) & MASK32)
        p0 = np.uint64(_M0) * c0  # 32 x 32 -> 64 bits: no overflow in uint64
        p1 = np.uint64(_M1) * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & m32,
                          (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & m32)
    return c0, c1, c2, c3


def _self_check():
    kats = [((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
            ((MASK32,) * 4, (MASK32, MASK32), (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
            ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
             (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1))]
    for ctr, key, want in kats:
        # w[0]: NumPy 2 refuses int() of a 1-element array (the device machine's python3)
        got = tuple(int(w[0]) for w in philox4x32_10([np.array([c], np.uint64) for c in ctr], key))
        assert got == want, f"Philox4x32-10 known answer: {got} != {want}"


_self_check()


def pretrain_dropout_key(seed, rank=0):
    return (seed ^ 0x9E3779B97F4A7C15 ^ ((rank * 0xD1B54A32D192ED03) & MASK64)) & MASK64


class DropoutStream:
    """One dropout stream; keep(shape, p) draws the next site's mask."""

    def __init__(self, key, offset=0):
        self.key, self.offset = key & MASK64, offset

    def words(self, n):
        blocks = (n + 3) // 4
        ctr = np.arange(self.offset, self.offset + blocks, dtype=np.uint64)
        zero = np.zeros_like(ctr)
        out = philox4x32_10([ctr & np.uint64(MASK32), ctr >> np.uint64(32), zero, zero],
                            (self.key & MASK32, self.key >> 32))
        self.offset += blocks
        return np.stack(out, axis=1).reshape(-1)[:n]  # block-major, word i % 4 within a block

    def keep(self, shape, p):
        n = int(np.prod(shape))
        uniform = (self.words(n) >> np.uint64(8)).astype(np.float64) / 16777216.0
        return (uniform >= p).reshape(shape)

    def keep16(self, shape, p):
        """Attention's rule: a 16-bit halfword per element, eight a block."""
        n = int(np.prod(shape))
        words = self.words((n + 1) // 2)
        halves = np.stack([words & np.uint64(0xFFFF), words >> np.uint64(16)], axis=1).reshape(-1)
        return (halves[:n] >= np.uint64(math.ceil(p * 65536.0))).reshape(shape)
