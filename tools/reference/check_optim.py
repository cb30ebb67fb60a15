#!/usr/bin/python3
"""The engine's optimizers against PyTorch on the same parameters and gradients.

Writes parameters named like a BERT's (decayed weights, biases and LayerNorm weights, which get no
decay; a tensor of zeros; one crossing LAMB's 4096-element chunks with a partial last vector;
sizes that leave slab padding) and 6 steps of gradients, learning rates and clipping
coefficients; runs tests/reference/optim_driver.cpp (the engine, on --device) and PyTorch
(torch.optim.AdamW; lamb_reference.Lamb, written from the paper and apex's rules) and compares,
for AdamW, LAMB and LAMB with the trust ratio on every tensor: every parameter after each step,
within --tol (1e-5), and each step's update (p_k - p_{k-1}) within --update-tol (1e-4: an update
read back from f32 parameters carries their rounding, ulp(|p|) / |update| ~ 2e-5 here), both as
max|a - b| / max|b| per tensor.
Exit 0 when all are within, 1 otherwise, 77 when PyTorch is missing (CTest: skipped)."""
import argparse
import os
import subprocess
import sys

try:
    import torch
except ImportError:
    print("SKIPPED: /usr/bin/python3 has no torch (Debian: python3-torch)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lamb_reference  # noqa: E402
import safetensors_io as st  # noqa: E402

SHAPES = [("embeddings.word.weight", (3, 4096 + 7)), ("embeddings.LayerNorm.weight", (64,)),
          ("embeddings.LayerNorm.bias", (64,)), ("layer.0.qkv.weight", (64, 37)),
          ("layer.0.qkv.bias", (37,)), ("layer.0.attention_norm.weight", (5,)),
          ("layer.0.zero.weight", (33,)), ("head.weight", (1,)), ("mlm.decoder_bias", (3,))]
STEPS = 6


def no_decay(name):
    """The engine's default_no_decay: a leaf ending in 'bias', or 'norm' in the leaf or its owner."""
    parts = name.split(".")
    leaf, owner = parts[-1], parts[-2] if len(parts) > 1 else ""
    return leaf.endswith("bias") or "norm" in leaf.lower() or "norm" in owner.lower()


def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape in SHAPES:
        if "zero" in name:
            params[name] = torch.zeros(shape)
        elif "norm" in name.lower() and name.endswith("weight"):
            params[name] = 1 + 0.1 * torch.randn(shape, generator=g)
        else:
            params[name] = 0.5 * torch.randn(shape, generator=g)
    grads = [{n: (1 + k) * 0.1 * torch.randn(p.shape, generator=g) for n, p in params.items()}
             for k in range(STEPS)]
    for gr in grads:  # gradients of every size, some exactly 0
        gr["layer.0.qkv.weight"][0, :5] = 0
        gr["layer.0.qkv.weight"][1, :5] = 1e-9
    lrs = [0.01 * (k + 1) for k in range(STEPS)]  # updates well above the parameters' f32 ulp
    scales = [0.37 if k == 2 else 1.0 for k in range(STEPS)]
    return params, grads, lrs, scales


def reference(kind, params, grads, lrs, scales, hp):
    P = {n: p.clone().requires_grad_(True) for n, p in params.items()}
    decay = [p for n, p in P.items() if not no_decay(n)]
    other = [p for n, p in P.items() if no_decay(n)]
    groups = [{"params": decay, "weight_decay": hp["weight_decay"]},
              {"params": other, "weight_decay": 0.0}]
    betas = (hp["beta1"], hp["beta2"])
    if kind == "adamw":
        opt = torch.optim.AdamW(groups, lr=lrs[0], betas=betas, eps=hp["eps"])
    else:
        opt = lamb_reference.Lamb(groups, lr=lrs[0], betas=betas, eps=hp["eps"],
                                  trust_all=kind == "lamb_all")
    out = []
    for k in range(STEPS):
        for n, p in P.items():
            # The engine multiplies each gradient by f32(scale) inside the step (clipping).
            p.grad = grads[k][n] * torch.tensor(scales[k], dtype=torch.float32)
        for grp in opt.param_groups:
            grp["lr"] = lrs[k]
        opt.step()
        out.append({n: p.detach().clone() for n, p in P.items()})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--driver", required=True, help="the optim_driver binary")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--tol", type=float, default=1e-5, help="on every parameter after each step")
    ap.add_argument("--update-tol", type=float, default=1e-4, help="on each step's update")
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.workdir, exist_ok=True)
    params, grads, lrs, scales = make_inputs(5)
    hp = {"beta1": 0.9, "beta2": 0.999, "eps": 1e-6, "weight_decay": 0.01}
    failed = []
    for kind in ("adamw", "lamb", "lamb_all"):
        tensors = {f"param.{n}": p.numpy() for n, p in params.items()}
        for k in range(STEPS):
            tensors.update({f"grad.{k + 1}.{n}": g.numpy() for n, g in grads[k].items()})
        meta = dict(hp, names=",".join(params), optim="adamw" if kind == "adamw" else "lamb",
                    lr=",".join(repr(x) for x in lrs), grad_scale=",".join(repr(x) for x in scales),
                    trust_ratio_all=1 if kind == "lamb_all" else 0)
        inp = os.path.join(args.workdir, f"{kind}_in.safetensors")
        out = os.path.join(args.workdir, f"{kind}_out.safetensors")
        st.write(inp, tensors, meta)
        p = subprocess.run([args.driver, inp, out, "--device", args.device], capture_output=True, text=True)
        if p.returncode != 0:
            print(f"FAILED: {kind}: optim_driver exited {p.returncode}\n{p.stdout}{p.stderr}")
            return 1
        got, _ = st.read(out)
        want = reference(kind, params, grads, lrs, scales, hp)
        worst_p, worst_u = (0.0, ""), (0.0, "")
        for k in range(STEPS):
            for n in params:
                a, b = got[f"step.{k + 1}.{n}"].double(), want[k][n].double()
                before_a = got[f"step.{k}.{n}"].double() if k else params[n].double()
                before_b = want[k - 1][n].double() if k else params[n].double()
                ep = (a - b).abs().max().item() / max(b.abs().max().item(), 1e-30)
                du, dr = a - before_a, b - before_b
                eu = (du - dr).abs().max().item() / max(dr.abs().max().item(), 1e-30)
                worst_p = max(worst_p, (ep, f"step {k + 1} {n}"))
                worst_u = max(worst_u, (eu, f"step {k + 1} {n}"))
                if ep > args.tol or eu > args.update_tol:
                    failed.append(f"{kind} step {k + 1} {n}: parameter {ep:.2e}, update {eu:.2e}")
        print(f"{kind:9s} vs PyTorch, {STEPS} steps on {args.device}: largest relative error of a "
              f"parameter {worst_p[0]:.2e} ({worst_p[1]}), of an update {worst_u[0]:.2e} ({worst_u[1]})")
    for f in failed[:20]:
        print("FAILED:", f)
    if failed:
        return 1
    print(f"OK: every parameter within {args.tol}, every update within {args.update_tol}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
