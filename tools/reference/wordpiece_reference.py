#!/usr/bin/python3
"""The reference WordPiece tokenizer: a port of google-research/bert's tokenization.py.

FullTokenizer = BasicTokenizer (clean text, space out CJK ideographs, whitespace split,
optionally lower-case and strip accents, split off punctuation) + WordpieceTokenizer (greedy
longest-match-first pieces with "##" continuations), with the original's logic kept step for
step and its uses of unicodedata and of str.lower/strip/split unchanged, so that the engine's
data/wordpiece.cpp can be checked against it (tests/data/check_wordpiece.py, and the expected
values in tests/data/test_tokenizer.cpp come from here).

Changes from the original, none of which alters a tokenization:
  * no TensorFlow or six: Python 3 only; the vocab is read with open(..., newline="\\n"), which
    like tf.io.gfile.GFile.readline ends lines at "\\n" only;
  * FullTokenizer takes max_input_chars_per_word (the original's WordpieceTokenizer has a
    default of 200; the engine's default is 100, as in HuggingFace's BertTokenizer);
  * a command-line mode (below) for comparisons.

Original: Copyright 2018 The Google AI Language Team Authors, Apache License 2.0.

Command line: wordpiece_reference.py --vocab VOCAB [--cased] [--max-word-chars N] < lines
prints each stdin line's pieces separated by spaces (lines split at b"\\n"; bytes decoded as the
original's convert_to_unicode does: UTF-8, invalid bytes ignored).
"""
import argparse
import collections
import sys
import unicodedata


def convert_to_unicode(text):
  """Returns `text` as str; bytes are decoded as UTF-8, invalid bytes dropped."""
  if isinstance(text, str):
    return text
  if isinstance(text, bytes):
    return text.decode("utf-8", "ignore")
  raise ValueError("Unsupported string type: %s" % (type(text)))


def load_vocab(vocab_file):
  """Token -> id, the id being the line number; a repeated token keeps its last line."""
  vocab = collections.OrderedDict()
  index = 0
  with open(vocab_file, "r", encoding="utf-8", newline="\n") as reader:
    while True:
      token = convert_to_unicode(reader.readline())
      if not token:
        break
      token = token.strip()
      vocab[token] = index
      index += 1
  return vocab


def convert_by_vocab(vocab, items):
  output = []
  for item in items:
    output.append(vocab[item])
  return output


def whitespace_tokenize(text):
  """Strips and splits on whitespace (Python's notion: str.split())."""
  text = text.strip()
  if not text:
    return []
  return text.split()


class FullTokenizer(object):
  """BasicTokenizer, then WordpieceTokenizer on each of its tokens."""

  def __init__(self, vocab_file, do_lower_case=True, max_input_chars_per_word=100):
    self.vocab = load_vocab(vocab_file)
    self.inv_vocab = {v: k for k, v in self.vocab.items()}
    self.basic_tokenizer = BasicTokenizer(do_lower_case=do_lower_case)
    self.wordpiece_tokenizer = WordpieceTokenizer(
        vocab=self.vocab, max_input_chars_per_word=max_input_chars_per_word)

  def tokenize(self, text):
    split_tokens = []
    for token in self.basic_tokenizer.tokenize(text):
      for sub_token in self.wordpiece_tokenizer.tokenize(token):
        split_tokens.append(sub_token)
    return split_tokens

  def convert_tokens_to_ids(self, tokens):
    return convert_by_vocab(self.vocab, tokens)

  def convert_ids_to_tokens(self, ids):
    return convert_by_vocab(self.inv_vocab, ids)


