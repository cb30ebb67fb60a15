"""LAMB in PyTorch, written from You et al. 2019 (arXiv:1904.00962, Algorithm 2) with the choices of
NVIDIA's BERT pretraining, apex's FusedLAMB: bias correction on, (1 - beta1) on the gradient,
AdamW-style decay added to the update, the trust ratio ||p|| / ||u|| per tensor (1 where either
norm is 0), applied where the group's weight decay is non-zero (apex use_nvlamb=False) or to every
tensor with trust_all=True. Independent of the engine: torch f32 tensor ops, the norms torch's."""
import torch


class Lamb(torch.optim.Optimizer):
    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, trust_all=False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.trust_all = trust_all

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            wd, eps, lr = group["weight_decay"], group["eps"], group["lr"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                t = state["step"]
                m, v, g = state["exp_avg"], state["exp_avg_sq"], p.grad
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                update = (m / (1 - beta1 ** t)) / ((v / (1 - beta2 ** t)).sqrt() + eps)
                if wd != 0:
                    update = update + wd * p
                ratio = 1.0
                if self.trust_all or wd != 0:
                    w_norm, u_norm = p.norm().item(), update.norm().item()
                    if w_norm > 0 and u_norm > 0:
                        ratio = w_norm / u_norm
                p.add_(update, alpha=-lr * ratio)
