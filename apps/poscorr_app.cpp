// poscorr_app: dump, draw and measure the learned positional correlations of a checkpoint
// (docs/poscorr.md): .npy matrices, PNG head grids, summary.json of the second paper's properties
// and TUPE's head patterns; or, with --checkpoints, how one head's matrix evolves over training.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/cli.h"
#include "apps/plot/heatmap.h"
#include "engine/backend.h"
#include "engine/error.h"
#include "engine/file_io.h"
#include "engine/npy.h"
#include "models/checkpoint.h"
#include "models/poscorr.h"
#include "models/position/untied.h"
#include "ops/ops.h"

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;
using engine::Tensor;
using models::CorrelationMatrix;

namespace {

const char* kUsage = R"(usage: poscorr_app --checkpoint CKPT --out DIR [options]
       poscorr_app --checkpoints CKPT [CKPT ...] --out DIR [--matrix NAME] [--head H] [options]

Dumps, draws and measures the learned positional correlations of a checkpoint written by
pretrain_app or finetune_app --save-model (any preset). For the checkpoint's preset it writes:
  tupe_term        TUPE (tupe_a, tupe_r, tupe_a_tie_cls): the (H, T, T) positional term after the
                   [CLS] reset, with the relative bias for tupe_r
  ape_dot, ape_qk  absolute presets: P P^T, and the first layer's per-head (p_i W^Q)(p_j W^K) / sqrt(d_h)
  decomposed_term  bert_a_d: (p_i U^Q)(p_j U^K) / sqrt(4 d_h) per head
  relative_bias    T5-bias presets (bert_r, tupe_r): the bias per head and offset j - i, (H, 2T - 1)
  rpe_dot          Shaw presets: a_r . a_s between relative vectors, r, s in [-clip, clip]
  alibi_bias       alibi: the fixed bias -m_h |j - i| per head
  rope_decay       rope: mean_k cos((j - i) theta_k), the rotation's decay with distance
  probe_logits     every preset: identical-word probing, the first layer's logits for a sequence
                   of one repeated token, averaged over --probe-tokens random tokens
each as NAME.npy (numpy.load) and NAME.png (one panel per head, shared colour scale), and
summary.json: per head, translation invariance, symmetry, the monotonic windows, and for logit
matrices the pattern (global / local / broad / previous / next). Definitions: docs/poscorr.md.

With --checkpoints (one or more, in training order, all of one model config), it draws how one
head's matrix evolves: evolution_NAME_headH.{npy,png} and evolution.json.

options:
  --checkpoint CKPT      the checkpoint to dump
  --checkpoints A B ...  checkpoints of one run, in order (every argument up to the next flag)
  --out DIR              output folder (created)
  --max-positions T      positions drawn (default 128, or the model's max_positions if smaller)
  --matrix NAME          with --checkpoints: the matrix to follow (default tupe_term, else ape_qk,
                         else relative_bias, else probe_logits)
  --head H               with --checkpoints: the head to follow (default 0)
  --probe-tokens N       random tokens averaged by the identical-word probe (default 10)
  --probe-seed S         their seed (default 1234)
  --probe-ids I,J,...    explicit probe token ids instead
  --device DEV           cpu (default), cuda or cuda:N: where the matrices are computed (in the
                         emulation build build-emu/, the emulated GPU)
  --columns N            panels per row in the head grids (default 4)
  --range MIN,MAX        the colour scale of every picture (default: each picture's min and max),
                         to draw runs on one scale
  --version              the version and git commit it was built from
  -h, --help             this text
)";

struct Args {
  std::string checkpoint, out, matrix;
  std::vector<std::string> checkpoints;
  int64_t max_positions = -1, head = 0;
  engine::Device device = engine::Device::cpu();
  plot::GridOptions grid;  // what every picture shares: panels per row, the colour range
  models::ProbeOptions probe;
};

Args parse_args(int argc, char** argv) {
  Args a;
  cli::ArgParser p("poscorr_app", kUsage, argc, argv);
  while (p.next()) {
    const std::string& arg = p.arg();
    if (arg == "--checkpoint")
      a.checkpoint = p.value();
    else if (arg == "--checkpoints")
      a.checkpoints = p.values_until_flag();
    else if (arg == "--out")
      a.out = p.value();
    else if (arg == "--matrix")
      a.matrix = p.value();
    else if (arg == "--max-positions")
      a.max_positions = p.int_value(2);
    else if (arg == "--head")
      a.head = p.int_value(0);
    else if (arg == "--device")
      a.device = p.device_value();
    else if (arg == "--columns")
      a.grid.columns = p.int_value(1);
    else if (arg == "--probe-tokens")
      a.probe.tokens = p.int_value(1);
    else if (arg == "--probe-seed")
      a.probe.seed = uint64_t(p.int_value(0));
    else if (arg == "--probe-ids") {
      std::stringstream ss(p.value());
      std::string item;
      while (std::getline(ss, item, ',')) a.probe.ids.push_back(p.to_int("--probe-ids", item, 0));
      if (a.probe.ids.empty()) p.fail("--probe-ids expects a comma-separated list of token ids");
    } else if (arg == "--range") {
      const std::string v = p.value();
      const size_t comma = v.find(',');
      if (comma == std::string::npos) p.fail("--range expects MIN,MAX, got '" + v + "'");
      a.grid.range_min = p.to_double("--range", v.substr(0, comma), -1e30, 1e30);
      a.grid.range_max = p.to_double("--range", v.substr(comma + 1), -1e30, 1e30);
      if (a.grid.range_max <= a.grid.range_min)
        p.fail("--range expects MIN < MAX, got '" + v + "'");
      a.grid.has_range = true;
    } else
      p.unknown();
  }
  if (a.checkpoint.empty() == a.checkpoints.empty())
    p.fail(a.checkpoint.empty() ? "--checkpoint or --checkpoints is required"
                                : "give --checkpoint or --checkpoints, not both");
  if (a.out.empty()) p.fail("--out is required");
  if (a.checkpoints.empty() && (!a.matrix.empty() || a.head != 0))
    p.fail("--matrix and --head go with --checkpoints");
  return a;
}

// A checkpoint's encoder, loaded on the CPU and moved to `device`, with its training step when it
// records one.
struct Loaded {
  std::unique_ptr<models::BertModel> bert;
  std::unique_ptr<engine::FlatParameters> on_device;  // the parameters' slab on the device
  int64_t step = -1;
};

Loaded load(const std::string& path, engine::Device device) {
  ENGINE_CHECK(fs::is_regular_file(path), "[poscorr] ", path, ": no such checkpoint file");
  Loaded l;
  engine::Generator init(0);
  l.bert = std::make_unique<models::BertModel>(models::read_checkpoint_config(path), init);
  const engine::SafetensorsContents rest = models::load_bert_encoder(path, *l.bert);
  // A training checkpoint records its step; read that scalar alone, not the optimizer state.
  if (std::find(rest.skipped.begin(), rest.skipped.end(), "trainer.step") != rest.skipped.end()) {
    Tensor step = Tensor::zeros({}, engine::DType::i64);
    engine::load_safetensors_into(path, {{"trainer.step", step}}, engine::ExtraTensors::skip);
    l.step = int64_t(step.item());
  }
  if (!device.is_cpu()) {
    engine::check_device(device);
    l.on_device = std::make_unique<engine::FlatParameters>(l.bert->named_parameters(), device);
  }
  return l;
}

int64_t positions_for(const Args& a, const models::BertConfig& c) {
  if (a.max_positions > 0) {
    ENGINE_CHECK(!c.position.has_position_table() || a.max_positions <= c.max_positions,
                 "[poscorr] --max-positions ", a.max_positions,
                 " exceeds the checkpoint's max_positions ", c.max_positions, " (preset ",
                 c.position.preset, " has a learned position table)");
    return a.max_positions;
  }
  return c.position.has_position_table() ? std::min<int64_t>(128, c.max_positions) : 128;
}

// One matrix k of a family as a row-major (R, C) array; a per-offset row becomes its Toeplitz
// (T, T) matrix for measuring.
std::vector<float> slice(const CorrelationMatrix& m, int64_t k) {
  return m.values.select(0, k).contiguous().to_vector<float>();
}
std::vector<float> square(const CorrelationMatrix& m, int64_t k, int64_t* n) {
  std::vector<float> v = slice(m, k);
  if (m.per_offset) {
    *n = (m.values.size(2) + 1) / 2;
    return models::toeplitz_of_offsets(v.data(), *n);
  }
  *n = m.values.size(1);
  return v;
}

json measures(const CorrelationMatrix& m, int64_t k) {
  int64_t n = 0;
  const std::vector<float> v = square(m, k, &n);
  const models::Properties p = models::measure(v.data(), n, m.first);
  json j = {{"translation_invariance", p.translation_invariance},
            {"symmetry", p.symmetry},
            {"profile_peak_offset", p.profile_peak},
            {"monotonic_window_forward", p.window_forward},
            {"monotonic_window_backward", p.window_backward},
            {"min", p.min},
            {"max", p.max}};
  if (m.logits) {
    const models::Pattern pt = models::classify_pattern(v.data(), n, m.first);
    j["pattern"] = pt.name;
    j["pattern_entropy"] = pt.entropy;
    j["pattern_peak_offset"] = pt.peak_offset;
    j["pattern_local_mass"] = pt.local_mass;
  }
  return j;
}

std::string axes_line(const CorrelationMatrix& m) {
  return "rows: " + m.row_axis + ", columns: " + m.col_axis +
         (m.first ? "; [CLS] row and column = theta" : "");
}

// The picture of one matrix family: a panel per head (titled with its pattern), or one panel.
void draw(const CorrelationMatrix& m, const std::string& path, const Args& a,
          const json& per_head) {
  std::vector<plot::Panel> panels;
  plot::GridOptions o = a.grid;
  o.title = m.title;
  o.subtitle = axes_line(m);
  o.colorbar_label = m.logits ? "logit" : "dot product";
  if (!m.per_offset && m.first > 0) {
    o.separate_first = m.first;  // the [CLS] row and column on a scale of their own
    o.subtitle += " (own scale)";
  }
  const int64_t k = m.values.size(0), r = m.values.size(1), c = m.values.size(2);
  if (m.per_offset) {  // all heads in one panel: a row per head, a column per offset
    plot::Panel p{"heads 0-" + std::to_string(k - 1),       k, c,
                  m.values.contiguous().to_vector<float>(), 0, m.col_start};
    panels.push_back(p);
    o.panel_width = std::clamp<int64_t>(2 * c, 256, 1024);
    o.panel_height = std::max<int64_t>(96, 16 * k);
    o.subtitle = "rows: head, columns: offset j - i";
  } else {
    for (int64_t h = 0; h < k; ++h) {
      std::string title = m.per_head ? "head " + std::to_string(h) : "all heads";
      if (m.logits && m.per_head) title += ": " + per_head[size_t(h)]["pattern"].get<std::string>();
      panels.push_back({title, r, c, slice(m, h), m.row_start, m.col_start});
    }
    // At least a pixel per cell up to 512 positions (a smaller box would skip rows and columns).
    o.panel_width = o.panel_height =
        std::clamp<int64_t>(std::max(r, c), m.per_head ? 256 : 384, 512);
  }
  plot::write_heatmap_grid(path, panels, o);
}

int dump_one(const Args& a) {
  Loaded l = load(a.checkpoint, a.device);
  const models::BertConfig& c = l.bert->config();
  const int64_t t = positions_for(a, c);
  fs::create_directories(a.out);
  std::vector<int64_t> probe_ids;
  const std::vector<CorrelationMatrix> ms =
      models::extract_correlations(*l.bert, t, a.probe, &probe_ids);
  json summary = {{"checkpoint", a.checkpoint},
                  {"preset", c.position.preset},
                  {"cls_reset", models::cls_reset_name(c.position.cls_reset)},
                  {"num_layers", c.num_layers},
                  {"num_heads", c.num_heads},
                  {"hidden_size", c.hidden_size},
                  {"positions", t},
                  {"probe_token_ids", probe_ids}};
  if (l.step >= 0) summary["step"] = l.step;
  if (c.position.cls_reset != models::ClsReset::none) {
    engine::NoGrad ng;
    auto [t1, t2] = models::untied_term_of(*l.bert->position).cls_thetas();
    summary["cls_theta1"] = t1.to_vector<float>();
    summary["cls_theta2"] = t2.to_vector<float>();
  }
  json& out = summary["matrices"];
  out = json::object();
  for (const CorrelationMatrix& m : ms) {
    const int64_t k = m.values.size(0);
    // .npy shapes: (H, T, T) per head, (H, 2T - 1) per offset, (R, C) single.
    Tensor v = m.per_offset ? m.values.view({k, m.values.size(2)})
               : m.per_head ? m.values
                            : m.values.select(0, 0);
    engine::save_npy((fs::path(a.out) / (m.name + ".npy")).string(), v);
    json heads = json::array();
    for (int64_t h = 0; h < k; ++h) heads.push_back(measures(m, h));
    draw(m, (fs::path(a.out) / (m.name + ".png")).string(), a, heads);
    json entry = {{"npy", m.name + ".npy"},
                  {"png", m.name + ".png"},
                  {"shape", v.shape()},
                  {"description", m.description},
                  {"measured_from_position", m.first},
                  {"row_start", m.row_start},
                  {"col_start", m.col_start}};
    if (m.per_head || m.per_offset)
      entry["heads"] = heads;
    else
      entry["properties"] = heads[0];
    out[m.name] = entry;
    std::printf("%-16s %-14s", m.name.c_str(), engine::shape_str(v.shape()).c_str());
    if (m.logits)
      for (int64_t h = 0; h < k; ++h)
        std::printf(" %s", heads[size_t(h)]["pattern"].get<std::string>().c_str());
    std::printf("\n");
  }
  engine::write_file_atomic((fs::path(a.out) / "summary.json").string(), summary.dump(2) + "\n",
                            "poscorr");
  std::printf("wrote %zu matrices (.npy, .png) and summary.json to %s\n", ms.size(), a.out.c_str());
  return 0;
}

std::string default_matrix(const std::vector<CorrelationMatrix>& ms) {
  for (const char* name : {"tupe_term", "ape_qk", "decomposed_term", "relative_bias"})
    for (const auto& m : ms)
      if (m.name == name) return name;
  return "probe_logits";
}

int evolution(const Args& a) {
  fs::create_directories(a.out);
  std::vector<plot::Panel> panels;
  std::vector<Tensor> frames;
  json entries = json::array();
  models::BertConfig first_config;
  std::string name;
  int64_t t = 0;
  bool logits = false;
  int64_t first = 0;
  for (size_t i = 0; i < a.checkpoints.size(); ++i) {
    const std::string& path = a.checkpoints[i];
    Loaded l = load(path, a.device);
    const models::BertConfig& config = l.bert->config();
    if (i == 0) {
      first_config = config;
      t = positions_for(a, config);
      ENGINE_CHECK(a.head < config.num_heads, "[poscorr] --head ", a.head, " but the model has ",
                   config.num_heads, " heads");
    } else {
      const std::string diff = config.first_difference(first_config);
      ENGINE_CHECK(diff.empty(), "[poscorr] ", path, ": another model than ", a.checkpoints[0],
                   " at model.", diff, " (all --checkpoints must be one run's)");
    }
    const std::vector<CorrelationMatrix> ms = models::extract_correlations(*l.bert, t, a.probe);
    if (i == 0) name = a.matrix.empty() ? default_matrix(ms) : a.matrix;
    const CorrelationMatrix* m = nullptr;
    std::string have;
    for (const auto& x : ms) {
      if (x.name == name) m = &x;
      have += (have.empty() ? "" : ", ") + x.name;
    }
    ENGINE_CHECK(m, "[poscorr] --matrix ", name, ": preset ", config.position.preset, " has ",
                 have);
    const int64_t k = m->per_head ? a.head : 0;
    const Tensor frame = m->values.select(0, k).contiguous();  // (R, C); (1, 2T - 1) per offset
    frames.push_back(frame.unsqueeze(0));
    logits = m->logits;
    first = m->per_offset ? 0 : m->first;
    json e = {{"checkpoint", path}, {"properties", measures(*m, k)}};
    if (l.step >= 0) e["step"] = l.step;
    const std::string label =
        l.step >= 0 ? "step " + std::to_string(l.step) : fs::path(path).stem().string();
    std::string title = label;
    if (m->logits && !m->per_offset) title += ": " + e["properties"]["pattern"].get<std::string>();
    panels.push_back({title, frame.size(0), frame.size(1), frame.to_vector<float>(), m->row_start,
                      m->col_start});
    entries.push_back(e);
    std::printf("%s %s\n", path.c_str(), e["properties"].dump().c_str());
  }
  const std::string stem = "evolution_" + name + "_head" + std::to_string(a.head);
  Tensor all = engine::concat(frames, 0);
  engine::save_npy((fs::path(a.out) / (stem + ".npy")).string(), all);
  plot::GridOptions o = a.grid;
  o.title = first_config.position.preset + ": " + name + ", head " + std::to_string(a.head) +
            " over training";
  o.subtitle = name == "relative_bias" ? "columns: offset j - i"
                                       : "rows: query position i, columns: key position j";
  o.colorbar_label = logits ? "logit" : "dot product";
  // TUPE's [CLS] row and column (the reset's theta) would wash out the rest of the scale.
  if (first > 0) {
    o.separate_first = first;
    o.subtitle += "; [CLS] row and column on their own scale";
  }
  if (panels[0].rows == 1)
    o.panel_height = 48, o.panel_width = std::clamp<int64_t>(2 * panels[0].cols, 256, 1024);
  else
    o.panel_width = o.panel_height =
        std::clamp<int64_t>(std::max(panels[0].rows, panels[0].cols), 256, 512);
  plot::write_heatmap_grid((fs::path(a.out) / (stem + ".png")).string(), panels, o);
  json doc = {{"matrix", name},       {"head", a.head},       {"positions", t},
              {"npy", stem + ".npy"}, {"png", stem + ".png"}, {"checkpoints", entries}};
  engine::write_file_atomic((fs::path(a.out) / "evolution.json").string(), doc.dump(2) + "\n",
                            "poscorr");
  std::printf("wrote %s.{npy,png} and evolution.json to %s\n", stem.c_str(), a.out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse_args(argc, argv);
  try {
    return a.checkpoints.empty() ? dump_one(a) : evolution(a);
  } catch (const std::exception& e) {
    std::cerr << "poscorr_app: " << e.what() << "\n";
    return 1;
  }
}
