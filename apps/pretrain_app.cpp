// pretrain_app: masked-LM pretraining of the BERT encoder. This version drives the single-batch
// mode (a fixed batch from a file, dropout off, AdamW at a constant learning rate), which tests
// and the PyTorch reference (tools/reference/) use to check the model step by step.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/config.h"
#include "engine/error.h"
#include "engine/optim.h"
#include "engine/safetensors.h"
#include "models/bert.h"
#include "models/checkpoint.h"

namespace {

const char* kUsage = R"(usage: pretrain_app --config CFG [options]

Masked-LM pretraining of a BERT encoder (model and optimizer from a YAML config).

Single-batch mode (dropout off, constant learning rate optim.lr):
  --batch-file FILE   safetensors batch: input_ids (B,T), attention_mask (B,T; 1 = token),
                      labels (B,T; -100 = not predicted), optional token_type_ids (B,T)
  --steps N           AdamW steps on that batch (default 0: evaluate only); prints
                      "step <k> loss <value>" with the loss before step k's update
  --init CKPT         start from this checkpoint (its stored model config is used; a model
                      section in --config must agree with it)
  --save OUT          write the model after the last step (safetensors, docs/checkpoint.md)
  --dump OUT          write the initial loss, logits at the predicted positions and every
                      parameter's gradient (as grad.<name>) before any step

Other options:
  --config CFG        YAML config: model: (sizes, position.preset, ...), optim:, seed:
  --set KEY=VALUE     override a config value, e.g. --set model.position.preset=tupe_r
  --count-params      print the parameter count by group and exit
  -h, --help          this text
)";

struct Args {
  std::string config, init, batch_file, save, dump;
  std::vector<std::string> sets;
  int64_t steps = 0;
  bool count_params = false;
};

[[noreturn]] void usage_error(const std::string& msg) {
  std::cerr << "pretrain_app: " << msg << "\n(run pretrain_app --help for the options)\n";
  std::exit(2);
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "-h" || arg == "--help") {
      std::cout << kUsage;
      std::exit(0);
    } else if (arg == "--config") {
      a.config = value();
    } else if (arg == "--init") {
      a.init = value();
    } else if (arg == "--batch-file") {
      a.batch_file = value();
    } else if (arg == "--save") {
      a.save = value();
    } else if (arg == "--dump") {
      a.dump = value();
    } else if (arg == "--set") {
      a.sets.push_back(value());
    } else if (arg == "--count-params") {
      a.count_params = true;
    } else if (arg == "--steps") {
      const std::string v = value();
      char* end = nullptr;
      long long n = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < 0) usage_error("--steps expects a non-negative integer, got '" + v + "'");
      a.steps = n;
    } else {
      usage_error("unknown argument '" + arg + "'");
    }
  }
  if (a.config.empty() && a.init.empty()) usage_error("--config (or --init) is required");
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

void print_parameter_counts(const models::BertForMaskedLM& model) {
  std::map<std::string, int64_t> groups;
  std::vector<std::string> order;
  int64_t total = 0;
  for (auto& [name, t] : model.named_parameters()) {
    // Group as "bert.embeddings", "bert.position", "bert.encoder", "mlm".
    const size_t dot = name.find('.');
    std::string g = name.substr(0, name.rfind("bert.", 0) == 0 ? name.find('.', dot + 1) : dot);
    if (!groups.count(g)) order.push_back(g);
    groups[g] += t.numel();
    total += t.numel();
  }
  const models::BertConfig& c = model.config();
  std::printf("model: %lld layers, width %lld, %lld heads, FFN %lld, vocab %lld, preset %s\n",
              (long long)c.num_layers, (long long)c.hidden_size, (long long)c.num_heads,
              (long long)c.ffn_size, (long long)c.vocab_size, c.position.preset.c_str());
  for (auto& g : order) std::printf("  %-22s %15s\n", g.c_str(), with_commas(groups[g]).c_str());
  std::printf("  %-22s %15s  (decoder tied to bert.embeddings.token)\n", "total",
              with_commas(total).c_str());
}

