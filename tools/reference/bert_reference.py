"""An independent PyTorch implementation of the engine's BERT + MLM head for every positional
preset of docs/positional-encodings.md, reading the engine's checkpoints (parameter names of
docs/checkpoint.md, model config in the safetensors metadata).

It is written from the formulas, not from the engine's code, and deliberately takes other routes
where the engine is clever: Shaw's relative vectors are materialised as a (T, T, d_h) tensor, the
T5 buckets come from exact integer comparisons, the [CLS] reset is an indexed assignment, and
bert_a_d's four terms are four separate products.

Train mode: given a dropout stream (dropout_reference.DropoutStream), mlm() applies dropout at
the model's sites in forward order, each drawing the next mask from the stream: the input x^0,
then per layer the attention probabilities (after softmax and the key mask), the attention
branch and the FFN branch before their residual additions; the masks drawn are kept in
self.masks as (site, bool array) pairs.
"""
import math

import torch
import torch.nn.functional as F

# preset -> (input positions, relative term, absolute term in attention)
_SINGLES = {
    "no_pe": ("none", "none", "none"),
    "bert_a": ("learned", "none", "none"),
    "sin_ape": ("sin", "none", "none"),
    "learnable_sin_ape": ("learnable_sin", "none", "none"),
    "bert_r": ("learned", "t5", "none"),
    "learned_rpe": ("none", "shaw", "none"),
    "sin_rpe": ("none", "shaw_sin", "none"),
    "learnable_sin_rpe": ("none", "shaw_learnable_sin", "none"),
    "tupe_a": ("none", "none", "untied"),
    "tupe_r": ("none", "t5", "untied"),
    "tupe_a_tie_cls": ("none", "none", "untied"),
    "bert_a_d": ("none", "none", "decomposed"),
    "rope": ("none", "rope", "none"),
    "alibi": ("none", "alibi", "none"),
}


def parts(preset):
    if "+" in preset:
        a, r = preset.split("+")
        return _SINGLES[a][0], _SINGLES[r][1], "none"
    return _SINGLES[preset]


def t5_bucket(r, num_buckets=32, max_distance=128):
    """Exact: the largest b with n >= max_exact * (max_distance / max_exact) ** (b / (half - max_exact)),
    compared as integers, n ** k * me ** b >= md ** b * me ** k."""
    half = num_buckets // 2
    me = half // 2
    k = half - me
    base = half if r > 0 else 0
    n = abs(r)
    if n < me:
        return base + n
    b = 0
    while b + 1 < k and n ** k * me ** (b + 1) >= max_distance ** (b + 1) * me ** k:
        b += 1
    return base + me + b


def sinusoid(pos, freqs):
    ang = pos[:, None] * freqs[None, :]
    return torch.stack([torch.sin(ang), torch.cos(ang)], dim=-1).reshape(pos.shape[0], -1)


def freqs_for(width):
    return torch.tensor([10000.0 ** (-2.0 * k / width) for k in range(width // 2)], dtype=torch.float32)


def layer_norm(x, P, prefix, eps):
    return F.layer_norm(x, x.shape[-1:], P[prefix + ".weight"], P[prefix + ".bias"], eps)


def linear(x, P, prefix):
    return F.linear(x, P[prefix + ".weight"], P[prefix + ".bias"])


def alibi_slopes(H):
    """Press et al.'s slopes, as their code computes them: 2 ** (-8 / n) to the powers 1..n for n
    a power of two; otherwise those of the largest power of two below H, then every other one of
    twice that."""
    def pow2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]
    if math.log2(H).is_integer():
        return pow2(H)
    n = 2 ** math.floor(math.log2(H))
    return pow2(n) + alibi_slopes(2 * n)[0::2][:H - n]


def rope(x):
    """RoFormer's rotation of (..., T, d_h) by theta_{t,i} = t * 10000^(-2i/d_h), as complex
    multiplication of the pairs (2i, 2i+1) by exp(i theta) (float64 angles)."""
    T, dh = x.shape[-2], x.shape[-1]
    inv = 10000.0 ** (-torch.arange(0, dh, 2, dtype=torch.float64) / dh)
    theta = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]  # (T, d_h / 2)
    rot = torch.polar(torch.ones_like(theta), theta).to(torch.complex64)
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], dh // 2, 2).contiguous())
    return torch.view_as_real(xc * rot).reshape(x.shape).to(x.dtype)


