// MLM batches from a prepared corpus split (data/corpus.h): RoBERTa FULL-SENTENCES packing,
// dynamic masking and a resumable, seekable batch stream.
//
// Packing. The split's documents, in order, form the packed stream
//     doc_0 [SEP] doc_1 [SEP] ... [SEP] doc_{D-1}
// (one [SEP] between consecutive documents). With C = max_len - 2, sequence i holds the stream's
// positions [i*C, (i+1)*C) as [CLS] + those tokens + [SEP], so every sequence has exactly max_len
// positions, documents longer than C are split across sequences, and sequences cross document
// boundaries. The last sequence may be short: after its closing [SEP] come [PAD]s with
// attention_mask 0. A separator that falls at a chunk's first or last position gives "[CLS] [SEP]"
// or "[SEP] [SEP]"; nothing is dropped, so the sequences' contents concatenated are the stream.
//
// Order. Each epoch visits every sequence once, in an order drawn per epoch: a Feistel
// permutation of [0, num_sequences) keyed by (seed, epoch) through Philox (constant memory,
// random access, so resuming needs only the position). shuffle = false keeps index order.
//
// Masking (dynamic: recomputed each time a sequence is served). Eligible positions are those
// whose token is not special (Tokenizer::is_special: never [CLS], [SEP], [PAD], [UNK], [MASK]).
// k = floor(mask_prob * eligible + u), u uniform in [0, 1), positions are chosen (exactly k, no
// repeats, uniformly: a partial Fisher-Yates shuffle); the expected count is exactly
// mask_prob * eligible. Each chosen position becomes [MASK] with probability mask_token_prob, a
// uniformly drawn non-special id with probability random_token_prob, else keeps its token; its
// label is the original id, every other label is -100. All draws come from Philox keyed by the
// seed with counter (sequence index, epoch), so the batch at step k is a pure function of
// (seed, k): a resumed run sees the same batches without replaying anything.
//
// Segment pairs (segment_pairs = true; BERT's two-segment input without next-sentence
// prediction). Sequences are packed with one position fewer (C = max_len - 3), and each is cut
// in two before masking: with c content tokens (c >= 2), A takes the first s of them, s uniform in
// [1, c - 1] from Philox keyed by the seed with counter (sequence index, epoch) — a new cut each
// epoch, like the masks — and the row becomes [CLS] A [SEP] B [SEP], token types 0 up to and
// including the middle [SEP] and 1 after (padding 0). B continues A's text (the packed stream's
// next tokens), so the model learns to read across a [SEP] and a segment change, the layout of
// GLUE's sentence pairs, without a next-sentence objective. A sequence of one content token is
// not cut (types all 0). Masking never picks the inserted [SEP].
//
// Sentence order (sentence_order = true, with segment pairs; ALBERT's sentence-order prediction).
// After the cut, a second draw of the same Philox stream swaps the two segments with probability
// 1/2: the row becomes [CLS] B [SEP] A [SEP] (types 0 for B and its [SEP], 1 after), and the
// batch's sentence_labels holds 1 for a swapped row, 0 for one in order, -100 for a row that was
// not cut. Both orders are the same tokens from one place of the text, so telling them apart needs
// the model to read the two segments against each other (not their topics, as next-sentence
// prediction allows). The cut itself is the same draw as without sentence order.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/batch.h"
#include "data/corpus.h"
#include "data/tokenizer.h"
#include "engine/tensor.h"

namespace data {

struct MaskingOptions {
  double mask_prob = 0.15;         // of the eligible positions
  double mask_token_prob = 0.8;    // of the chosen: → [MASK]
  double random_token_prob = 0.1;  // of the chosen: → a random non-special id (the rest: kept)
};

struct BatchOptions {
  int64_t batch_size = 32;
  int64_t max_len = 512;  // T, including [CLS] and [SEP]; >= 3
  uint64_t seed = 1;      // shuffling and masking
  bool shuffle = true;
  MaskingOptions masking;
  bool segment_pairs = false;   // [CLS] A [SEP] B [SEP] with token types (see the file comment)
  bool sentence_order = false;  // swap A and B in half the rows, labelled (needs segment_pairs)
  // Data parallelism: the stream advances by num_shards * batch_size slots per batch (the global
  // batch) and serves slots [shard * batch_size, (shard + 1) * batch_size) of it, so the shards
  // of ranks 0..n-1 concatenated are the batch that one stream with n * batch_size would serve.
  int64_t shard = 0;
  int64_t num_shards = 1;
};

// Where a training stream stands: the next batch starts with the sequence served at slot
// `next_sequence` (0-based, in the epoch's order) of epoch `epoch`.
struct DataPosition {
  int64_t epoch = 0;
  int64_t next_sequence = 0;
  std::string to_json() const;  // {"epoch":E,"next_sequence":S}: for checkpoint metadata
  static DataPosition from_json(const std::string& text);  // errors name what is expected
  bool operator==(const DataPosition&) const = default;
};

// The FULL-SENTENCES layout of one split (see the file comment).
class SequencePacker {
 public:
  // Keeps a reference to `shard`, which must outlive the packer. segment_pairs: one position
  // fewer of content per sequence (room for the [SEP] between the segments; see the file
  // comment); sentence_order: swapped segments, labelled (needs segment_pairs).
  SequencePacker(const ShardReader& shard, int64_t max_len, const SpecialIds& special,
                 bool segment_pairs = false, bool sentence_order = false);
  int64_t max_len() const { return max_len_; }
  int64_t num_sequences() const { return num_sequences_; }
  int64_t stream_length() const { return stream_length_; }  // tokens + separators
  bool segment_pairs() const { return segment_pairs_; }
  bool sentence_order() const { return sentence_order_; }
  const SpecialIds& special() const { return special_; }
  // Writes sequence i into ids[0 .. max_len) ([PAD] after its end) and returns its length
  // (positions before it have attention 1).
  int64_t fill(int64_t i, int64_t* ids) const;

