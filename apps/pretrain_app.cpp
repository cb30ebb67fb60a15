// pretrain_app: masked-LM pretraining of the BERT encoder. Subcommands prepare the data
// (train-tokenizer, prepare); the default command pretrains on a prepared corpus (the loop is
// models::pretrain); the single-batch mode (a fixed batch from a file, constant lr, dropout off
// unless asked for) lets tests and the PyTorch reference (tools/reference/) check the model step
// by step. The modes' work is in the library (models/pretrain.h, models/pretrain_modes.h); the
// app parses its command line and calls it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "apps/cli.h"
#include "data/batches.h"
#include "data/corpus.h"
#include "data/tokenizer.h"
#include "engine/comm.h"
#include "engine/config.h"
#include "engine/error.h"
#include "engine/optim.h"
#include "engine/safetensors.h"
#include "engine/threads.h"
#include "models/bert.h"
#include "models/checkpoint.h"
#include "models/hf_bert.h"
#include "models/objective.h"
#include "models/pretrain.h"
#include "models/pretrain_config.h"
#include "models/pretrain_modes.h"

namespace {

const char* kUsage = R"(usage: pretrain_app --config CFG [--set KEY=VALUE ...] [--resume]
       pretrain_app train-tokenizer --input FILE [FILE ...] --out PREFIX [--vocab-size N]
                                    [--max-lines N] [--character-coverage C] [--seed S]
                                    [--verbose]
       pretrain_app prepare --tokenizer TOK --input FILE [FILE ...] --out DIR [--valid-ratio R]
                            [--seed S] [--overwrite] [--quiet] [--cased]
       pretrain_app --config CFG --export-batches DIR [--set KEY=VALUE ...]
       pretrain_app --config CFG --batch-file BATCH [--steps N] [--init CKPT] [--save OUT]
                    [--dump OUT] [--dropout] [--micro-batches M] [--time]
       pretrain_app eval --init CKPT --corpus DIR [--split valid|train] [--batches N]
                         [--batch-size B] [--seq-len T] [--by-position CSV] [--device DEV]
                         [--precision P]
       pretrain_app convert --from-hf DIR --out FILE.safetensors
       pretrain_app convert --to-hf CKPT --out DIR

Pretraining of a BERT encoder: masked LM, masked LM + sentence-order prediction (`objective:
mlm_sop` with `data.segment_pairs: true`: half the pairs swapped, a head on [CLS] tells which), or
ELECTRA (`objective: electra`: a generator and a replaced-token-detecting discriminator,
docs/models.md); model, data, training and optimizer from a YAML config (configs/README.md lists
every key).

Pretraining on a prepared corpus (data.corpus in the config):
  --resume            continue from the newest checkpoint in train.out_dir (bit-identical losses)
  --out DIR           set train.out_dir
  --export-batches DIR
                      train nothing: write what the run would start from and read, for an
                      outside trainer to replay (tools/reference/train_reference.py):
                      DIR/init.safetensors (the initial weights, a pretraining checkpoint),
                      DIR/train.safetensors (the first train.steps x train.accumulation
                      training batches, rows in order: input_ids, labels (-100 = not
                      predicted), attention_mask (u8), token_type_ids and sentence_labels when
                      the run has them; i32 unless named) and DIR/valid.safetensors (the
                      train.valid_batches validation batches, the same tensors); the batch size
                      and counts in their metadata

Data preparation:
  train-tokenizer     train a SentencePiece BPE vocabulary (default 32768) from text files
                      (plain, .xz or .gz), on at most --max-lines sampled lines (default
                      2000000; 0 = all); --character-coverage (default 0.9999) is the share of
                      characters the vocabulary must cover
  prepare             tokenize text (one sentence/paragraph per line, blank lines between
                      documents; .xz and .gz accepted) into memory-mapped train/valid shards; TOK is a
                      SentencePiece .model or a WordPiece vocab.txt (--cased keeps case)

Evaluation without training:
  eval                masked-LM loss, perplexity and accuracy of CKPT on a prepared corpus's
                      valid (default) or train split: every batch (or the first --batches N) of
                      --batch-size sequences (default 32) of --seq-len tokens (default: the
                      model's max_positions, at most 512), masked as in validation (fixed seed);
                      the corpus's tokenizer must have the model's vocabulary size. Under mpirun
                      the batches are shared by the ranks. --by-position CSV also writes the
                      mean loss of the predicted tokens at each position (position,predicted,
                      loss; length generalisation: docs/results.md)

Hugging Face BERT (docs/hf-interop.md; both directions bit-exact):
  convert --from-hf DIR   a HF BERT directory (config.json, model.safetensors, vocab.txt) to an
                          engine checkpoint with the bert_a preset; the vocabulary is copied
                          beside it (FILE's stem + .vocab.txt) for finetune_app
  convert --to-hf CKPT    a bert_a checkpoint to a HF BERT directory (config.json,
                          model.safetensors, vocab.txt when the vocabulary is WordPiece)

Single-batch mode (dropout off unless --dropout, constant learning rate optim.lr):
  --batch-file FILE   safetensors batch: input_ids (B,T), attention_mask (B,T; 1 = token),
                      labels (B,T; -100 = not predicted), optional token_type_ids (B,T);
                      ELECTRA: optional replacements (M), the generator's draws to use;
                      mlm_sop: sentence_labels (B; 1 swapped, 0 in order, -100 none)
  --steps N           optimizer steps (optim.name) on that batch (default 0: evaluate only); prints
                      "step <k> loss <value>" with the loss before step k's update
  --init CKPT         start from this pretraining checkpoint (bert_mlm, bert_mlm_sop or
                      electra: not a finetuned one; its stored model config is used; a model
                      section in --config must agree with it)
  --save OUT          write the model after the last step (safetensors, docs/checkpoint.md)
  --dump OUT          write the initial loss, logits at the predicted positions and every
                      parameter's gradient (as grad.<name>) before any step: step 1's forward and
                      backward (with --dropout, its masks too: the keep mask of every dropout op
                      as dropout_mask.<k>, u8, in forward order; the attention op's own dropout
                      is not among them; ELECTRA adds mlm_loss, rtd_loss, rtd_logits, rtd_labels
                      and sampled; mlm_sop adds mlm_loss, sop_loss and sop_logits,
                      docs/checkpoint.md)
  --dropout           train mode: dropout on, masks from the pretraining loop's dropout stream
                      (rank 0's; docs/models.md)
  --micro-batches M   M micro-batches per step, each the batch file with masks of its own,
                      weights 1/M (default 1)
  --time              after the steps print "timing: <n> steps <ms> ms/step <r> tokens/s
                      peak_rss_mb <m>": the mean over every step after the first (the warm-up;
                      with train.cuda_graph after the second, the capture; tokens = batch rows x
                      columns x micro-batches; bench/bench_step.py); on a device also
                      "device_peak_mb <m>", the most device memory held at once

Other options:
  --config CFG        YAML config: seed:, model: (sizes, position.preset, ...), optim:, data:,
                      train: (configs/README.md)
  --set KEY=VALUE     override a config value, e.g. --set model.position.preset=tupe_r
  --device DEV        set train.device: cpu (default), cuda or cuda:N (the GPU; in the
                      emulation build build-emu/, the emulated one)
  --count-params      print the parameter count by group and exit
  --version           the version and git commit it was built from
  -h, --help          this text

Data parallel: start it with an MPI launcher, e.g. `mpirun -np 2 pretrain_app --config CFG`;
data.batch_size is per rank (global batch = ranks x batch_size x accumulation), rank 0 writes
the checkpoints and logs (docs/distributed.md).

Exit status: 0 on success, 1 on an error (one message naming the file, line or key), 2 on a bad
command line.
)";

struct Args {
  std::string config, init, out, device, export_dir;
  std::vector<std::string> sets;
  models::SingleBatchOptions batch;  // --batch-file and the options of its mode
  bool steps_given = false, count_params = false, resume = false;
};

[[noreturn]] void usage_error(const std::string& msg) { cli::usage_error("pretrain_app", msg); }

Args parse_args(int argc, char** argv) {
  Args a;
  cli::ArgParser p("pretrain_app", kUsage, argc, argv);
  while (p.next()) {
    const std::string& arg = p.arg();
    if (arg == "--config")
      a.config = p.value();
    else if (arg == "--init")
      a.init = p.value();
    else if (arg == "--batch-file")
      a.batch.batch_file = p.value();
    else if (arg == "--save")
      a.batch.save = p.value();
    else if (arg == "--dump")
      a.batch.dump = p.value();
    else if (arg == "--set")
      a.sets.push_back(p.value());
    else if (arg == "--count-params")
      a.count_params = true;
    else if (arg == "--dropout")
      a.batch.dropout = true;
    else if (arg == "--time")
      a.batch.timing = true;
    else if (arg == "--micro-batches")
      a.batch.micro_batches = p.int_value(1);
    else if (arg == "--resume")
      a.resume = true;
    else if (arg == "--out")
      a.out = p.value();
    else if (arg == "--export-batches")
      a.export_dir = p.value();
    else if (arg == "--device")
      a.device = p.device_value().str();
    else if (arg == "--steps") {
      a.batch.steps = p.int_value(0);
      a.steps_given = true;
    } else
      p.unknown();
  }
  if (a.config.empty() && a.init.empty()) usage_error("--config (or --init) is required");
  if (a.batch.batch_file.empty() &&
      (a.steps_given || !a.batch.dump.empty() || !a.batch.save.empty() || a.batch.dropout ||
       a.batch.micro_batches != 1 || a.batch.timing))
    usage_error(
        "--steps, --dump, --save, --dropout, --micro-batches and --time belong to the "
        "single-batch mode (--batch-file)");
  if (a.batch.timing && a.batch.steps < 2)
    usage_error("--time needs --steps 2 or more (one warm-up step)");
  if (!a.export_dir.empty() && (!a.batch.batch_file.empty() || a.resume || a.count_params))
    usage_error(
        "--export-batches reads the corpus of the config: not with --batch-file, --resume or "
        "--count-params");
  if (!a.batch.batch_file.empty() && (a.resume || !a.out.empty()))
    usage_error("--resume and --out belong to corpus pretraining, not to --batch-file");
  return a;
}

std::string with_commas(int64_t n) {
  std::string s = std::to_string(n), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

void print_parameter_counts(const models::PretrainModel& model) {
  std::map<std::string, int64_t> groups;
  std::vector<std::string> order;
  int64_t total = 0;
  for (auto& [name, t] : model.named_parameters()) {
    // Group as "bert.embeddings", "bert.position", "bert.encoder", "mlm"; ELECTRA's generator
    // likewise under "generator.", and "rtd".
    const std::string pre = name.rfind("generator.", 0) == 0 ? "generator." : "";
    const std::string rest = name.substr(pre.size());
    const size_t dot = rest.find('.');
    std::string g =
        pre + rest.substr(0, rest.rfind("bert.", 0) == 0 ? rest.find('.', dot + 1) : dot);
    if (!groups.count(g)) order.push_back(g);
    groups[g] += t.numel();
    total += t.numel();
  }
  const models::BertConfig& c = model.config();
  std::printf("model: %lld layers, width %lld, %lld heads, FFN %lld, vocab %lld, preset %s\n",
              (long long)c.num_layers, (long long)c.hidden_size, (long long)c.num_heads,
              (long long)c.ffn_size, (long long)c.vocab_size, c.position.preset.c_str());
  const std::string more = model.describe();
  if (!more.empty()) std::printf("%s\n", more.c_str());
  for (auto& g : order) std::printf("  %-22s %15s\n", g.c_str(), with_commas(groups[g]).c_str());
  std::printf("  %-22s %15s  (decoder tied to bert.embeddings.token)\n", "total",
              with_commas(total).c_str());
}

// data::BatchStream / EvalBatches as the loop's batch source.
class CorpusSource : public models::BatchSource {
 public:
  CorpusSource(const data::Corpus& corpus, const data::Tokenizer& tok,
               const data::BatchOptions& opt)
      : train_(corpus, data::Split::train, tok, opt),
        valid_(corpus, data::Split::valid, tok, opt.batch_size, opt.max_len,
               data::EvalBatches::kDefaultSeed, opt.masking, opt.segment_pairs,
               opt.sentence_order) {}
  data::MlmBatch next_train() override { return train_.next_batch(); }
  std::string position() const override { return train_.position().to_json(); }
  void seek(const std::string& p) override { train_.seek(data::DataPosition::from_json(p)); }
  std::vector<data::MlmBatch> valid_batches(int64_t max_batches) override {
    std::vector<data::MlmBatch> out;
    valid_.rewind();
    while (int64_t(out.size()) < max_batches) {
      std::optional<data::MlmBatch> b = valid_.next();
      if (!b) break;
      out.push_back(std::move(*b));
    }
    return out;
  }

 private:
  data::BatchStream train_;
  data::EvalBatches valid_;
};

// --export-batches: the initial weights and the batches a run would read, for an outside trainer
// (tools/reference/train_reference.py) to replay step for step.
class BatchWriter {
 public:
  void add(const data::MlmBatch& b) {
    const int64_t rows = b.inputs.input_ids.size(0), t = b.inputs.input_ids.size(1);
    ENGINE_CHECK(seq_len_ == 0 || seq_len_ == t, "[pretrain_app] --export-batches: batches of ", t,
                 " columns after ", seq_len_);
    seq_len_ = t;
    rows_ += rows;
    append(ids_, b.inputs.input_ids);
    append(labels_, b.labels);
    const std::vector<int64_t> mask = b.inputs.attention_mask.defined()
                                          ? b.inputs.attention_mask.to_vector<int64_t>()
                                          : std::vector<int64_t>(size_t(rows * t), 1);
    for (int64_t v : mask) mask_.push_back(uint8_t(v != 0));
    if (b.inputs.token_type_ids.defined()) append(types_, b.inputs.token_type_ids);
    if (b.sentence_labels.defined()) append(order_, b.sentence_labels);
  }
  void save(const std::string& path, engine::SafetensorsMetadata meta) const {
    using engine::Tensor;
    const engine::Shape shape{rows_, seq_len_};
    engine::NamedTensors t{{"input_ids", Tensor::from_vector(ids_, shape)},
                           {"labels", Tensor::from_vector(labels_, shape)},
                           {"attention_mask", Tensor::from_vector(mask_, shape)}};
    if (!types_.empty()) t.emplace_back("token_type_ids", Tensor::from_vector(types_, shape));
    if (!order_.empty())
      t.emplace_back("sentence_labels", Tensor::from_vector(order_, engine::Shape{rows_}));
    meta["rows"] = std::to_string(rows_);
    engine::save_safetensors(path, t, meta);
  }

 private:
  static void append(std::vector<int32_t>& out, const engine::Tensor& t) {
    for (int64_t v : t.to_vector<int64_t>()) out.push_back(int32_t(v));
  }
  int64_t rows_ = 0, seq_len_ = 0;
  std::vector<int32_t> ids_, labels_, types_, order_;
  std::vector<uint8_t> mask_;
};

void export_batches(const std::string& dir, const models::PretrainModel& model,
                    models::BatchSource& source, const models::PretrainOptions& o,
                    int64_t batch_size) {
  std::filesystem::create_directories(dir);
  models::save_checkpoint(dir + "/init.safetensors", model);
  const int64_t n = o.steps * o.accumulation;
  BatchWriter train;
  for (int64_t i = 0; i < n; ++i) train.add(source.next_train());
  train.save(dir + "/train.safetensors", {{"batch_size", std::to_string(batch_size)},
                                          {"steps", std::to_string(o.steps)},
                                          {"accumulation", std::to_string(o.accumulation)}});
  BatchWriter valid;
  const std::vector<data::MlmBatch> vb = source.valid_batches(o.valid_batches);
  for (const data::MlmBatch& b : vb) valid.add(b);
  valid.save(dir + "/valid.safetensors",
             {{"batch_size", std::to_string(batch_size)}, {"batches", std::to_string(vb.size())}});
  std::printf(
      "exported to %s: init.safetensors, train.safetensors (%lld steps x %lld x %lld "
      "sequences), valid.safetensors (%zu batches)\n",
      dir.c_str(), (long long)o.steps, (long long)o.accumulation, (long long)batch_size, vb.size());
}

int run(const Args& args) {
  engine::Config cfg =
      args.config.empty() ? engine::Config() : engine::Config::load_file(args.config);
  for (const auto& s : args.sets) cfg.set_assignment(s);
  if (!args.out.empty()) cfg.set("train.out_dir", args.out);
  if (!args.device.empty()) cfg.set("train.device", args.device);
  const models::PretrainConfig pc = models::PretrainConfig::read(cfg);  // every section, checked
  const models::DataOptions& data_opt = pc.data;
  const uint64_t seed = pc.seed;
  const engine::OptimizerOptions& adam = pc.optim;
  models::PretrainOptions train_opt = pc.train;
  const bool corpus_mode = args.batch.batch_file.empty() && !args.count_params;

  // The corpus (and its tokenizer): the vocabulary size comes from it.
  std::unique_ptr<data::Corpus> corpus;
  std::unique_ptr<data::Tokenizer> tokenizer;
  if (corpus_mode && !data_opt.corpus.empty()) {
    corpus = std::make_unique<data::Corpus>(data_opt.corpus);
    const std::string tok_path =
        data_opt.tokenizer.empty() ? corpus->meta().tokenizer_path : data_opt.tokenizer;
    try {
      tokenizer = data::load_tokenizer(tok_path, data_opt.lower_case);
    } catch (const engine::Error& e) {
      ENGINE_FAIL(e.what(), data_opt.tokenizer.empty()
                                ? " (the tokenizer recorded in " + data_opt.corpus +
                                      "/meta.json; set data.tokenizer to use another path)"
                                : std::string(" (data.tokenizer)"));
    }
    ENGINE_CHECK(tokenizer->vocab_size() == corpus->meta().vocab_size, "[pretrain_app] tokenizer ",
                 tok_path, " has ", tokenizer->vocab_size(), " tokens but the corpus ",
                 data_opt.corpus, " was prepared with ", corpus->meta().vocab_size);
  }

  models::BertConfig config = pc.model;
  if (tokenizer && !pc.has_vocab_size) config.vocab_size = tokenizer->vocab_size();
  if (!args.init.empty()) {
    const models::BertConfig stored = models::read_checkpoint_config(args.init);
    if (pc.has_model) {
      const std::string diff = stored.first_difference(config);
      if (!diff.empty())
        ENGINE_FAIL("[pretrain_app] ", args.init, ": the checkpoint's model config differs from ",
                    args.config, " at model.", diff,
                    " (checkpoint vs config); drop the model "
                    "section from the config to use the checkpoint's");
    }
    config = stored;
  }
  if (corpus_mode) {
    ENGINE_CHECK(corpus, "[pretrain_app] ", cfg.source(),
                 ": data.corpus is not set (a directory made by `pretrain_app prepare`), and no "
                 "--batch-file was given");
    pc.check_for_corpus(config, tokenizer->vocab_size(), tokenizer->path());
  }

  const std::unique_ptr<models::PretrainModel> owned = pc.make_model(config, seed);
  models::PretrainModel& model = *owned;
  if (!args.init.empty()) models::load_checkpoint(args.init, model);
  if (engine::world().is_root()) print_parameter_counts(model);
  if (args.count_params) return 0;
  if (engine::world().is_root()) std::printf("%s\n", engine::describe_cpu_compute().c_str());
  if (!args.batch.batch_file.empty()) {
    models::run_single_batch(model, adam, seed, train_opt, args.batch);
    return 0;
  }

  // Data parallel: data.batch_size is per rank; each rank reads its own shard of every global
  // batch (data/batches.h).
  engine::Communicator& comm = engine::world();
  data::BatchOptions bo;
  bo.batch_size = data_opt.batch_size;
  bo.max_len = data_opt.seq_len;
  bo.seed = seed;
  bo.shuffle = data_opt.shuffle;
  bo.segment_pairs = data_opt.segment_pairs;
  bo.sentence_order = models::objective_named(pc.objective).sentence_order;
  bo.shard = comm.rank();
  bo.num_shards = comm.size();
  CorpusSource source(*corpus, *tokenizer, bo);
  if (!args.export_dir.empty()) {
    ENGINE_CHECK(comm.size() == 1,
                 "[pretrain_app] --export-batches runs in one process: start it without mpirun");
    export_batches(args.export_dir, model, source, train_opt, bo.batch_size);
    return 0;
  }
  if (comm.is_root()) {
    std::printf("corpus %s: %lld train / %lld valid tokens; batches of %lld x %lld%s\n",
                data_opt.corpus.c_str(), (long long)corpus->train().num_tokens(),
                (long long)corpus->valid().num_tokens(), (long long)bo.batch_size,
                (long long)bo.max_len,
                bo.sentence_order  ? ", segment pairs, half of them swapped (sentence order)"
                : bo.segment_pairs ? ", segment pairs"
                                   : "");
    std::printf(
        "global batch: %d rank%s x %lld sequences x %lld accumulation = %lld sequences of %lld "
        "tokens (%s)\n",
        comm.size(), comm.size() == 1 ? "" : "s", (long long)bo.batch_size,
        (long long)train_opt.accumulation,
        (long long)(comm.size() * bo.batch_size * train_opt.accumulation), (long long)bo.max_len,
        comm.backend(engine::Device::cpu()).c_str());
    std::fflush(stdout);
  }
  // finetune_app finds the vocabulary through the checkpoints: a copy in the run directory,
  // recorded relative to each checkpoint, so the directory can move.
  train_opt.checkpoint_metadata[models::kTokenizerKey] =
      comm.is_root() ? models::keep_tokenizer(tokenizer->path(), train_opt.out_dir)
                     : models::kept_tokenizer_path(tokenizer->path(), train_opt.out_dir);
  train_opt.checkpoint_metadata[models::kLowerCaseKey] = data_opt.lower_case ? "true" : "false";
  models::PretrainResult r =
      models::pretrain(model, source, train_opt, adam, seed, args.resume, cfg.dump());
  if (comm.is_root()) {
    // A run resumed at its last step validates nothing: say so rather than print a loss of 0.
    char valid[64] = "no validation this run";
    if (!std::isnan(r.last_valid_loss))
      std::snprintf(valid, sizeof valid, "valid loss %.4f", r.last_valid_loss);
    std::printf(
        "done: step %lld, %s; checkpoint %s; model %s/model.safetensors; metrics "
        "%s/metrics.jsonl\n",
        (long long)r.final_step, valid, r.final_checkpoint.c_str(), train_opt.out_dir.c_str(),
        train_opt.out_dir.c_str());
  }
  return 0;
}

// ---- subcommands --------------------------------------------------------------------------

struct SubArgs {
  std::vector<std::string> inputs;
  std::map<std::string, std::string> values;
  std::vector<std::string> flags;
};

SubArgs parse_sub(int argc, char** argv, const std::vector<std::string>& valued,
                  const std::vector<std::string>& flags) {
  SubArgs a;
  const std::string cmd = argv[1];
  cli::ArgParser p("pretrain_app " + cmd, kUsage, argc, argv, 2);
  while (p.next()) {
    const std::string& arg = p.arg();
    if (arg == "--input")
      a.inputs = p.values_until_flag();
    else if (std::find(valued.begin(), valued.end(), arg) != valued.end())
      a.values[arg] = p.value();
    else if (std::find(flags.begin(), flags.end(), arg) != flags.end())
      a.flags.push_back(arg);
    else
      p.unknown();
  }
  if (a.inputs.empty()) usage_error(cmd + ": --input FILE [FILE ...] is required");
  if (!a.values.count("--out")) usage_error(cmd + ": --out is required");
  return a;
}

int64_t int_value(const SubArgs& a, const std::string& key, int64_t fallback) {
  auto it = a.values.find(key);
  if (it == a.values.end()) return fallback;
  char* end = nullptr;
  const long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (it->second.empty() || *end != '\0' || v < 0)
    usage_error(key + " expects a non-negative integer, got '" + it->second + "'");
  return v;
}

bool has_flag(const SubArgs& a, const std::string& f) {
  return std::find(a.flags.begin(), a.flags.end(), f) != a.flags.end();
}

int train_tokenizer_cmd(int argc, char** argv) {
  SubArgs a = parse_sub(argc, argv,
                        {"--out", "--vocab-size", "--max-lines", "--seed", "--character-coverage"},
                        {"--verbose"});
  data::SentencePieceTrainOptions o;
  o.vocab_size = int_value(a, "--vocab-size", o.vocab_size);
  o.input_sentence_size = int_value(a, "--max-lines", o.input_sentence_size);
  o.seed = static_cast<uint64_t>(int_value(a, "--seed", 1));
  o.verbose = has_flag(a, "--verbose");
  if (a.values.count("--character-coverage")) {
    const std::string& v = a.values["--character-coverage"];
    char* end = nullptr;
    o.character_coverage = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !(o.character_coverage > 0 && o.character_coverage <= 1))
      usage_error("--character-coverage expects a number in (0, 1], got '" + v + "'");
  }
  try {
    data::train_sentencepiece(a.inputs, a.values["--out"], o);
  } catch (const engine::Error& e) {
    // The library names its options; say which flag sets each.
    std::string msg = e.what();
    const std::pair<const char*, const char*> flags[] = {
        {"vocab_size", "--vocab-size"},
        {"character_coverage", "--character-coverage"},
        {"input_sentence_size", "--max-lines"}};
    for (auto& [option, flag] : flags)
      for (size_t at = 0; (at = msg.find(option, at)) != std::string::npos; at += std::strlen(flag))
        msg.replace(at, std::strlen(option), flag);
    ENGINE_FAIL(msg);
  }
  std::printf("tokenizer: %s.model (%lld pieces)\n", a.values["--out"].c_str(),
              (long long)o.vocab_size);
  return 0;
}

int prepare_cmd(int argc, char** argv) {
  SubArgs a = parse_sub(argc, argv, {"--out", "--tokenizer", "--valid-ratio", "--seed"},
                        {"--overwrite", "--quiet", "--cased"});
  if (!a.values.count("--tokenizer"))
    usage_error("prepare: --tokenizer (a .model or vocab.txt) is required");
  auto tok = data::load_tokenizer(a.values["--tokenizer"], !has_flag(a, "--cased"));
  data::PrepareOptions o;
  o.valid_ratio = int_value(a, "--valid-ratio", o.valid_ratio);
  o.seed = static_cast<uint64_t>(int_value(a, "--seed", int64_t(o.seed)));
  o.overwrite = has_flag(a, "--overwrite");
  o.quiet = has_flag(a, "--quiet");
  data::CorpusStats st = data::prepare_corpus(a.inputs, *tok, a.values["--out"], o);
  std::printf(
      "corpus %s: train %lld documents / %lld tokens, valid %lld documents / %lld tokens; "
      "%lld invalid UTF-8 sequences replaced, %lld empty documents skipped\n",
      a.values["--out"].c_str(), (long long)st.train.documents, (long long)st.train.tokens,
      (long long)st.valid.documents, (long long)st.valid.tokens, (long long)st.invalid_utf8,
      (long long)st.empty_documents);
  return 0;
}

int eval_cmd(int argc, char** argv) {
  models::CorpusEvalOptions o;
  cli::ArgParser p("pretrain_app eval", kUsage, argc, argv, 2);
  while (p.next()) {
    const std::string& arg = p.arg();
    if (arg == "--init")
      o.init = p.value();
    else if (arg == "--corpus")
      o.corpus = p.value();
    else if (arg == "--split")
      o.split = p.value();
    else if (arg == "--batches")
      o.batches = p.int_value(1);
    else if (arg == "--batch-size")
      o.batch_size = p.int_value(1);
    else if (arg == "--seq-len")
      o.seq_len = p.int_value(8);
    else if (arg == "--by-position")
      o.by_position = p.value();
    else if (arg == "--device")
      o.device = p.device_value();
    else if (arg == "--precision")
      o.precision = p.precision_value();
    else
      p.unknown();
  }
  if (o.init.empty()) usage_error("eval: --init CKPT is required");
  if (o.corpus.empty())
    usage_error("eval: --corpus DIR (made by pretrain_app prepare) is required");
  if (o.split != "valid" && o.split != "train")
    usage_error("eval: --split expects valid or train, got '" + o.split + "'");
  try {
    models::evaluate_corpus(o);
  } catch (const engine::Error& e) {
    if (e.exit_code() == 2) usage_error(e.what());  // an option the checkpoint rules out
    throw;
  }
  return 0;
}

int convert_cmd(int argc, char** argv) {
  std::string from_hf, to_hf, out;
  cli::ArgParser p("pretrain_app convert", kUsage, argc, argv, 2);
  while (p.next()) {
    const std::string& arg = p.arg();
    if (arg == "--from-hf")
      from_hf = p.value();
    else if (arg == "--to-hf")
      to_hf = p.value();
    else if (arg == "--out")
      out = p.value();
    else
      p.unknown();
  }
  if (from_hf.empty() == to_hf.empty())
    usage_error("convert: give one of --from-hf DIR or --to-hf CKPT");
  if (out.empty()) usage_error("convert: --out is required");
  const models::HfConversion r =
      from_hf.empty() ? models::convert_to_hf(to_hf, out) : models::convert_from_hf(from_hf, out);
  if (from_hf.empty())
    std::printf("wrote %s/config.json, %s/model.safetensors%s\n", out.c_str(), out.c_str(),
                r.vocab.empty() ? "" : (", " + r.vocab).c_str());
  else
    std::printf("wrote %s (preset bert_a)%s\n", out.c_str(),
                r.vocab.empty() ? "" : (" and its vocabulary " + r.vocab).c_str());
  for (const std::string& n : r.notes) std::printf("note: %s\n", n.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Under mpirun: MPI (NCCL for GPU tensors) for data parallelism; otherwise one process.
  return engine::run_job("pretrain_app", [&] {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "train-tokenizer" || cmd == "prepare" || cmd == "convert") {
      ENGINE_CHECK(engine::world().size() == 1, "[pretrain_app] ", cmd,
                   " runs in one process: start it without mpirun");
      if (cmd == "convert") return convert_cmd(argc, argv);
      return cmd == "prepare" ? prepare_cmd(argc, argv) : train_tokenizer_cmd(argc, argv);
    }
    if (cmd == "eval") return eval_cmd(argc, argv);
    return run(parse_args(argc, argv));
  });
}
