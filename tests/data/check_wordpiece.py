#!/usr/bin/env python3
"""Checks the engine's WordPiece (build/bin/tokenize) against the reference port of
google-research/bert's tokenizer (tools/reference/wordpiece_reference.py).

Writes a vocab and ~250 generated lines into --workdir (fixed tricky cases; random mixes of
words, accented and upper-case Latin/Greek/Cyrillic, CJK, Hangul, kana, combining marks,
controls, format characters, every kind of Unicode whitespace, punctuation runs, emoji, private
use, 4-byte characters, over-long words and random bytes — invalid UTF-8 included), then
tokenizes them with the CLI and with the reference (uncased, cased, and uncased with
max_input_chars_per_word 200), pieces and ids. Exit 0 when every line is identical, 1 with the
first differences printed otherwise.

Random characters come from blocks whose properties did not change between Unicode 14 and 15,
and code points unassigned in this Python's unicodedata are skipped: ICU (the engine) and
unicodedata (the reference) may be built on different Unicode versions, and a character that
only one of them knows may legitimately be classified differently.
"""
import argparse
import importlib.util
import os
import random
import subprocess
import sys
import unicodedata

SEED = 20240611

FIXED = [
    "Héllo Wörld", "naïve café", "中文字符 mixed", "\x01a\x7fb", "zero\u200bwidth",
    "tab\tnew\nline\rret", "no\u00a0break", "wow!!!...", "Dr.Smith's", "state-of-the-art",
    "unaffable", "UNAFFABLE affable", "", "   ", "ΟΔΥΣΣΕΥΣ Άθήνα", "МОСКВА Ёлка", "İstanbul ΣΑΣ",
    "straße STRASSE ẞ", "ﬁne ﬂow", "\u2126 \u212b \u212a", "a\u0301\u0302 \u0301 x\u0308y", "e\u037Ef\u1FEFg",
    "\u2028para\u2029graph\u0085next", "\ufeffbom\u00adsoft", "x" * 101, "a" * 100, "b" * 150,
    "$5.00 ^caret `tick` ~tilde", "«quotes» „low“ ‘single’", "日本語のテキスト", "한국어 텍스트",
    "\U0001F600 emoji\U0001F44D\U0001F3FD", "\U00010400\U00010428 deseret", "\ue000private\uf8ff",
    "tag\U000E0041\U000E007F", "Ꭰꭰ cherokee", "Ა georgian", "\u3000ideo\u3000space",
    "ＦＵＬＬ１２３！", "\u0130\u0049\u0131",
]