 private:
  const ShardReader* shard_;
  int64_t max_len_, content_;
  bool segment_pairs_, sentence_order_;
  SpecialIds special_;
  int64_t stream_length_ = 0, num_sequences_ = 0;
};

// Cuts a packed row ids[0 .. length) = [CLS] content [SEP] (length < max_len) into
// [CLS] A [SEP] B [SEP] in place, writes types[0 .. max_len) and returns the new length; a row of
// fewer than 2 content tokens is left as it is (types 0). The cut is drawn from Philox keyed by
// `seed` with counter (sequence, epoch) (see the file comment, "Segment pairs"). With
// `order_label`, the segments are then swapped with probability 1/2 and *order_label set to 1
// (swapped), 0 (in order) or -100 (not cut) (the file comment, "Sentence order").
int64_t cut_segment_pair(int64_t* ids, int64_t* types, int64_t length, int64_t max_len, int32_t sep,
                         uint64_t seed, uint64_t epoch, uint64_t sequence,
                         int64_t* order_label = nullptr);

// Dynamic masking (see the file comment); built once per tokenizer.
class Masker {
 public:
  Masker(const Tokenizer& tok, const MaskingOptions& options = {});
  // Masks ids[0 .. length) in place for sequence `sequence` of epoch `epoch` and writes
  // labels[0 .. length) (-100 where not chosen); returns the number chosen.
  int64_t apply(int64_t* ids, int64_t* labels, int64_t length, uint64_t seed, uint64_t epoch,
                uint64_t sequence) const;
  bool is_special(int64_t id) const { return special_[static_cast<size_t>(id)] != 0; }
  const std::vector<int32_t>& random_candidates() const { return candidates_; }
  int64_t vocab_size() const { return static_cast<int64_t>(special_.size()); }

 private:
  MaskingOptions options_;
  int32_t mask_id_;
  std::vector<uint8_t> special_;     // by id
  std::vector<int32_t> candidates_;  // the non-special ids
};

// The position of epoch `epoch`'s slot `slot` in index order: a bijection of [0, n) keyed by
// (seed, epoch) (a 6-round Feistel network over the next even power of two, cycle-walked into
// [0, n)).
uint64_t shuffled_index(uint64_t slot, uint64_t n, uint64_t seed, uint64_t epoch);

// The endless training stream over one split: epochs follow each other, a batch may hold the end
// of one epoch and the start of the next. Keeps references to `shard` (must outlive the stream);
// checks that `tok` is the tokenizer the corpus was prepared with (vocabulary size and special
// ids against meta.json).
class BatchStream {
 public:
  BatchStream(const Corpus& corpus, Split split, const Tokenizer& tok, const BatchOptions& options);
  MlmBatch next_batch();
  DataPosition position() const { return pos_; }
  void seek(const DataPosition& position);  // errors when outside this stream
  int64_t num_sequences() const { return packer_.num_sequences(); }
  const BatchOptions& options() const { return options_; }

 private:
  BatchOptions options_;
  SequencePacker packer_;
  Masker masker_;
  DataPosition pos_;
};

// One deterministic pass over a split for evaluation: sequences in index order, masks drawn from
// (seed, epoch 0), so every evaluation of a run — and of any run with the same seed — sees the
// same inputs. The last batch may have fewer than batch_size rows. options.shuffle is ignored.
class EvalBatches {
 public:
  static constexpr uint64_t kDefaultSeed = 0xE7A1;
  EvalBatches(const Corpus& corpus, Split split, const Tokenizer& tok, int64_t batch_size,
              int64_t max_len, uint64_t seed = kDefaultSeed, const MaskingOptions& masking = {},
              bool segment_pairs = false, bool sentence_order = false);
  std::optional<MlmBatch> next();  // nullopt after the last batch
  void rewind() { next_ = 0; }
  int64_t num_sequences() const { return packer_.num_sequences(); }
  int64_t num_batches() const;

 private:
  int64_t batch_size_;
  uint64_t seed_;
  SequencePacker packer_;
  Masker masker_;
  int64_t next_ = 0;
};

}  // namespace data