int run(const Args& args) {
  engine::Config cfg = args.config.empty() ? engine::Config() : engine::Config::load_file(args.config);
  for (const auto& s : args.sets) cfg.set_assignment(s);
  engine::ConfigSection root = cfg.root();
  const uint64_t seed = static_cast<uint64_t>(root.get_int("seed", 1));
  engine::ConfigSection model_section = root.section("model");
  engine::ConfigSection optim = root.section("optim");
  engine::AdamWOptions adam;
  adam.lr = optim.get_double("lr", 1e-4);
  adam.beta1 = optim.get_double("beta1", adam.beta1);
  adam.beta2 = optim.get_double("beta2", adam.beta2);
  adam.eps = optim.get_double("eps", adam.eps);
  adam.weight_decay = optim.get_double("weight_decay", adam.weight_decay);
  optim.finish();

  models::BertConfig config;
  if (!args.init.empty()) {
    config = models::read_checkpoint_config(args.init);
    if (cfg.root().has("model")) {
      models::BertConfig asked = models::BertConfig::from_config(model_section);
      const std::string diff = config.first_difference(asked);
      if (!diff.empty())
        ENGINE_FAIL("[pretrain_app] ", args.init, ": the checkpoint's model config differs from ",
                    args.config, " at model.", diff, " (checkpoint vs config); drop the model "
                    "section from the config to use the checkpoint's");
    } else {
      model_section.finish();
    }
  } else {
    config = models::BertConfig::from_config(model_section);
  }
  root.finish();

  models::BertForMaskedLM model(config, seed);
  if (!args.init.empty()) models::load_checkpoint(args.init, model);
  print_parameter_counts(model);
  if (args.count_params) return 0;

  if (args.batch_file.empty())
    ENGINE_FAIL("[pretrain_app] --batch-file is required: this version trains on one fixed batch "
                "(corpus pretraining is not implemented yet)");
  models::MlmBatch batch = models::load_mlm_batch(args.batch_file, config);
  model.train(false);  // single-batch mode: dropout off
  engine::Generator gen(seed);

  engine::FlatParameters flat(model.named_parameters());
  // No weight decay on biases and LayerNorm parameters (BERT's rule).
  engine::AdamW opt(flat, adam, [](const std::string& n) { return !engine::default_no_decay(n); });

  if (!args.dump.empty()) {
    models::MlmOutput out = model.forward(batch.inputs, batch.labels, gen);
    out.loss.backward();
    engine::NamedTensors dump = {{"loss", out.loss.detach()},
                                 {"logits", out.logits.detach()},
                                 {"targets", out.targets}};
    for (auto& [name, t] : model.named_parameters()) dump.emplace_back("grad." + name, t.grad());
    engine::save_safetensors(args.dump, dump);
    flat.zero_grad();
    std::printf("dump: loss, logits (%lld x %lld) and %zu gradients written to %s\n",
                (long long)out.logits.size(0), (long long)out.logits.size(1), dump.size() - 3,
                args.dump.c_str());
  }

  if (args.steps == 0) {
    engine::NoGrad ng;
    models::MlmOutput out = model.forward(batch.inputs, batch.labels, gen);
    std::printf("eval loss %.9g\n", out.loss.item());
  }
  for (int64_t k = 1; k <= args.steps; ++k) {
    flat.zero_grad();
    models::MlmOutput out = model.forward(batch.inputs, batch.labels, gen);
    out.loss.backward();
    std::printf("step %lld loss %.9g\n", (long long)k, out.loss.item());
    std::fflush(stdout);
    opt.step(adam.lr);
  }
  if (!args.save.empty()) {
    models::save_checkpoint(args.save, model);
    std::printf("saved %s\n", args.save.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse_args(argc, argv);
  try {
    return run(args);
  } catch (const engine::Error& e) {
    std::cerr << "pretrain_app: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "pretrain_app: unexpected error: " << e.what() << "\n";
    return 1;
  }
}
