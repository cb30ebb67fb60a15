// pretrain_app: masked-LM pretraining of the BERT encoder. Subcommands prepare the data
// (train-tokenizer, prepare); the default command pretrains on a prepared corpus (the loop is
// models::pretrain); the single-batch mode (a fixed batch from a file, constant lr, dropout off
// unless asked for) lets tests and the PyTorch reference (tools/reference/) check the model step
// by step.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "apps/cli.h"
#include "data/batches.h"
#include "data/corpus.h"
#include "data/tokenizer.h"
#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/backend.h"
#include "engine/comm.h"
#include "engine/config.h"
#include "engine/error.h"
#include "engine/file_io.h"
#include "engine/optim.h"
#include "engine/safetensors.h"
#include "engine/threads.h"
#include "models/bert.h"
#include "models/checkpoint.h"
#include "models/hf_bert.h"
#include "models/objective.h"
#include "models/pretrain.h"
#include "models/pretrain_config.h"
#include "ops/ops.h"
#include "train/trainer.h"

namespace {

const char* kUsage = R"(usage: pretrain_app --config CFG [--set KEY=VALUE ...] [--resume]
       pretrain_app train-tokenizer --input FILE [FILE ...] --out PREFIX [--vocab-size N]
                                    [--max-lines N] [--character-coverage C] [--seed S]
                                    [--verbose]
       pretrain_app prepare --tokenizer TOK --input FILE [FILE ...] --out DIR [--valid-ratio R]
                            [--seed S] [--overwrite] [--quiet] [--cased]
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
  --steps N           AdamW steps on that batch (default 0: evaluate only); prints
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
                      tokens = batch rows x columns x micro-batches; bench/bench_step.py)

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
  std::string config, init, batch_file, save, dump, out, device;
  std::vector<std::string> sets;
  int64_t steps = 0, micro_batches = 1;
  bool steps_given = false, count_params = false, resume = false, dropout = false, timing = false;
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
      a.batch_file = p.value();
    else if (arg == "--save")
      a.save = p.value();
    else if (arg == "--dump")
      a.dump = p.value();
    else if (arg == "--set")
      a.sets.push_back(p.value());
    else if (arg == "--count-params")
      a.count_params = true;
    else if (arg == "--dropout")
      a.dropout = true;
    else if (arg == "--time")
      a.timing = true;
    else if (arg == "--micro-batches")
      a.micro_batches = p.int_value(1);
    else if (arg == "--resume")
      a.resume = true;
    else if (arg == "--out")
      a.out = p.value();
    else if (arg == "--device")
      a.device = p.device_value().str();
    else if (arg == "--steps") {
      a.steps = p.int_value(0);
      a.steps_given = true;
    } else
      p.unknown();
  }
  if (a.config.empty() && a.init.empty()) usage_error("--config (or --init) is required");
  if (a.batch_file.empty() && (a.steps_given || !a.dump.empty() || !a.save.empty() || a.dropout ||
                               a.micro_batches != 1 || a.timing))
    usage_error(
        "--steps, --dump, --save, --dropout, --micro-batches and --time belong to the "
        "single-batch mode (--batch-file)");
  if (a.timing && a.steps < 2) usage_error("--time needs --steps 2 or more (one warm-up step)");
  if (!a.batch_file.empty() && (a.resume || !a.out.empty()))
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

