// FULL-SENTENCES packing, dynamic masking and the batch streams (the rules are in batches.h).
#include "data/batches.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "engine/error.h"
#include "engine/rng.h"

namespace data {

namespace {

// Stream tags: the same seed keys shuffling and masking, so each gets its own Philox key.
constexpr uint64_t kMaskTag = 0x4D41534Bull;     // "MASK"
constexpr uint64_t kPairTag = 0x50414952ull;     // "PAIR"
constexpr uint64_t kShuffleTag = 0x53485546ull;  // "SHUF"

uint64_t tagged_key(uint64_t seed, uint64_t tag) { return seed ^ (tag * 0x9E3779B97F4A7C15ull); }

// Sequential words of the Philox stream at counter (block, a_lo, a_hi, b) under a 64-bit key:
// one stream per (sequence, epoch), consumed in a fixed order, so its draws depend on nothing else.
class PhiloxStream {
 public:
  PhiloxStream(uint64_t key, uint64_t a, uint64_t b)
      : ctr_{0u, static_cast<uint32_t>(a), static_cast<uint32_t>(a >> 32),
             static_cast<uint32_t>(b)},
        key_{static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32)} {}
  uint32_t next() {
    if (used_ == 4) {
      engine::philox4x32_10(ctr_, key_, buf_);
      ++ctr_[0];
      used_ = 0;
    }
    return buf_[used_++];
  }
  double uniform() { return next() * (1.0 / 4294967296.0); }  // [0, 1)
  // Uniform in [0, n) for n <= 2^32 (multiply-shift; the bias is below n / 2^32).
  uint64_t below(uint64_t n) { return (static_cast<uint64_t>(next()) * n) >> 32; }