class Reference:
    def __init__(self, cfg, params, prefix="bert.", head="mlm.", shared=None):
        """cfg: the engine's model config (dict); params: name -> tensor (made leaves here).

        prefix, head: where this encoder's and its MLM head's parameters are (ELECTRA's
        generator: "generator.bert.", "generator.mlm."); the embeddings (token, segment, input
        LayerNorm, the position table and frequencies) are always bert.*'s, shared. shared: the
        leaves of another Reference (self.P), to use the same tensors."""
        self.cfg = cfg
        self.pre, self.head = prefix, head
        self.P = shared if shared is not None else {
            n: t.detach().clone().float().requires_grad_(True) for n, t in params.items()}
        self.width = cfg.get("embedding_size", cfg["hidden_size"])  # of the embeddings
        pos = cfg["position"]
        self.input, self.relative, self.absolute = parts(pos["preset"])
        self.reset = pos["preset"] in ("tupe_a", "tupe_r")
        self.cls_code = self.reset and pos["cls_reset"] == "code"
        self.stream = None  # a dropout stream: train mode
        self.masks = []
        # Train mode with PyTorch's own dropout (F.dropout) instead of the engine's stream: for
        # speed comparisons (bench/bench_step.py), where the masks need not match.
        self.native_dropout = False
        self._index_cache = {}  # constant index tensors (T5 buckets, Shaw offsets) by key

    def _dropout(self, x, p, site, attention=False):
        """attention: the attention probabilities' rule (16-bit draws, dropout_reference.py)."""
        if self.native_dropout and p > 0:
            return F.dropout(x, p, training=True)
        if self.stream is None or p == 0:
            return x
        if p == 1:
            return x * 0
        draw = self.stream.keep16 if attention else self.stream.keep
        keep = draw(tuple(x.shape), p)
        self.masks.append((site, keep))
        return x * (torch.from_numpy(keep).to(x.dtype) * (1.0 / (1.0 - p)))

    # ---- positional terms ------------------------------------------------------------------
    def _heads(self, x):  # (n, d) -> (H, n, d_h)
        H = self.cfg["num_heads"]
        return x.view(x.shape[0], H, -1).transpose(0, 1)

    def _t5_bias(self, T):
        pos = self.cfg["position"]
        nb = pos["relative_buckets"]
        idx = self._index_cache.get(("t5", T))
        if idx is None:
            idx = [[t5_bucket(j - i, nb, pos["relative_max_distance"]) for j in range(T)] for i in range(T)]
            idx = torch.tensor(idx)
            if self.cls_code:
                idx[:, 0] = nb + 1   # others -> [CLS]
                idx[0, :] = nb       # [CLS] -> others, including itself
            self._index_cache[("t5", T)] = idx
        return self.P[self.pre + "position.relative_table"][idx].permute(2, 0, 1)  # (H, T, T)

    def _untied(self, T):
        P, cfg = self.P, self.cfg
        dh = cfg["hidden_size"] // cfg["num_heads"]
        pre = self.pre
        rows = P["bert.position.table"][:T]
        if self.reset:
            rows = torch.cat([rows, P[pre + "position.cls_theta"]], 0)
        rows = layer_norm(rows, P, pre + "position.norm", cfg["layer_norm_eps"])
        pq = self._heads(linear(rows, P, pre + "position.query"))
        pk = self._heads(linear(rows, P, pre + "position.key"))
        s = 1.0 / math.sqrt(2 * dh)
        v = pq[:, :T] @ pk[:, :T].transpose(1, 2) * s
        rel = self._t5_bias(T) if self.relative == "t5" else None
        if rel is not None and not self.cls_code:
            v = v + rel
        if self.reset:
            th1 = (pq[:, T] * pk[:, T]).sum(-1) * s
            th2 = (pq[:, T + 1] * pk[:, T + 1]).sum(-1) * s
            v = v.clone()
            v[:, 0, :] = th1[:, None].expand(-1, T)
            v[:, 1:, 0] = th2[:, None].expand(-1, T - 1)
        if rel is not None and self.cls_code:
            v = v + rel
        return v

    def _shaw_table(self):
        pos, P = self.cfg["position"], self.P
        c = pos["rpe_clip"]
        dh = self.cfg["hidden_size"] // self.cfg["num_heads"]
        r = torch.arange(-c, c + 1, dtype=torch.float32)
        if self.relative == "shaw":
            return P[self.pre + "position.shaw_table"]
        if self.relative == "shaw_sin":
            return sinusoid(r, freqs_for(dh))
        return sinusoid(r, P[self.pre + "position.shaw_freq"])

    # ---- the model -------------------------------------------------------------------------
    def embed(self, ids, types=None):
        """LN(token (+ segment) (+ position)): (B, T, e), e the embedding width; the first
        layer's input x^0 after dropout and project()."""
        P, cfg = self.P, self.cfg
        T = ids.shape[1]
        d = self.width
        x = P["bert.embeddings.token"][ids]
        if cfg["type_vocab_size"] > 0:
            x = x + P["bert.embeddings.segment"][types if types is not None else torch.zeros_like(ids)]
        if self.input == "learned":
            x = x + P["bert.position.table"][:T]
        elif self.input == "sin":
            x = x + sinusoid(torch.arange(T, dtype=torch.float32), freqs_for(d))
        elif self.input == "learnable_sin":
            x = x + sinusoid(torch.arange(T, dtype=torch.float32), P["bert.position.freq"])
        return layer_norm(x, P, "bert.embeddings.norm", cfg["layer_norm_eps"])

    def project(self, x):
        """The embedding width to the hidden size, when they differ (ELECTRA)."""
        if self.width == self.cfg["hidden_size"]:
            return x
        return linear(x, self.P, self.pre + "embeddings.project")

    def positional(self, T):
        """The terms every layer shares: additive bias (H, T, T), Shaw vectors (T, T, d_h),
        bert_a_d's p U^Q, p U^K (1, H, T, d_h); None where the preset has none."""
        P, cfg = self.P, self.cfg
        bias = shaw = pq = pk = None
        if self.absolute == "untied":
            bias = self._untied(T)
        elif self.relative == "t5":
            bias = self._t5_bias(T)
        elif self.relative == "alibi":
            m = torch.tensor(alibi_slopes(cfg["num_heads"]), dtype=torch.float32)
            dist = (torch.arange(T)[None, :] - torch.arange(T)[:, None]).abs().float()
            bias = -m[:, None, None] * dist[None]
        if self.relative.startswith("shaw"):
            c = cfg["position"]["rpe_clip"]
            idx = torch.tensor([[max(-c, min(c, j - i)) + c for j in range(T)] for i in range(T)])
            shaw = self._shaw_table()[idx]  # (T, T, d_h)
        if self.absolute == "decomposed":
            p = P["bert.position.table"][:T]
            pq = self._heads(linear(p, P, self.pre + "position.query"))[None]
            pk = self._heads(linear(p, P, self.pre + "position.key"))[None]
        return bias, shaw, pq, pk

    def layer_logits(self, l, h, terms):
        """Layer l's attention logits for attention input h (B, T, d), before the mask: (B, H, T, T);
        and the values (B, H, T, d_h)."""
        P, cfg = self.P, self.cfg
        bias, shaw, pq, pk = terms
        B, T, d = h.shape
        H = cfg["num_heads"]
        dh = d // H
        pre = f"{self.pre}encoder.layer.{l}."
        qkv = linear(h, P, pre + "attention.qkv").view(B, T, 3, H, dh).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        if self.relative == "rope":
            q, k = rope(q), rope(k)
        if self.absolute == "decomposed":
            logits = (q @ k.transpose(-1, -2) + q @ pk.transpose(-1, -2) +
                      pq @ k.transpose(-1, -2) + pq @ pk.transpose(-1, -2)) / math.sqrt(4 * dh)
        elif self.absolute == "untied":
            logits = q @ k.transpose(-1, -2) / math.sqrt(2 * dh)
        else:
            logits = q @ k.transpose(-1, -2) / math.sqrt(dh)
        if shaw is not None:
            logits = logits + torch.einsum("bhid,ijd->bhij", q, shaw) / math.sqrt(dh)
        if bias is not None:
            logits = logits + bias[None]
        return logits, v

    def first_layer_logits(self, ids):
        """The first layer's logits (B, H, T, T) for ids (B, T): identical-word probing."""
        x = self.project(self.embed(ids))
        if self.cfg["pre_layer_norm"]:
            x = layer_norm(x, self.P, self.pre + "encoder.layer.0.attention_norm",
                           self.cfg["layer_norm_eps"])
        return self.layer_logits(0, x, self.positional(ids.shape[1]))[0]

    def encode(self, ids, mask, types):
        P, cfg = self.P, self.cfg
        B, T = ids.shape
        d = cfg["hidden_size"]
        eps = cfg["layer_norm_eps"]
        hp, ap = cfg["hidden_dropout"], cfg["attention_dropout"]
        x = self.project(self._dropout(self.embed(ids, types), hp, "embeddings"))
        terms = self.positional(T)
        shaw = terms[1]

        keep = mask[:, None, None, :] != 0
        for l in range(cfg["num_layers"]):
            pre = f"{self.pre}encoder.layer.{l}."

            def attn(h):
                logits, v = self.layer_logits(l, h, terms)
                probs = torch.softmax(logits.masked_fill(~keep, float("-inf")), dim=-1)
                probs = self._dropout(probs, ap, f"layer {l} attention probabilities",
                                      attention=True)
                out = probs @ v
                if shaw is not None:
                    out = out + torch.einsum("bhij,ijd->bhid", probs, shaw)
                return linear(out.transpose(1, 2).reshape(B, T, d), P, pre + "attention.out")

            def ffn(h):
                return linear(F.gelu(linear(h, P, pre + "ffn.fc1")), P, pre + "ffn.fc2")

            def drop(y, what):
                return self._dropout(y, hp, f"layer {l} {what} branch")

            if cfg["pre_layer_norm"]:
                x = x + drop(attn(layer_norm(x, P, pre + "attention_norm", eps)), "attention")
                x = x + drop(ffn(layer_norm(x, P, pre + "ffn_norm", eps)), "ffn")
            else:
                x = layer_norm(x + drop(attn(x), "attention"), P, pre + "attention_norm", eps)
                x = layer_norm(x + drop(ffn(x), "ffn"), P, pre + "ffn_norm", eps)
        if cfg["pre_layer_norm"]:
            x = layer_norm(x, P, self.pre + "encoder.final_norm", eps)
        return x

    def mlm(self, ids, mask, types, labels, stream=None):
        """-> (loss, logits at the predicted positions in row-major order). With a dropout
        stream: train mode, the masks drawn in self.masks."""
        P, cfg = self.P, self.cfg
        self.stream, self.masks = stream, []
        try:
            x = self.encode(ids, mask, types)
        finally:
            self.stream = None
        self.last_hidden = x
        return self.mlm_head(x, labels)

    def mlm_head(self, x, labels):
        """The MLM head on the encoder's output x (B, T, d) at the labelled positions."""
        P, cfg = self.P, self.cfg
        flat = x.reshape(-1, cfg["hidden_size"])
        lab = labels.reshape(-1)
        sel = lab != -100
        h = F.gelu(linear(flat[sel], P, self.head + "dense"))
        h = layer_norm(h, P, self.head + "norm", cfg["layer_norm_eps"])
        logits = h @ P["bert.embeddings.token"].t() + P[self.head + "decoder_bias"]
        return F.cross_entropy(logits, lab[sel]), logits

    def mlm_sop(self, ids, mask, types, labels, order, stream=None):
        """MLM + sentence-order prediction (ALBERT's SOP, the engine's objective mlm_sop):
        -> (loss, MLM logits, MLM loss, SOP loss, SOP logits (B, 2)). The SOP head is BERT's
        pooler on [CLS] (dense -> tanh, no dropout) then a 2-way linear layer; its loss the mean
        cross-entropy over the rows whose label is not -100."""
        mlm_loss, logits = self.mlm(ids, mask, types, labels, stream)
        cls = self.last_hidden[:, 0]
        sop_logits = linear(torch.tanh(linear(cls, self.P, "sop.dense")), self.P, "sop.out")
        sop_loss = F.cross_entropy(sop_logits, order, ignore_index=-100)
        return mlm_loss + sop_loss, logits, mlm_loss, sop_loss, sop_logits


def no_weight_decay(name):
    """Biases and LayerNorm parameters are not decayed (BERT's rule)."""
    comps = name.split(".")
    return comps[-1] in ("bias", "decoder_bias") or (len(comps) > 1 and "norm" in comps[-2])
