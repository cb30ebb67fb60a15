// Every section of a pretraining config, read and validated (see pretrain_config.h).
#include "models/pretrain_config.h"

#include <cmath>

#include "engine/error.h"
#include "models/objective.h"

namespace models {

engine::OptimizerOptions read_optim_options(const engine::ConfigSection& t) {
  engine::OptimizerOptions o;
  o.lr = t.get_double("lr", o.lr);
  o.beta1 = t.get_double("beta1", o.beta1);
  o.beta2 = t.get_double("beta2", o.beta2);
  o.eps = t.get_double("eps", o.eps);
  o.weight_decay = t.get_double("weight_decay", o.weight_decay);
  o.name = t.get_string("name", o.name);
  const std::string trust = t.get_string("trust_ratio", "decayed");
  t.finish();
  auto check = [&](bool ok, const char* key, const std::string& what) {
    ENGINE_CHECK(ok, "[config] ", t.where(key), ": ", what);
  };
  check(std::isfinite(o.lr) && o.lr >= 0, "lr", "must be a finite value >= 0");
  check(o.beta1 >= 0 && o.beta1 < 1, "beta1", "must be in [0, 1)");
  check(o.beta2 >= 0 && o.beta2 < 1, "beta2", "must be in [0, 1)");
  check(std::isfinite(o.eps) && o.eps >= 0, "eps", "must be a finite value >= 0");
  check(std::isfinite(o.weight_decay) && o.weight_decay >= 0, "weight_decay",
        "must be a finite value >= 0");
  check(o.name == "adamw" || o.name == "lamb", "name",
        "must be adamw or lamb, got '" + o.name + "'");
  check(trust == "decayed" || trust == "all", "trust_ratio",
        "must be decayed (LAMB's ratio where weight decay applies, apex's default) or all, got '" +
            trust + "'");
  o.trust_ratio_all = trust == "all";
  return o;
}

DataOptions read_data_options(const engine::ConfigSection& t) {
  DataOptions o;
  o.corpus = t.get_string("corpus", o.corpus);
  o.tokenizer = t.get_string("tokenizer", o.tokenizer);
  o.seq_len = t.get_int("seq_len", o.seq_len);
  o.batch_size = t.get_int("batch_size", o.batch_size);
  o.shuffle = t.get_bool("shuffle", o.shuffle);
  o.lower_case = t.get_bool("lower_case", o.lower_case);
  o.segment_pairs = t.get_bool("segment_pairs", o.segment_pairs);
  t.finish();
  ENGINE_CHECK(o.seq_len >= 3, "[config] ", t.where("seq_len"),
               ": must be at least 3 ([CLS] x [SEP])");
  ENGINE_CHECK(o.batch_size >= 1, "[config] ", t.where("batch_size"), ": must be at least 1");
  ENGINE_CHECK(!o.segment_pairs || o.seq_len >= 5, "[config] ", t.where("seq_len"), ": ", o.seq_len,
               " is too short for data.segment_pairs (at least 5: [CLS] a [SEP] b [SEP])");
  return o;
}

engine::Device read_device(const engine::ConfigSection& s, const std::string& key,
                           engine::Device fallback) {
  const std::string text = s.get_string(key, fallback.str());
  try {
    return engine::parse_device(text);
  } catch (const engine::Error&) {
    ENGINE_FAIL("[config] ", s.where(key), ": '", text,
                "' is not a device (expected cpu, cuda or cuda:N)");
  }
}

PretrainOptions read_train_options(const engine::ConfigSection& t) {
  PretrainOptions o;
  o.steps = t.get_int("steps", o.steps);
  o.warmup_steps = t.get_int("warmup_steps", o.warmup_steps);
  o.warmup_ratio = t.get_double("warmup_ratio", o.warmup_ratio);
  o.accumulation = t.get_int("accumulation", o.accumulation);
  o.clip_norm = t.get_double("clip_norm", o.clip_norm);
  o.device = read_device(t, "device", o.device);
  o.precision = t.get_choice("precision", o.precision, {"f32", "bf16", "fp16"});
  o.on_nonfinite = t.get_choice("on_nonfinite", o.on_nonfinite, {"stop", "skip"});
  engine::ConfigSection ls = t.section("loss_scale");
  o.loss_scale.enabled = ls.get_bool("enabled", o.precision == "fp16");
  o.loss_scale.init_scale = ls.get_double("init", o.loss_scale.init_scale);
  o.loss_scale.growth_interval = ls.get_int("growth_interval", o.loss_scale.growth_interval);
  o.loss_scale.growth_factor = ls.get_double("growth_factor", o.loss_scale.growth_factor);
  o.loss_scale.backoff_factor = ls.get_double("backoff_factor", o.loss_scale.backoff_factor);
  o.loss_scale.min_scale = ls.get_double("min", o.loss_scale.min_scale);
  ls.finish();
  auto check_ls = [&](bool ok, const char* key, const std::string& what) {
    ENGINE_CHECK(ok, "[config] ", ls.where(key), ": ", what);
  };
  const engine::LossScalerOptions& l = o.loss_scale;
  check_ls(std::isfinite(l.init_scale) && l.init_scale > 0, "init", "must be positive");
  check_ls(l.growth_interval >= 1, "growth_interval", "must be at least 1");
  check_ls(l.growth_factor > 1, "growth_factor", "must be > 1");
  check_ls(l.backoff_factor > 0 && l.backoff_factor < 1, "backoff_factor", "must be in (0, 1)");
  check_ls(l.min_scale > 0 && l.min_scale <= l.init_scale, "min", "must be in (0, init]");
  o.decay_bias_and_norm = t.get_bool("decay_bias_and_norm", o.decay_bias_and_norm);
  o.log_every = t.get_int("log_every", o.log_every);
  o.valid_every = t.get_int("valid_every", o.valid_every);
  o.valid_batches = t.get_int("valid_batches", o.valid_batches);
  o.save_every = t.get_int("save_every", o.save_every);
  o.keep_last = t.get_int("keep_last", o.keep_last);
  o.out_dir = t.get_string("out_dir", o.out_dir);
  o.progress = t.get_bool("progress", o.progress);
  o.bucket_mb = t.get_int("bucket_mb", o.bucket_mb);
  o.grad_reduce_dtype = t.get_choice("grad_reduce_dtype", o.grad_reduce_dtype, {"f32", "bf16"});
  o.cuda_graph = t.get_bool("cuda_graph", o.cuda_graph);
  t.finish();
  auto check = [&](bool ok, const char* key, const std::string& what) {
    ENGINE_CHECK(ok, "[config] ", t.where(key), ": ", what);
  };
  check(o.steps > 0, "steps", "must be positive");
  check(o.warmup_steps >= -1 && o.warmup_steps <= o.steps, "warmup_steps", "must be in [0, steps]");
  check(o.warmup_ratio >= 0 && o.warmup_ratio <= 1, "warmup_ratio", "must be in [0, 1]");
  check(o.accumulation >= 1, "accumulation", "must be at least 1");
  check(o.clip_norm >= 0, "clip_norm", "must be 0 (off) or positive");
  check(o.log_every >= 1, "log_every", "must be at least 1");
  check(o.valid_every >= 0 && o.save_every >= 0, "valid_every",
        "valid_every and save_every must be >= 0");
  check(o.valid_batches >= 1, "valid_batches", "must be at least 1");
  check(o.keep_last >= 1, "keep_last", "must be at least 1");
  check(!o.out_dir.empty(), "out_dir", "must not be empty");
  check(o.bucket_mb >= 1, "bucket_mb", "must be at least 1");
  check(!o.cuda_graph || o.device.is_cuda(), "cuda_graph",
        "needs train.device: cuda (a CUDA graph replays device work), got train.device: " +
            o.device.str());
  return o;
}

PretrainConfig PretrainConfig::read(const engine::Config& cfg) {
  const engine::ConfigSection root = cfg.root();
  PretrainConfig c;
  const int64_t seed = root.get_int("seed", 1);
  ENGINE_CHECK(seed >= 0, "[config] ", root.where("seed"), ": must be >= 0");
  c.seed = static_cast<uint64_t>(seed);
  c.optim = read_optim_options(root.section("optim"));
  const engine::ConfigSection data = root.section("data");
  c.data = read_data_options(data);
  c.seq_len_where_ = data.where("seq_len");
  c.segment_pairs_where_ = data.where("segment_pairs");
  c.train = read_train_options(root.section("train"));
  c.has_model = root.has("model");
  const engine::ConfigSection model = root.section("model");
  c.has_vocab_size = model.has("vocab_size");
  c.vocab_where_ = model.where("vocab_size");
  c.model = BertConfig::from_config(model);
  c.objective = root.get_choice("objective", c.objective, objective_names());
  const Objective& objective = objective_named(c.objective);
  if (objective.sentence_order)
    ENGINE_CHECK(c.data.segment_pairs, "[config] ", root.where("objective"), ": ", c.objective,
                 " (sentence-order prediction) needs data.segment_pairs: true (the two "
                 "segments it swaps), ",
                 data.has("segment_pairs") ? c.segment_pairs_where_ : "data.segment_pairs",
                 " is false");
  // An objective's own section (electra:) only with that objective.
  for (const Objective& o : objectives()) {
    if (!*o.section) continue;
    if (root.has(o.section))
      ENGINE_CHECK(&o == &objective, "[config] ", root.where(o.section), ": an ", o.section,
                   " section needs objective: ", o.name, " (the objective is ", c.objective, ")");
    if (&o == &objective) o.read_section(root.section(o.section), c);
  }
  root.finish();
  return c;
}

void PretrainConfig::check_for_corpus(const BertConfig& m, int64_t vocab,
                                      const std::string& tokenizer) const {
  ENGINE_CHECK(m.vocab_size == vocab, "[config] ", vocab_where_, ": ", m.vocab_size,
               " does not match the tokenizer ", tokenizer, " (", vocab,
               " tokens); leave model.vocab_size out to take the tokenizer's");
  ENGINE_CHECK(!data.segment_pairs || m.type_vocab_size >= 2, "[config] ", segment_pairs_where_,
               ": segment pairs need segment embeddings, but model.type_vocab_size is ",
               m.type_vocab_size, " (expected >= 2)");
  // Learned position tables have max_positions rows: longer sequences cannot be represented.
  if (m.position.has_position_table())
    ENGINE_CHECK(data.seq_len <= m.max_positions, "[config] ", seq_len_where_, ": ", data.seq_len,
                 " exceeds model.max_positions ", m.max_positions,
                 " of the learned position table (preset ", m.position.preset, ")");
}

}  // namespace models