 private:
  uint32_t ctr_[4];
  uint32_t key_[2];
  uint32_t buf_[4] = {};
  int used_ = 4;
};

void check_special_ids(const SpecialIds& s, int64_t vocab, const std::string& what) {
  const std::pair<const char*, int32_t> ids[] = {
      {"[CLS]", s.cls}, {"[SEP]", s.sep}, {"[PAD]", s.pad}, {"[MASK]", s.mask}};
  for (const auto& [name, id] : ids) {
    ENGINE_CHECK(id >= 0 && id < vocab, "[batch] ", what, " has ", name, " id ", id,
                 " (expected an id in 0 .. ", vocab - 1, ")");
  }
}

// The tokenizer given for batching must be the one the corpus was made with.
void check_tokenizer(const Corpus& corpus, const Tokenizer& tok) {
  const CorpusMeta& m = corpus.meta();
  const SpecialIds& s = tok.special();
  const bool same = tok.vocab_size() == m.vocab_size && s.cls == m.special.cls &&
                    s.sep == m.special.sep && s.pad == m.special.pad && s.mask == m.special.mask;
  ENGINE_CHECK(same, "[batch] tokenizer ", tok.path(), " (", tok.kind(), ", vocabulary ",
               tok.vocab_size(), ", [CLS] ", s.cls, " [SEP] ", s.sep, " [PAD] ", s.pad, " [MASK] ",
               s.mask, ") is not the one corpus ", m.dir, " was prepared with (", m.tokenizer_path,
               ": ", m.tokenizer_kind, ", vocabulary ", m.vocab_size, ", [CLS] ", m.special.cls,
               " [SEP] ", m.special.sep, " [PAD] ", m.special.pad, " [MASK] ", m.special.mask, ")");
}

void check_shape(int64_t batch_size, int64_t max_len) {
  ENGINE_CHECK(batch_size >= 1, "[batch] batch_size is ", batch_size, " (expected >= 1)");
  ENGINE_CHECK(max_len >= 3, "[batch] max_len is ", max_len,
               " (expected >= 3: [CLS], at least one token, [SEP])");
}

// Fills rows of a batch: row r is sequence seqs[r] of epochs[r]. The masker's labels are valid
// by construction; the predicted positions and targets are collected in the same pass.
MlmBatch build_batch(const SequencePacker& packer, const Masker& masker, uint64_t seed,
                     const std::vector<int64_t>& seqs, const std::vector<int64_t>& epochs) {
  const int64_t rows = static_cast<int64_t>(seqs.size()), T = packer.max_len();
  const bool segment_pairs = packer.segment_pairs();
  const int32_t sep = packer.special().sep;
  std::vector<int64_t> ids(static_cast<size_t>(rows * T));
  std::vector<int64_t> attention(ids.size(), 0), labels(ids.size(), -100);
  std::vector<int64_t> types(segment_pairs ? ids.size() : 0, 0);
  const bool sentence_order = packer.sentence_order();
  std::vector<int64_t> order;  // sentence labels, one per row
  std::vector<int64_t> positions, targets;
  int64_t tokens = 0;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t* row = ids.data() + r * T;
    int64_t* row_labels = labels.data() + r * T;
    int64_t len = packer.fill(seqs[r], row);
    int64_t order_label = -100;
    if (segment_pairs)
      len = cut_segment_pair(row, types.data() + r * T, len, T, sep, seed,
                             static_cast<uint64_t>(epochs[r]), static_cast<uint64_t>(seqs[r]),
                             sentence_order ? &order_label : nullptr);
    if (sentence_order) order.push_back(order_label);
    std::fill_n(attention.data() + r * T, len, 1);
    tokens += len;
    masker.apply(row, row_labels, len, seed, static_cast<uint64_t>(epochs[r]),
                 static_cast<uint64_t>(seqs[r]));
    for (int64_t t = 0; t < len; ++t) {
      if (row_labels[t] == -100) continue;
      positions.push_back(r * T + t);
      targets.push_back(row_labels[t]);
    }
  }
  MlmBatch b;
  b.inputs.input_ids = engine::Tensor::from_vector(ids, {rows, T});
  b.inputs.attention_mask = engine::Tensor::from_vector(attention, {rows, T});
  if (segment_pairs) b.inputs.token_type_ids = engine::Tensor::from_vector(types, {rows, T});
  if (sentence_order) b.sentence_labels = engine::Tensor::from_vector(order, {rows});
  b.labels = engine::Tensor::from_vector(labels, {rows, T});
  const int64_t m = static_cast<int64_t>(positions.size());
  b.positions = engine::Tensor::from_vector(positions, {m});
  b.targets = engine::Tensor::from_vector(targets, {m});
  b.positions_unique = true;  // r T + t in order
  b.num_tokens = tokens;
  return b;
}

}  // namespace

// ---- DataPosition ------------------------------------------------------------------------------

std::string DataPosition::to_json() const {
  return nlohmann::json{{"epoch", epoch}, {"next_sequence", next_sequence}}.dump();
}

DataPosition DataPosition::from_json(const std::string& text) {
  const char* expected = R"( (expected {"epoch": <int >= 0>, "next_sequence": <int >= 0>}))";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    ENGINE_FAIL("[batch] data position '", text, "' is not JSON", expected);
  }
  auto field = [&](const char* key) {
    ENGINE_CHECK(j.is_object() && j.contains(key) && j[key].is_number_integer() &&
                     j[key].get<int64_t>() >= 0,
                 "[batch] data position '", text, "' has no valid '", key, "'", expected);
    return j[key].get<int64_t>();
  };
  return DataPosition{field("epoch"), field("next_sequence")};
}

// ---- packing -----------------------------------------------------------------------------------

SequencePacker::SequencePacker(const ShardReader& shard, int64_t max_len, const SpecialIds& special,
                               bool segment_pairs, bool sentence_order)
    : shard_(&shard),
      max_len_(max_len),
      content_(max_len - (segment_pairs ? 3 : 2)),
      segment_pairs_(segment_pairs),
      sentence_order_(sentence_order),
      special_(special) {
  ENGINE_CHECK(!sentence_order || segment_pairs,
               "[batch] sentence order needs segment pairs (two segments to swap)");
  ENGINE_CHECK(max_len >= 3, "[batch] max_len is ", max_len,
               " (expected >= 3: [CLS], at least one token, [SEP])");
  ENGINE_CHECK(!segment_pairs || max_len >= 5, "[batch] max_len is ", max_len,
               " (expected >= 5 for segment pairs: [CLS], a token, [SEP], a token, [SEP])");
  check_special_ids(special, shard.vocab_size(), "the tokenizer");
  const int64_t docs = shard.num_documents();
  stream_length_ = docs == 0 ? 0 : shard.num_tokens() + (docs - 1);
  num_sequences_ = (stream_length_ + content_ - 1) / content_;
}

