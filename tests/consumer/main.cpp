// A user's program: one linear layer, a loss, a backward through the installed libengine.
#include <cstdio>

#include "ops/ops.h"

int main() {
  using namespace engine;
  Generator gen(0);
  Tensor w = Tensor::randn({4, 3}, gen, 0.0, 0.02).set_requires_grad();
  Tensor x = Tensor::randn({8, 3}, gen);
  Tensor loss = mean(gelu(linear(x, w)));
  loss.backward();
  std::printf("loss %.6f grad-norm-sq %.3e\n", loss.item(), sum(w.grad() * w.grad()).item());
  return w.grad().defined() && w.grad().shape() == Shape{4, 3} ? 0 : 1;
}