class BasicTokenizer(object):
  """Punctuation splitting, lower-casing, accent stripping, CJK spacing."""

  def __init__(self, do_lower_case=True):
    self.do_lower_case = do_lower_case

  def tokenize(self, text):
    text = convert_to_unicode(text)
    text = self._clean_text(text)
    text = self._tokenize_chinese_chars(text)
    orig_tokens = whitespace_tokenize(text)
    split_tokens = []
    for token in orig_tokens:
      if self.do_lower_case:
        token = token.lower()
        token = self._run_strip_accents(token)
      split_tokens.extend(self._run_split_on_punc(token))
    output_tokens = whitespace_tokenize(" ".join(split_tokens))
    return output_tokens

  def _run_strip_accents(self, text):
    """NFD, then every non-spacing mark (Mn) dropped."""
    text = unicodedata.normalize("NFD", text)
    output = []
    for char in text:
      cat = unicodedata.category(char)
      if cat == "Mn":
        continue
      output.append(char)
    return "".join(output)

  def _run_split_on_punc(self, text):
    """Every punctuation character becomes a token of its own."""
    chars = list(text)
    i = 0
    start_new_word = True
    output = []
    while i < len(chars):
      char = chars[i]
      if _is_punctuation(char):
        output.append([char])
        start_new_word = True
      else:
        if start_new_word:
          output.append([])
        start_new_word = False
        output[-1].append(char)
      i += 1
    return ["".join(x) for x in output]

  def _tokenize_chinese_chars(self, text):
    """Spaces around every CJK ideograph."""
    output = []
    for char in text:
      cp = ord(char)
      if self._is_chinese_char(cp):
        output.append(" ")
        output.append(char)
        output.append(" ")
      else:
        output.append(char)
    return "".join(output)

  def _is_chinese_char(self, cp):
    """The CJK Unified Ideographs blocks (Hangul and kana are not among them)."""
    if ((cp >= 0x4E00 and cp <= 0x9FFF) or
        (cp >= 0x3400 and cp <= 0x4DBF) or
        (cp >= 0x20000 and cp <= 0x2A6DF) or
        (cp >= 0x2A700 and cp <= 0x2B73F) or
        (cp >= 0x2B740 and cp <= 0x2B81F) or
        (cp >= 0x2B820 and cp <= 0x2CEAF) or
        (cp >= 0xF900 and cp <= 0xFAFF) or
        (cp >= 0x2F800 and cp <= 0x2FA1F)):
      return True
    return False

  def _clean_text(self, text):
    """Drops NUL, U+FFFD and controls; every whitespace character becomes a space."""
    output = []
    for char in text:
      cp = ord(char)
      if cp == 0 or cp == 0xfffd or _is_control(char):
        continue
      if _is_whitespace(char):
        output.append(" ")
      else:
        output.append(char)
    return "".join(output)


class WordpieceTokenizer(object):
  """Greedy longest-match-first WordPiece."""

  def __init__(self, vocab, unk_token="[UNK]", max_input_chars_per_word=200):
    self.vocab = vocab
    self.unk_token = unk_token
    self.max_input_chars_per_word = max_input_chars_per_word

  def tokenize(self, text):
    """E.g. "unaffable" -> ["un", "##aff", "##able"]."""
    text = convert_to_unicode(text)
    output_tokens = []
    for token in whitespace_tokenize(text):
      chars = list(token)
      if len(chars) > self.max_input_chars_per_word:
        output_tokens.append(self.unk_token)
        continue
      is_bad = False
      start = 0
      sub_tokens = []
      while start < len(chars):
        end = len(chars)
        cur_substr = None
        while start < end:
          substr = "".join(chars[start:end])
          if start > 0:
            substr = "##" + substr
          if substr in self.vocab:
            cur_substr = substr
            break
          end -= 1
        if cur_substr is None:
          is_bad = True
          break
        sub_tokens.append(cur_substr)
        start = end
      if is_bad:
        output_tokens.append(self.unk_token)
      else:
        output_tokens.extend(sub_tokens)
    return output_tokens


def _is_whitespace(char):
  """Space, \\t, \\n, \\r (controls, but counted as whitespace) and category Zs."""
  if char == " " or char == "\t" or char == "\n" or char == "\r":
    return True
  cat = unicodedata.category(char)
  if cat == "Zs":
    return True
  return False


def _is_control(char):
  """Categories Cc and Cf, except \\t, \\n and \\r."""
  if char == "\t" or char == "\n" or char == "\r":
    return False
  cat = unicodedata.category(char)
  if cat in ("Cc", "Cf"):
    return True
  return False


def _is_punctuation(char):
  """Every non-alphanumeric printable ASCII character, and categories P*."""
  cp = ord(char)
  if ((cp >= 33 and cp <= 47) or (cp >= 58 and cp <= 64) or
      (cp >= 91 and cp <= 96) or (cp >= 123 and cp <= 126)):
    return True
  cat = unicodedata.category(char)
  if cat.startswith("P"):
    return True
  return False


def split_lines(data):
  """Lines of a byte string as std::getline gives them: split at b"\\n", no empty last line."""
  if not data:
    return []
  lines = data.split(b"\n")
  if data.endswith(b"\n"):
    lines.pop()
  return lines


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--vocab", required=True)
  ap.add_argument("--cased", action="store_true")
  ap.add_argument("--max-word-chars", type=int, default=100)
  args = ap.parse_args()
  tok = FullTokenizer(args.vocab, do_lower_case=not args.cased,
                      max_input_chars_per_word=args.max_word_chars)
  out = sys.stdout.buffer
  for line in split_lines(sys.stdin.buffer.read()):
    out.write(" ".join(tok.tokenize(line)).encode("utf-8") + b"\n")


if __name__ == "__main__":
  main()
