#!/usr/bin/env python3
"""GPT-mini in PyTorch, the cross-check of examples/gpt/model.cpp.

    gpt_reference.py WEIGHTS.safetensors

The file (written by the C++ test) holds the model's parameters under the
names of docs/GPT_MINI.md plus three extra tensors:
  __tokens__  int64 [B, T]   inputs
  __targets__ int64 [B, T]   targets
  __config__  int64 [5]      vocab, seq, dim, layers, heads
and, optionally, grad.<name> for each parameter: the C++ gradients of the
loss. The script builds the same model in PyTorch (torch only; safetensors is
read with json + struct), runs forward and backward in float64 for a clean
reference, and prints
  loss <value>
  max_grad_rel_err <value>     (only when gradients are in the file)
"""
import json
import math
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64, "BF16": torch.bfloat16}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        lo, hi = e["data_offsets"]
        t = torch.frombuffer(bytearray(body[lo:hi]), dtype=DTYPES[e["dtype"]]) if hi > lo else \
            torch.empty(0, dtype=DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"]).clone()
    return out


class Block(nn.Module):
    def __init__(self, d, h, sdpa=False):
        super().__init__()
        self.h = h
        self.sdpa = sdpa  # F.scaled_dot_product_attention (gpt --attention sdpa)
        self.ln1 = nn.LayerNorm(d, eps=1e-5)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d, eps=1e-5)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.h
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q = q.view(B, T, self.h, hs).transpose(1, 2)
        k = k.view(B, T, self.h, hs).transpose(1, 2)
        v = v.view(B, T, self.h, hs).transpose(1, 2)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            att = F.softmax(att.masked_fill(future, float("-inf")), dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, seq, dim, layers, heads, sdpa=False):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList([Block(dim, heads, sdpa) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim, eps=1e-5)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def main():
    t = read_safetensors(sys.argv[1])
    vocab, seq, dim, layers, heads = (int(v) for v in t.pop("__config__"))
    idx, targets = t.pop("__tokens__"), t.pop("__targets__")
    grads = {k[len("grad."):]: t.pop(k) for k in list(t) if k.startswith("grad.")}
    model = GPT(vocab, seq, dim, layers, heads).double()
    names = [n for n, _ in model.named_parameters()]
    if sorted(names) != sorted(t):
        sys.exit("parameter names differ:\n python %s\n file   %s" % (names, sorted(t)))
    model.load_state_dict({k: v.double() for k, v in t.items()}, strict=True)
    logits = model(idx)
    loss = F.cross_entropy(logits.view(-1, vocab), targets.view(-1))
    loss.backward()
    print("loss %.10f" % loss.item())
    if grads:
        worst = 0.0
        for n, p in model.named_parameters():
            g = grads[n].double()
            err = (p.grad - g).abs().max().item() / max(p.grad.abs().max().item(), 1e-12)
            worst = max(worst, err)
        print("max_grad_rel_err %.3e" % worst)


if __name__ == "__main__":
    main()
