// A user's program: one linear layer, a loss, a backward, then training steps with the library's
// Trainer, all through the installed libengine.
#include <cstdio>

#include "ops/ops.h"
#include "train/trainer.h"

int main() {
  using namespace engine;
  Generator gen(0);
  Tensor w = Tensor::randn({4, 3}, gen, 0.0, 0.02).set_requires_grad();
  Tensor x = Tensor::randn({8, 3}, gen);
  Tensor loss = mean(gelu(linear(x, w)));
  loss.backward();
  std::printf("loss %.6f grad-norm-sq %.3e\n", loss.item(), sum(w.grad() * w.grad()).item());
  if (!w.grad().defined() || w.grad().shape() != Shape{4, 3}) return 1;

  // Fit y = x A^T with the training step: the loss must fall.
  Tensor a = Tensor::randn({2, 3}, gen), y = matmul(x, a.transpose(0, 1));
  NamedTensors params = {{"w", Tensor::zeros({2, 3}).set_requires_grad()}};
  FlatParameters flat(params);
  LinearSchedule schedule(0.05, 5, 100);
  Trainer trainer(flat, OptimizerOptions{}, {}, [&](int64_t s) { return schedule.lr(s); });
  const double weight = 1.0;
  auto loss_of = [&](int64_t) {
    Tensor d = linear(x, params[0].second) - y;
    return mean(d * d);
  };
  double first = 0, last = 0;
  for (int k = 0; k < 60; ++k) {
    const StepStats s = trainer.step(1, loss_of, {&weight, 1});
    if (k == 0) first = s.loss;
    last = s.loss;
  }
  std::printf("trainer: loss %.4f -> %.4f after %lld steps\n", first, last,
              (long long)trainer.steps_taken());
  return last < 0.1 * first ? 0 : 1;
}