int64_t SequencePacker::fill(int64_t i, int64_t* ids) const {
  ENGINE_CHECK(i >= 0 && i < num_sequences_, "[batch] sequence ", i, " is out of range (",
               shard_->bin_path(), " packs into ", num_sequences_, " sequences of ", max_len_, ")");
  const std::span<const uint64_t> off = shard_->offsets();
  const int64_t docs = shard_->num_documents();
  const int64_t begin = i * content_, end = std::min(stream_length_, begin + content_);
  // Document d occupies stream positions [off[d] + d, off[d + 1] + d), its separator the next one:
  // find the last document starting at or before `begin`.
  int64_t lo = 0, hi = docs - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (static_cast<int64_t>(off[mid]) + mid <= begin)
      lo = mid;
    else
      hi = mid - 1;
  }
  int64_t d = lo;
  const uint32_t* tokens = shard_->tokens().data();
  const int64_t vocab = shard_->vocab_size();
  int64_t n = 0;
  ids[n++] = special_.cls;
  for (int64_t p = begin; p < end; ++p) {
    const int64_t doc_end = static_cast<int64_t>(off[d + 1]) + d;
    if (p < doc_end) {
      const int64_t t = tokens[p - d];
      ENGINE_CHECK(t < vocab, "[batch] ", shard_->bin_path(), ": token ", p - d, " is ", t,
                   " (expected an id below the vocabulary size ", vocab, ")");
      ids[n++] = t;
    } else {  // p == doc_end: the separator after document d
      ids[n++] = special_.sep;
      ++d;
    }
  }
  ids[n++] = special_.sep;
  std::fill(ids + n, ids + max_len_, static_cast<int64_t>(special_.pad));
  return n;
}

// ---- segment pairs -----------------------------------------------------------------------------

int64_t cut_segment_pair(int64_t* ids, int64_t* types, int64_t length, int64_t max_len, int32_t sep,
                         uint64_t seed, uint64_t epoch, uint64_t sequence, int64_t* order_label) {
  std::fill_n(types, max_len, 0);
  if (order_label) *order_label = -100;
  const int64_t content = length - 2;
  if (content < 2) return length;
  ENGINE_CHECK(length < max_len, "[batch] no room to cut a row of ", length,
               " tokens into a pair (", max_len, " positions)");
  PhiloxStream rng(tagged_key(seed, kPairTag), sequence, epoch);
  const int64_t a = 1 + static_cast<int64_t>(rng.below(static_cast<uint64_t>(content - 1)));
  // [CLS] x_1 .. x_a | x_{a+1} .. [SEP] -> [CLS] x_1 .. x_a [SEP] x_{a+1} .. [SEP]
  std::copy_backward(ids + 1 + a, ids + length, ids + length + 1);
  ids[1 + a] = sep;
  const int64_t n = length + 1;
  if (order_label) {
    *order_label = static_cast<int64_t>(rng.below(2));
    if (*order_label == 1) {
      // [CLS] A [SEP] B [SEP] -> [CLS] [SEP] B A [SEP] -> [CLS] B [SEP] A [SEP]
      std::rotate(ids + 1, ids + 1 + a, ids + n - 1);
      std::rotate(ids + 1, ids + 2, ids + n - 1 - a);
      std::fill(types + n - 1 - a, types + n, 1);
      return n;
    }
  }
  std::fill(types + 2 + a, types + n, 1);
  return n;
}

// ---- masking -----------------------------------------------------------------------------------

