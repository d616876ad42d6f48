#!/usr/bin/env python3
"""Compressed against uncompressed training across two hosts: the validation
loss after the same steps from the same seed (issue 57's training goal).

    python3 bench/compress.py [--build build] [--steps 500] [--strategy full]
                              [--configs off,int8,int4,int4-noef] [--keep DIR]

Two `fsdp run -n 2 --nnodes 2` launchers on this machine, node k with
FSDP_HOST_ID=node-k, so the run composes tiers across two hosts of two
ranks (or, with --strategy hybrid, replica groups of one rank per host) and
FSDP_COMPRESS quantizes what crosses between them. FSDP_SHARE_HOST=off, so
both the parameters' all-gather and the gradients' reduce-scatter cross
quantized (host-shared all-gathers stay exact: docs/COMM.md). Each config:
  off         FSDP_COMPRESS=off (the reference)
  int8, int4, fp8
              FSDP_COMPRESS=X with error feedback
  X-noef      the same with FSDP_COMPRESS_FEEDBACK=off: plain quantized
              gradients, no residuals (what error feedback removes)
  X+share     FSDP_SHARE_HOST=on (host-shared units: their all-gather stays
              exact); off+share is a control of the exact path (at fp32 it
              has matched off bit for bit)
Every run trains GPT-mini (d=128 L=2 h=4, seq 64, batch 4 per rank, the
repository's docs as text, copied once at the start so that every
configuration reads the same bytes (their CRC is printed: runs of two
invocations compare only under the same one), seed 1, one compute thread
per rank) for
--steps steps and evaluates every --eval-every steps; the table gives the
last validation loss and its relative gap to `off`. The goal is |gap| <= 1 %
for the compressed runs with error feedback. Each run is deterministic (the
same configuration gives the same losses), so configurations may be run in
separate invocations; the gaps need `off` in the same one. Not a timing: the
machine may be busy.
"""
import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT = [os.path.join(ROOT, "docs", f) for f in ("GUIDE.md", "DESIGN.md", "COMM.md", "RELIABILITY.md")]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def snapshot_text(folder):
    """The docs copied into `folder` (the text of every run) and their CRC-32."""
    paths, crc = [], 0
    for src in TEXT:
        dst = os.path.join(folder, os.path.basename(src))
        shutil.copyfile(src, dst)
        with open(dst, "rb") as f:
            crc = zlib.crc32(f.read(), crc)
        paths.append(dst)
    return paths, f"{crc:08x}"


def run(a, config):
    """The rank-0 log of one configuration; exits on a failure."""
    compress, feedback, share = config, "on", "off"
    if compress.endswith("+share"):
        compress, share = compress[: -len("+share")], "on"
    if compress.endswith("-noef"):
        compress, feedback = compress[: -len("-noef")], "off"
    port = free_port()
    model = ["--dim", str(a.dim), "--layers", str(a.layers), "--heads", "4", "--seq", "64", "--batch", "4",
             "--threads", "1", "--seed", "1", "--steps", str(a.steps), "--eval-every", str(a.eval_every),
             "--eval-batches", "4", "--log-every", "100000", "--no-progress", "--straggler-factor", "0",
             "--strategy", a.strategy, "--dtype", "fp32", "--lr", str(a.lr)]
    procs = []
    for k in (0, 1):
        env = dict(os.environ, FSDP_HOST_ID=f"node-{k}", FSDP_COMPRESS=compress,
                   FSDP_COMPRESS_FEEDBACK=feedback, FSDP_SHARE_HOST=share, FSDP_PROGRESS="off")
        cmd = [f"{a.build}/bin/fsdp", "run", "--nnodes", "2", "--node-rank", str(k), "--master-addr",
               "127.0.0.1", "--master-port", str(port), "-n", "2", "--", f"{a.build}/bin/gpt", "--text", *a.text,
               *model]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate()[0] for p in procs]
    for p, o in zip(procs, outs):
        if p.returncode:
            sys.exit(f"compress.py: {config} failed ({p.returncode}):\n{o[-4000:]}")
    if a.keep:
        os.makedirs(a.keep, exist_ok=True)
        with open(os.path.join(a.keep, f"{config}.log"), "w") as f:
            f.write(outs[0])
    return outs[0]


def val_losses(log):
    return [(int(m.group(1)), float(m.group(2))) for m in re.finditer(r"step\s+(\d+) \| val loss ([0-9.]+)", log)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--strategy", default="full", choices=["full", "hybrid", "grad_op"])
    ap.add_argument("--configs", default="off,int8,int4,int4-noef")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--keep", help="a folder for each configuration's rank-0 log")
    a = ap.parse_args()
    configs = a.configs.split(",")
    folder = tempfile.mkdtemp(prefix="fsdp-compress-text-")
    try:
        a.text, crc = snapshot_text(folder)
        print(f"text: {len(a.text)} docs, CRC-32 {crc}", flush=True)
        report(a, configs)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def report(a, configs):
    rows = {}
    for c in configs:
        losses = val_losses(run(a, c))
        if not losses or losses[-1][0] != a.steps:
            sys.exit(f"compress.py: {c}: no validation loss at step {a.steps} (found {losses})")
        rows[c] = losses
        print(f"{c:>10}: " + "  ".join(f"{s}:{v:.4f}" for s, v in losses), flush=True)
    # Without `off` in this run, the gaps are left out (runs are
    # deterministic: another invocation's `off` holds under the same CRC).
    ref = rows["off"][-1][1] if "off" in rows else None
    print(f"\nvalidation loss at step {a.steps} ({a.strategy}, 2 hosts x 2 ranks, d={a.dim} L={a.layers}):")
    print(f"{'config':>10} {'loss':>8} {'gap':>8}")
    for c in configs:
        v = rows[c][-1][1]
        print(f"{c:>10} {v:8.4f} " + (f"{100 * (v - ref) / ref:+7.2f}%" if ref else "      -"))


if __name__ == "__main__":
    main()
