#!/usr/bin/env python3
"""GPT-mini's weights after training under FSDP against plain libtorch's (tests/gpu/run.sh).

    compare_weights.py REFERENCE.safetensors REF.log GOT.safetensors GOT.log --steps S [--tol 1e-5] [--lr 1e-3]

The files are written by fsdp_test_worker's gpt_reference (plain libtorch)
and gpt_parity (FSDP) scenarios (tests/workers/gpt_scenarios.cpp), the logs
hold their "loss <step> <value>" lines. The measure is the one of
tests/test_gpt_parity.cpp, per tensor: ||got - ref|| / ||ref|| over the
elements, in float64; every tensor and every step's loss must be within
--tol. One exception, as there: the key third of qkv.bias has a gradient of
exactly zero in exact arithmetic (it adds the same q.b_k to every score of a
softmax row), so its float gradient is rounding noise that AdamW scales up
to +-lr per step; it is bounded by AdamW's step size (2 * steps * lr) and the
query and value thirds are compared exactly.

Prints one line: "worst <rel> <tensor>  loss <rel>  tensors <n>" and exits 1
when anything is over the bound. torch only (no safetensors package).
"""
import argparse
import os
import re
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from gpt_reference import read_safetensors  # noqa: E402  json + struct, no extra package


def losses(path):
    with open(path, errors="replace") as f:
        # Rank 0's lines, with or without the launcher's "[rank 0] " prefix.
        return [float(m.group(1)) for m in re.finditer(r"^(?:\[rank 0\] )?loss \d+ (\S+)$", f.read(), re.M)]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("ref")
    p.add_argument("ref_log")
    p.add_argument("got")
    p.add_argument("got_log")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--tol", type=float, default=1e-5)
    p.add_argument("--lr", type=float, default=1e-3)
    a = p.parse_args()
    ref, got = read_safetensors(a.ref), read_safetensors(a.got)
    problems = []
    if sorted(ref) != sorted(got):
        problems.append("names differ: only in reference %s, only in run %s"
                        % (sorted(set(ref) - set(got)), sorted(set(got) - set(ref))))
    worst, worst_name = 0.0, "-"
    for name in sorted(set(ref) & set(got)):
        x, y = got[name].double(), ref[name].double()
        if x.shape != y.shape:
            problems.append("%s: shape %s, reference %s" % (name, list(x.shape), list(y.shape)))
            continue
        if name.endswith("qkv.bias"):
            d = y.numel() // 3
            key = (x[d:2 * d] - y[d:2 * d]).abs().max().item()
            if key > 2 * a.steps * a.lr:
                problems.append("%s: key third differs by %.3g > AdamW's bound %.3g" % (name, key, 2 * a.steps * a.lr))
            x, y = torch.cat([x[:d], x[2 * d:]]), torch.cat([y[:d], y[2 * d:]])
        rel = (x - y).norm().item() / max(y.norm().item(), 1e-30)
        if rel > worst:
            worst, worst_name = rel, name
    if worst > a.tol:
        problems.append("%s differs by %.3g > %.3g" % (worst_name, worst, a.tol))
    lr, lg = losses(a.ref_log), losses(a.got_log)
    loss_rel = 0.0
    if len(lr) != a.steps or len(lg) != a.steps:
        problems.append("loss lines: reference %d, run %d, expected %d" % (len(lr), len(lg), a.steps))
    for w, g in zip(lr, lg):
        loss_rel = max(loss_rel, abs(g - w) / max(abs(w), 1e-30))
    if loss_rel > a.tol:
        problems.append("a step's loss differs by %.3g > %.3g" % (loss_rel, a.tol))
    print("worst %.3g %s  loss %.3g  tensors %d  final loss %s" % (
        worst, worst_name, loss_rel, len(ref), ("%.6f" % lg[-1]) if lg else "-"))
    for q in problems:
        print("PROBLEM: " + q)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