// The keep masks (u8) of the dropout ops in the graph of `loss`, in forward order: each node's
// backward applied to ones gives keep / (1 - p), the mask the backward regenerates from the
// node's saved stream state.
std::vector<engine::Tensor> dropout_masks(const engine::Tensor& loss) {
  std::vector<std::shared_ptr<engine::Node>> found, todo = {loss.grad_fn()};
  std::set<const engine::Node*> seen;
  while (!todo.empty()) {
    std::shared_ptr<engine::Node> n = todo.back();
    todo.pop_back();
    if (!n || !seen.insert(n.get()).second) continue;
    if (std::strcmp(n->name(), "dropout") == 0) found.push_back(n);
    for (const engine::Edge& e : n->next) todo.push_back(e.node);
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a->sequence_nr < b->sequence_nr; });
  engine::NoGrad ng;
  std::vector<engine::Tensor> masks;
  for (const auto& n : found) {
    const engine::TensorMeta& m = n->outputs.at(0);
    const std::vector<float> g = n->backward({engine::Tensor::ones(m.shape, m.dtype, m.device)})
                                     .at(0)
                                     .to(engine::DType::f32)
                                     .to_vector<float>();
    std::vector<uint8_t> keep(g.size());
    for (size_t i = 0; i < g.size(); ++i) keep[i] = g[i] != 0.f;
    masks.push_back(engine::Tensor::from_vector<uint8_t>(keep, m.shape));
  }
  return masks;
}

