// A user's program on the installed engine::models and engine::data: a WordPiece vocabulary, a
// tiny TUPE-R BERT, one masked-LM batch, its loss and gradients.
#include <cstdio>
#include <fstream>

#include "data/batch.h"
#include "data/tokenizer.h"
#include "models/bert.h"

int main() {
  using engine::Tensor;
  std::ofstream("consumer_vocab.txt") << "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\ncat\nsat\n";
  auto tok = data::load_tokenizer("consumer_vocab.txt");  // engine::data
  const std::vector<int32_t> ids = tok->encode("The cat sat");
  if (ids.size() != 3) return 1;

  models::BertConfig c;  // engine::models
  c.vocab_size = tok->vocab_size();
  c.hidden_size = 16;
  c.num_layers = 2;
  c.num_heads = 2;
  c.ffn_size = 32;
  c.max_positions = 8;
  models::apply_position_preset(c.position, "tupe_r");
  models::BertForMaskedLM model(c, /*seed*/ 1);
  std::vector<int64_t> in = {2, ids[0], 4, ids[2], 3}, labels = {-100, -100, ids[1], -100, -100};
  const data::MlmBatch batch = data::make_mlm_batch(
      Tensor::from_vector(in, {1, 5}), Tensor::ones({1, 5}, engine::DType::i64),
      Tensor::from_vector(labels, {1, 5}), Tensor(), c.vocab_size, "consumer");
  engine::Generator gen(0);
  models::MlmOutput out = model.forward(batch, gen);
  out.loss.backward();
  std::printf("models: tupe_r MLM loss %.4f, %zu parameter tensors with gradients\n",
              out.loss.item(), model.named_parameters().size());
  return out.loss.item() > 0 && model.named_parameters()[0].second.grad().defined() ? 0 : 1;
}