Masker::Masker(const Tokenizer& tok, const MaskingOptions& options)
    : options_(options), mask_id_(tok.special().mask) {
  const MaskingOptions& o = options;
  ENGINE_CHECK(o.mask_prob >= 0 && o.mask_prob <= 1, "[batch] mask_prob is ", o.mask_prob,
               " (expected 0 .. 1)");
  ENGINE_CHECK(o.mask_token_prob >= 0 && o.random_token_prob >= 0 &&
                   o.mask_token_prob + o.random_token_prob <= 1 + 1e-12,
               "[batch] mask_token_prob ", o.mask_token_prob, " and random_token_prob ",
               o.random_token_prob, " (expected non-negative, summing to at most 1)");
  const int64_t vocab = tok.vocab_size();
  ENGINE_CHECK(vocab > 0 && vocab <= (int64_t{1} << 32), "[batch] tokenizer ", tok.path(),
               " has vocabulary size ", vocab, " (expected 1 .. 2^32)");
  check_special_ids(tok.special(), vocab, "tokenizer " + tok.path());
  special_.resize(static_cast<size_t>(vocab));
  for (int64_t id = 0; id < vocab; ++id) {
    special_[static_cast<size_t>(id)] = tok.is_special(static_cast<int32_t>(id)) ? 1 : 0;
    if (!special_[static_cast<size_t>(id)]) candidates_.push_back(static_cast<int32_t>(id));
  }
  ENGINE_CHECK(!candidates_.empty() || o.random_token_prob == 0, "[batch] tokenizer ", tok.path(),
               " has no non-special ids to draw random replacements from");
}

int64_t Masker::apply(int64_t* ids, int64_t* labels, int64_t length, uint64_t seed, uint64_t epoch,
                      uint64_t sequence) const {
  std::fill_n(labels, length, -100);
  std::vector<int32_t> eligible;
  eligible.reserve(static_cast<size_t>(length));
  const int64_t vocab = vocab_size();
  for (int64_t p = 0; p < length; ++p) {
    ENGINE_CHECK(ids[p] >= 0 && ids[p] < vocab, "[batch] position ", p, " holds id ", ids[p],
                 " (expected an id below the vocabulary size ", vocab, ")");
    if (!special_[static_cast<size_t>(ids[p])]) eligible.push_back(static_cast<int32_t>(p));
  }
  const uint64_t m = eligible.size();
  if (m == 0) return 0;

  PhiloxStream rng(tagged_key(seed, kMaskTag), sequence, epoch);
  // Stochastic rounding: exactly k per sequence, E[k] = mask_prob * m.
  const uint64_t k = std::min<uint64_t>(
      m, static_cast<uint64_t>(
             std::floor(options_.mask_prob * static_cast<double>(m) + rng.uniform())));
  for (uint64_t j = 0; j < k; ++j) std::swap(eligible[j], eligible[j + rng.below(m - j)]);
  const double replace_below = options_.mask_token_prob + options_.random_token_prob;
  for (uint64_t j = 0; j < k; ++j) {
    const int32_t p = eligible[j];
    labels[p] = ids[p];
    const double u = rng.uniform();
    if (u < options_.mask_token_prob) {
      ids[p] = mask_id_;
    } else if (u < replace_below) {
      ids[p] = candidates_[rng.below(candidates_.size())];
    }
  }
  return static_cast<int64_t>(k);
}

// ---- order -------------------------------------------------------------------------------------

uint64_t shuffled_index(uint64_t slot, uint64_t n, uint64_t seed, uint64_t epoch) {
  ENGINE_CHECK(slot < n, "[batch] slot ", slot, " is out of range (", n, " sequences)");
  int bits = 2;
  while (bits < 64 && (uint64_t{1} << bits) < n) ++bits;
  const int half = (bits + 1) / 2;
  const uint64_t mask = (uint64_t{1} << half) - 1;
  const uint64_t key = tagged_key(seed, kShuffleTag);
  const uint32_t k[2] = {static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32)};
  uint64_t x = slot;
  do {  // cycle-walk: a bijection of [0, 2^(2*half)) restricted to [0, n)
    uint64_t left = x >> half, right = x & mask;
    for (uint32_t round = 0; round < 6; ++round) {
      const uint32_t ctr[4] = {static_cast<uint32_t>(right), round, static_cast<uint32_t>(epoch),
                               static_cast<uint32_t>(epoch >> 32)};
      uint32_t out[4];
      engine::philox4x32_10(ctr, k, out);
      const uint64_t f = ((static_cast<uint64_t>(out[1]) << 32) | out[0]) & mask;
      const uint64_t next_right = left ^ f;
      left = right;
      right = next_right;
    }
    x = (left << half) | right;
  } while (x >= n);
  return x;
}