int single_batch(const Args& args, models::PretrainModel& model, const engine::AdamWOptions& adam,
                 uint64_t seed, const models::PretrainOptions& train) {
  const models::BertConfig& config = model.config();
  const engine::Device device = train.device;
  engine::check_device(device);
  const engine::DType compute = models::compute_dtype(device, train.precision);
  engine::FlatParameters flat(model.named_parameters(), device);
  const data::MlmBatch host_batch = models::load_mlm_batch(args.batch_file, config);
  const data::MlmBatch batch = host_batch.to(flat.data().device());
  // The objective's extra inputs: ELECTRA's draws from the batch file instead of sampling,
  // MLM + SOP's sentence labels; each only where the objective reads it.
  const models::Objective* objective = models::objective_of_kind(model.kind());
  engine::Tensor replacements = models::load_replacements(args.batch_file, host_batch, config);
  ENGINE_CHECK(!replacements.defined() || (objective && objective->replacements), "[pretrain_app] ",
               args.batch_file, ": 'replacements' is for objective: electra (this model is ",
               model.kind(), ")");
  if (replacements.defined()) replacements = replacements.to(flat.data().device());
  ENGINE_CHECK(!batch.sentence_labels.defined() || (objective && objective->sentence_order),
               "[pretrain_app] ", args.batch_file,
               ": 'sentence_labels' is for objective: mlm_sop (this model is ", model.kind(), ")");
  // One forward: the loss, the MLM logits and what the objective's dump adds.
  auto forward = [&](engine::Generator& g, engine::NamedTensors* extra) {
    engine::Autocast autocast(compute);
    return model.batch_file_forward(batch, replacements, g, extra);
  };
  // Dropout off, or (--dropout) on with the pretraining loop's stream of rank 0.
  model.train(args.dropout);
  engine::Generator gen =
      args.dropout ? models::dropout_generator(seed, 0) : engine::Generator(seed);
  const int64_t micro = args.micro_batches;
  const std::vector<double> weights(size_t(micro), 1.0 / double(micro));

  // The library's training step at a constant learning rate, without clipping (the PyTorch
  // reference runs plain AdamW); no weight decay on biases and LayerNorm parameters (BERT's rule).
  engine::TrainerOptions options;
  options.clip_norm = 0;
  options.loss_scale = train.loss_scale;  // fp16: dynamic loss scaling (train.loss_scale)
  engine::Trainer trainer(
      flat, adam, [](const std::string& n) { return !engine::default_no_decay(n); },
      engine::constant_lr(adam.lr), options);

  if (!args.dump.empty()) {
    // Step 1's forwards and backwards (a copy of the stream: the steps below draw the same masks):
    // loss sum_m loss_m / M, the logits of the micro-batches one after the other.
    engine::Generator dump_gen = gen;
    engine::Tensor loss;
    std::vector<engine::Tensor> logits, masks;
    engine::NamedTensors extra;  // the first micro-batch's (ELECTRA)
    for (int64_t m = 0; m < micro; ++m) {
      models::PretrainModel::Output out = forward(dump_gen, m == 0 ? &extra : nullptr);
      if (args.dropout)
        for (engine::Tensor& k : dropout_masks(out.loss)) masks.push_back(k);
      engine::Tensor weighted = micro == 1 ? out.loss : out.loss * weights[size_t(m)];
      weighted.backward();
      loss = m == 0 ? weighted.detach() : loss + weighted.detach();
      logits.push_back(out.mlm_logits.detach());
    }
    engine::NamedTensors dump = {{"loss", loss},
                                 {"logits", micro == 1 ? logits[0] : engine::concat(logits, 0)},
                                 {"targets", batch.targets}};
    dump.insert(dump.end(), extra.begin(), extra.end());
    for (auto& [name, t] : model.named_parameters()) dump.emplace_back("grad." + name, t.grad());
    for (size_t k = 0; k < masks.size(); ++k)
      dump.emplace_back("dropout_mask." + std::to_string(k), masks[k]);
    engine::save_safetensors(args.dump, dump);
    flat.zero_grad();
    std::printf(
        "dump: loss, logits (%lld x %lld), %zu gradients and %zu dropout masks written to %s\n",
        (long long)dump[1].second.size(0), (long long)dump[1].second.size(1),
        model.named_parameters().size(), masks.size(), args.dump.c_str());
  }
  if (args.steps == 0) {
    engine::NoGrad ng;
    std::printf("eval loss %.9g\n", forward(gen, nullptr).loss.item());
  }
  using Clock = std::chrono::steady_clock;
  Clock::time_point timed_from;
  for (int64_t k = 1; k <= args.steps; ++k) {
    if (k == 2) timed_from = Clock::now();  // step 1 is the warm-up (allocator, caches)
    // "step k loss v": the loss before step k's update.
    const engine::StepStats s = trainer.step(
        micro, [&](int64_t) { return forward(gen, nullptr).loss; }, weights);
    std::printf("step %lld loss %.9g%s\n", (long long)k, s.loss,
                s.applied ? "" : " (skipped: inf/NaN gradients)");
    std::fflush(stdout);
  }
  if (args.timing) {
    const double s = std::chrono::duration<double>(Clock::now() - timed_from).count();
    const int64_t n = args.steps - 1;
    const double tokens = double(batch.inputs.input_ids.numel()) * double(micro) * double(n);
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    std::printf("timing: %lld steps %.3f ms/step %.1f tokens/s peak_rss_mb %.1f\n", (long long)n,
                1e3 * s / double(n), tokens / s, double(ru.ru_maxrss) / 1024.0);
  }
  if (!args.save.empty()) {
    models::save_checkpoint(args.save, model);
    std::printf("saved %s\n", args.save.c_str());
  }
  return 0;
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
  const engine::AdamWOptions& adam = pc.optim;
  models::PretrainOptions train_opt = pc.train;
  const bool corpus_mode = args.batch_file.empty() && !args.count_params;

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
  if (!args.batch_file.empty()) return single_batch(args, model, adam, seed, train_opt);

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
  std::string init, corpus_dir, split = "valid", precision = "f32", by_position;
  engine::Device device = engine::Device::cpu();
  int64_t batches = 0, batch_size = 32, seq_len = 0;
  cli::ArgParser p("pretrain_app eval", kUsage, argc, argv, 2);
  while (p.next()) {
    const std::string& arg = p.arg();
    if (arg == "--init")
      init = p.value();
    else if (arg == "--corpus")
      corpus_dir = p.value();
    else if (arg == "--split")
      split = p.value();
    else if (arg == "--batches")
      batches = p.int_value(1);
    else if (arg == "--batch-size")
      batch_size = p.int_value(1);
    else if (arg == "--seq-len")
      seq_len = p.int_value(8);
    else if (arg == "--by-position")
      by_position = p.value();
    else if (arg == "--device")
      device = p.device_value();
    else if (arg == "--precision")
      precision = p.precision_value();
    else
      p.unknown();
  }
  if (init.empty()) usage_error("eval: --init CKPT is required");
  if (corpus_dir.empty())
    usage_error("eval: --corpus DIR (made by pretrain_app prepare) is required");
  if (split != "valid" && split != "train")
    usage_error("eval: --split expects valid or train, got '" + split + "'");

  const models::BertConfig config = models::read_checkpoint_config(init);
  data::Corpus corpus(corpus_dir);
  std::unique_ptr<data::Tokenizer> tok = data::load_tokenizer(corpus.meta().tokenizer_path, true);
  ENGINE_CHECK(corpus.meta().vocab_size == config.vocab_size, "[pretrain_app] the corpus ",
               corpus_dir, " was prepared with a vocabulary of ", corpus.meta().vocab_size,
               " tokens but the checkpoint ", init, " has vocab_size ", config.vocab_size,
               ": prepare the corpus with the model's tokenizer");
  if (seq_len == 0) seq_len = std::min<int64_t>(config.max_positions, 512);
  if (config.position.has_position_table() && seq_len > config.max_positions)
    usage_error("eval: --seq-len " + std::to_string(seq_len) +
                " exceeds the model's max_positions " + std::to_string(config.max_positions));
  engine::check_device(device);
  const engine::DType compute = models::compute_dtype(device, precision);
  const std::unique_ptr<models::PretrainModel> model = models::load_pretrain_model(init);
  engine::FlatParameters flat(model->named_parameters(), device);

  // MLM + sentence order is evaluated on what it was trained on: segment pairs, half swapped.
  const models::Objective* objective = models::objective_of_kind(model->kind());
  const bool sop = objective && objective->sentence_order;
  data::EvalBatches source(corpus, split == "valid" ? data::Split::valid : data::Split::train, *tok,
                           batch_size, seq_len, data::EvalBatches::kDefaultSeed, {}, sop, sop);
  std::vector<data::MlmBatch> list;
  while (batches == 0 || int64_t(list.size()) < batches) {
    std::optional<data::MlmBatch> b = source.next();
    if (!b) break;
    list.push_back(std::move(*b));
  }
  ENGINE_CHECK(!list.empty(), "[pretrain_app] the ", split, " split of ", corpus_dir,
               " gives no batch of ", seq_len, " tokens");
  engine::Communicator& comm = engine::world();
  const models::MlmEval r =
      models::evaluate_mlm(*model, list, comm, compute, /*by_position_too=*/!by_position.empty());
  ENGINE_CHECK(r.predicted > 0, "[pretrain_app] the ", split, " split of ", corpus_dir,
               " gave no masked token to predict");
  std::string parts;
  for (auto& [name, value] : r.parts) parts += " " + name + " " + std::to_string(value);
  if (comm.is_root())
    std::printf(
        "eval %s on %s (%s split): %lld batches of %lld x %lld, %lld predicted tokens: loss %.4f "
        "perplexity %.2f accuracy %.4f%s\n",
        init.c_str(), corpus_dir.c_str(), split.c_str(), (long long)r.batches,
        (long long)batch_size, (long long)seq_len, (long long)r.predicted, r.loss, r.perplexity,
        r.accuracy, parts.c_str());
  if (comm.is_root() && !by_position.empty()) {
    std::string csv = "position,predicted,loss\n";
    for (size_t t = 0; t < r.predicted_by_position.size(); ++t) {
      const int64_t n = r.predicted_by_position[t];
      char loss[32] = "";
      if (n) std::snprintf(loss, sizeof loss, "%.6f", r.loss_sum_by_position[t] / double(n));
      csv += std::to_string(t) + "," + std::to_string(n) + "," + loss + "\n";
    }
    engine::write_file_atomic(by_position, csv, "pretrain_app");
    std::printf("wrote the loss by position to %s\n", by_position.c_str());
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