# (first, last) code points of blocks stable between Unicode 14 and 15.
BLOCKS = [
    (0x0020, 0x007E), (0x00A0, 0x00FF), (0x0100, 0x024F), (0x0300, 0x036F), (0x0370, 0x03FF),
    (0x0400, 0x04FF), (0x0590, 0x05FF), (0x0600, 0x06FF), (0x0900, 0x097F), (0x0E00, 0x0E7F),
    (0x10A0, 0x10FF), (0x13A0, 0x13FF), (0x1E00, 0x1EFF), (0x1F00, 0x1FFF), (0x2000, 0x206F),
    (0x20A0, 0x20BF), (0x2100, 0x214F), (0x2190, 0x21FF), (0x3000, 0x303F), (0x3040, 0x30FF),
    (0x3400, 0x3420), (0x4E00, 0x9FA5), (0xAB70, 0xABBF), (0xAC00, 0xD7A3), (0xE000, 0xE0FF),
    (0xF900, 0xFA2D), (0xFB00, 0xFB4F), (0xFE00, 0xFE0F), (0xFE30, 0xFE4F), (0xFF00, 0xFFEF),
    (0xFFF9, 0xFFFD), (0x10400, 0x1044F), (0x1F300, 0x1F64F), (0x20000, 0x20100),
    (0x2F800, 0x2F8FF), (0xE0001, 0xE007F),
]
SPACES = ["\t", "\n", "\r", "\x0b", "\x0c", "\x1c", "\x1f", "\x85", "\xa0", "\u1680", "\u2000",
          "\u2007", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\u200b", "\ufeff"]
WORDS = ["the", "affable", "unaffable", "running", "runner", "state", "art", "of", "hello",
         "world", "naive", "cafe", "smith", "straße", "große", "über", "Ελλάδα", "ΣΟΦΙΑ",
         "Москва", "ПРИВЕТ", "ελληνικά", "naïve", "résumé", "Dr", "isn't", "e-mail"]
BAD_BYTES = [b"\x80", b"\xff", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
             b"\xe4\xb8", b"\xf0\x9f\x98", b"\xc3", b"\xfe\xfe", b"\x00"]


def load_reference(path):
  spec = importlib.util.spec_from_file_location("wordpiece_reference", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def random_char(rng):
  while True:
    lo, hi = rng.choice(BLOCKS)
    c = chr(rng.randint(lo, hi))
    if unicodedata.category(c) != "Cn" and c != "\n":
      return c


def random_word(rng):
  kind = rng.random()
  if kind < 0.35:
    w = rng.choice(WORDS)
    return w.upper() if rng.random() < 0.2 else w
  if kind < 0.75:
    return "".join(random_char(rng) for _ in range(rng.randint(1, 8)))
  if kind < 0.85:
    return "".join(rng.choice("!?.,;:'\"-()[]{}«»…—") for _ in range(rng.randint(1, 5)))
  if kind < 0.92:
    return "".join(rng.choice("abcdefghij") for _ in range(rng.choice([99, 100, 101, 150, 200, 201])))
  return rng.choice(WORDS) + "".join(random_char(rng) for _ in range(2))


def generate_lines(rng, n):
  lines = [s.replace("\n", " ").encode("utf-8") for s in FIXED]
  lines += [b"bad\xffbyte", b"\xe4\xb8\xad\xe6", b"caf\xc3", b"\xed\xa0\x80x", b"ok\x00nul"]
  while len(lines) < n:
    parts = []
    for _ in range(rng.randint(0, 12)):
      r = rng.random()
      if r < 0.7:
        parts.append(random_word(rng).encode("utf-8", "surrogatepass"))
      elif r < 0.85:
        parts.append(rng.choice(SPACES).encode("utf-8"))
      elif r < 0.93:
        parts.append(rng.choice(BAD_BYTES))
      else:
        parts.append(bytes(rng.randrange(256) for _ in range(rng.randint(1, 6))))
      parts.append(rng.choice([b" ", b" ", b"", b"  "]))
    lines.append(b"".join(parts).replace(b"\n", b" "))
  return lines


def write_vocab(ref, lines, path, rng):
  """Specials, a few reserved tokens, part of the alphabet, and prefixes/inner pieces of the
  basic tokens of `lines` — so that longest-match, "##" pieces and [UNK] all occur."""
  tokens = ["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  tokens += list("abcdefghijklmnopqrstuvwxyz") + ["##" + c for c in "abcdefghijklm"]
  tokens += ["un", "##aff", "##able", "aff", "able", "state", "of", "the", "art", "-", "'", "!",
             ".", "s", "smith", "dr", "hello", "world", "naive", "cafe", "中", "文", "字", "##ll"]
  chars = set()
  for lower in (True, False):
    basic = ref.BasicTokenizer(do_lower_case=lower)
    for line in lines:
      for tok in basic.tokenize(line):
        chars.update(tok)
        if rng.random() < 0.2:
          tokens.append(tok)
        if rng.random() < 0.5:
          tokens.append(tok[:rng.randint(1, len(tok))])
        if len(tok) > 2 and rng.random() < 0.5:
          a = rng.randint(1, len(tok) - 1)
          tokens.append("##" + tok[a:rng.randint(a + 1, len(tok))])
  # Most single characters, alone and as continuations: words then split down to characters,
  # so that a difference in any one character (ς for σ, say) shows in the pieces.
  for c in sorted(chars):
    if rng.random() < 0.85:
      tokens.append(c)
    if rng.random() < 0.85:
      tokens.append("##" + c)
  body = tokens + ["", "  padded\t", "[UNK]", "the", "\u3000wide\u3000"]  # blank, strip, duplicates
  with open(path, "w", encoding="utf-8", newline="\n") as f:
    f.write("\n".join(body) + "\n")


def run_cli(exe, vocab, flags, data):
  r = subprocess.run([exe, "--vocab", vocab] + flags, input=data, capture_output=True)
  if r.returncode != 0:
    sys.exit("tokenize %s failed (%d): %s" % (" ".join(flags), r.returncode, r.stderr.decode(errors="replace")))
  return r.stdout.decode("utf-8").split("\n")[:-1]


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--tokenize", required=True, help="build/bin/tokenize")
  ap.add_argument("--reference", required=True, help="tools/reference/wordpiece_reference.py")
  ap.add_argument("--workdir", required=True)
  ap.add_argument("--lines", type=int, default=250)
  ap.add_argument("--seed", type=int, default=SEED, help="other seeds for longer manual runs")
  args = ap.parse_args()
  os.makedirs(args.workdir, exist_ok=True)
  ref = load_reference(args.reference)
  rng = random.Random(args.seed)
  lines = generate_lines(rng, args.lines)
  vocab = os.path.join(args.workdir, "vocab.txt")
  write_vocab(ref, lines, vocab, rng)
  data = b"".join(l + b"\n" for l in lines)
  with open(os.path.join(args.workdir, "lines.txt"), "wb") as f:
    f.write(data)
  print("python %s, unicodedata %s; %d lines" % (sys.version.split()[0], unicodedata.unidata_version, len(lines)))

  failures = 0
  stats = {}
  for name, lower, max_chars, flags in [("uncased", True, 100, []), ("cased", False, 100, ["--cased"]),
                                        ("uncased-200", True, 200, ["--max-word-chars", "200"])]:
    full = ref.FullTokenizer(vocab, do_lower_case=lower, max_input_chars_per_word=max_chars)
    expected = [full.tokenize(l) for l in lines]
    got = run_cli(args.tokenize, vocab, flags, data)
    got_ids = run_cli(args.tokenize, vocab, flags + ["--ids"], data)
    if len(got) != len(lines) or len(got_ids) != len(lines):
      print("%s: %d / %d output lines for %d input lines" % (name, len(got), len(got_ids), len(lines)))
      failures += 1
      continue
    bad = 0
    for line, exp, g, gi in zip(lines, expected, got, got_ids):
      exp_ids = " ".join(str(i) for i in full.convert_tokens_to_ids(exp))
      if " ".join(exp) != g or exp_ids != gi:
        bad += 1
        if bad <= 5:
          print("%s MISMATCH on %r\n  reference: %s\n  engine:    %s\n  ids: %s | %s"
                % (name, line, " ".join(exp), g, exp_ids, gi))
    pieces = [p for e in expected for p in e]
    stats[name] = (len(pieces), sum(p.startswith("##") for p in pieces), pieces.count("[UNK]"))
    print("%s: %d/%d lines identical; %d pieces, %d '##' pieces, %d [UNK]"
          % (name, len(lines) - bad, len(lines), *stats[name]))
    failures += bad
  # The generated set must exercise what it claims to.
  n, cont, unk = stats.get("uncased", (0, 0, 0))
  if cont < 50 or unk < 20 or n < 1000:
    print("the generated lines exercise too little: %d pieces, %d '##', %d [UNK]" % (n, cont, unk))
    failures += 1
  if stats.get("uncased") == stats.get("cased"):
    print("cased and uncased tokenizations are indistinguishable")
    failures += 1
  print("OK" if failures == 0 else "FAILED")
  sys.exit(0 if failures == 0 else 1)


if __name__ == "__main__":
  main()