// ---- streams -----------------------------------------------------------------------------------

BatchStream::BatchStream(const Corpus& corpus, Split split, const Tokenizer& tok,
                         const BatchOptions& options)
    : options_(options),
      packer_((check_shape(options.batch_size, options.max_len), check_tokenizer(corpus, tok),
               corpus.split(split)),
              options.max_len, tok.special(), options.segment_pairs, options.sentence_order),
      masker_(tok, options.masking) {
  ENGINE_CHECK(options.num_shards >= 1 && options.shard >= 0 && options.shard < options.num_shards,
               "[batch] shard ", options.shard, " of ", options.num_shards,
               ": expected 0 <= shard < num_shards");
  ENGINE_CHECK(packer_.num_sequences() > 0, "[batch] split ", split_name(split), " of corpus ",
               corpus.meta().dir, " has no tokens (nothing to train on)");
}

void BatchStream::seek(const DataPosition& position) {
  ENGINE_CHECK(position.epoch >= 0 && position.next_sequence >= 0 &&
                   position.next_sequence < num_sequences(),
               "[batch] cannot seek to ", position.to_json(), ": the stream has ", num_sequences(),
               " sequences per epoch (expected 0 <= next_sequence < ", num_sequences(), ")");
  pos_ = position;
}

MlmBatch BatchStream::next_batch() {
  const int64_t n = num_sequences();
  std::vector<int64_t> seqs, epochs;
  const int64_t first = options_.shard * options_.batch_size, end = first + options_.batch_size;
  for (int64_t r = 0; r < options_.batch_size * options_.num_shards; ++r) {
    const int64_t slot = pos_.next_sequence;
    if (r >= first && r < end) {  // this shard's part of the global batch
      seqs.push_back(options_.shuffle ? static_cast<int64_t>(shuffled_index(
                                            static_cast<uint64_t>(slot), static_cast<uint64_t>(n),
                                            options_.seed, static_cast<uint64_t>(pos_.epoch)))
                                      : slot);
      epochs.push_back(pos_.epoch);
    }
    if (++pos_.next_sequence == n) {
      pos_.next_sequence = 0;
      ++pos_.epoch;
    }
  }
  return build_batch(packer_, masker_, options_.seed, seqs, epochs);
}

EvalBatches::EvalBatches(const Corpus& corpus, Split split, const Tokenizer& tok,
                         int64_t batch_size, int64_t max_len, uint64_t seed,
                         const MaskingOptions& masking, bool segment_pairs, bool sentence_order)
    : batch_size_(batch_size),
      seed_(seed),
      packer_((check_shape(batch_size, max_len), check_tokenizer(corpus, tok), corpus.split(split)),
              max_len, tok.special(), segment_pairs, sentence_order),
      masker_(tok, masking) {}

int64_t EvalBatches::num_batches() const {
  return (packer_.num_sequences() + batch_size_ - 1) / batch_size_;
}

std::optional<MlmBatch> EvalBatches::next() {
  const int64_t n = packer_.num_sequences();
  if (next_ >= n) return std::nullopt;
  std::vector<int64_t> seqs, epochs;
  for (; next_ < n && static_cast<int64_t>(seqs.size()) < batch_size_; ++next_) {
    seqs.push_back(next_);
    epochs.push_back(0);
  }
  return build_batch(packer_, masker_, seed_, seqs, epochs);
}

}  // namespace data
