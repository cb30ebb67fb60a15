// optim_driver IN OUT [--device DEV]: the engine's optimizers on inputs written by
// tools/reference/check_optim.py, for its comparison with PyTorch (CTest reference_optim).
//
// IN (safetensors): "param.<name>" f32 tensors, in the slab's order of the metadata key "names"
// (comma-separated), and "grad.<k>.<name>" for steps k = 1..steps; metadata: optim (adamw |
// lamb), lr and grad_scale (comma-separated, one per step), beta1, beta2, eps, weight_decay,
// trust_ratio_all (0 | 1). Weight decay follows default_no_decay, as in the apps.
// OUT: "step.<k>.<name>", every parameter after each step k.
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/device.h"
#include "engine/error.h"
#include "engine/module.h"
#include "engine/optim.h"
#include "engine/safetensors.h"

using namespace engine;

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  return out;
}

const std::string& meta(const SafetensorsContents& c, const std::string& key) {
  auto it = c.metadata.find(key);
  ENGINE_CHECK(it != c.metadata.end(), "[optim_driver] the input has no metadata '", key, "'");
  return it->second;
}

const Tensor& tensor(const SafetensorsContents& c, const std::string& name) {
  for (const auto& [n, t] : c.tensors)
    if (n == name) return t;
  ENGINE_FAIL("[optim_driver] the input has no tensor '", name, "'");
}

int run(int argc, char** argv) {
  ENGINE_CHECK(argc == 3 || (argc == 5 && std::string(argv[3]) == "--device"),
               "usage: optim_driver IN OUT [--device DEV]");
  const Device device = argc == 5 ? parse_device(argv[4]) : Device::cpu();
  const SafetensorsContents in = load_safetensors(argv[1]);
  const std::vector<std::string> names = split(meta(in, "names"));
  const std::vector<std::string> lrs = split(meta(in, "lr")),
                                 scales = split(meta(in, "grad_scale"));
  ENGINE_CHECK(lrs.size() == scales.size(), "[optim_driver] lr and grad_scale differ in length");
  OptimizerOptions o;
  o.name = meta(in, "optim");
  o.beta1 = std::stod(meta(in, "beta1"));
  o.beta2 = std::stod(meta(in, "beta2"));
  o.eps = std::stod(meta(in, "eps"));
  o.weight_decay = std::stod(meta(in, "weight_decay"));
  o.trust_ratio_all = meta(in, "trust_ratio_all") == "1";

  NamedTensors params;
  for (const std::string& n : names)
    params.emplace_back(n, tensor(in, "param." + n).clone().set_requires_grad());
  FlatParameters flat(params, device);
  std::unique_ptr<Optimizer> opt =
      make_optimizer(flat, o, [](const std::string& n) { return !default_no_decay(n); });
  NamedTensors out;
  for (size_t k = 1; k <= lrs.size(); ++k) {
    {
      NoGrad ng;
      for (const auto& e : flat.entries())
        e.param.grad().copy_(tensor(in, "grad." + std::to_string(k) + "." + e.name).to(device));
    }
    opt->step(std::stod(lrs[k - 1]), std::stod(scales[k - 1]));
    for (const auto& e : flat.entries())
      out.emplace_back("step." + std::to_string(k) + "." + e.name, e.param.detach().clone());
  }
  save_safetensors(argv[2], out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
