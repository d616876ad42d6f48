#!/usr/bin/env python3
"""The speed table of tests/gpu/run.sh: fsdp-cpp's bench_train against PyTorch FSDP2.

    speed_table.py OURS.jsonl FSDP2.jsonl PLAN.json [--plan-sdpa PLAN_SDPA.json] --peak-tflops 989 \
        --matmul-tflops 790 --device cuda --goals GOALS.tsv

OURS.jsonl: bench_train's JSON lines (FULL_SHARD and compute only, every
round); FSDP2.jsonl: bench/ddp_reference.py's (pytorch-fsdp2, every round);
PLAN.json: `fsdp plan --json` for the same model, batch and prefetch. Each
step time is the median over all rounds' measured steps of that side.

  tokens/s = B * T * N / step
  FLOPs per token = 6 * P + 12 * L * d * T
      P: every parameter (embeddings and head included); 6 P: forward (2 P)
      and backward (4 P) of the matmuls; 12 L d T: the attention scores and
      their weighted sum (q k^T and att v, 2 L T d each forward, twice that
      backward), over the full T x T (the causal mask is applied after the
      product, so the masked half is computed too)
  MFU = tokens/s * FLOPs per token / (peak FLOP/s * N); peak: the GPU's dense
      bf16 figure (H200: 989 TFLOP/s by the datasheet, --peak-tflops), and
      beside it against what a large bf16 matmul reaches on that machine
      (~790 TFLOP/s on an H200, --matmul-tflops): the ceiling eager kernels
      can approach
Runs with --attention matmul and sdpa (both sides the same) are tabled
apart; the goals are judged on each attention that ran (PLAN_SDPA: the
planner's figures for sdpa).

Prints the table (Markdown) and writes GOALS.tsv: one line
per goal, name, value, target, PASS | FAIL | n/a. On --device cpu (the dry
run) the goals are n/a and the memory columns hold the counting allocator's
peak (ours) where no device peak exists.
"""
import argparse
import json
import statistics
import sys


def lines(path):
    try:
        with open(path) as f:
            return [json.loads(x) for x in f if x.strip()]
    except OSError:
        return []


def pooled(rows):
    steps = [t for r in rows for t in r["step_s"]]
    return statistics.median(steps) if steps else None


def mib(b):
    return "%.1f MiB" % (b / 2**20) if b is not None and b >= 0 else "-"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("ours")
    p.add_argument("fsdp2")
    p.add_argument("plan")
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--matmul-tflops", type=float, default=790.0)
    p.add_argument("--plan-sdpa", default="")
    p.add_argument("--device", default="cuda")
    p.add_argument("--goals", required=True)
    for k in ("dim", "layers", "heads", "seq", "batch"):
        p.add_argument("--" + k, type=int, required=True, help="the shape both sides ran")
    a = p.parse_args()
    ours_all, peer_all = lines(a.ours), lines(a.fsdp2)
    peer_all = [r for r in peer_all if r.get("impl") == "pytorch-fsdp2"]

    def load_plan(path):
        try:
            with open(path) as f:
                return json.load(f)["plan"]
        except (OSError, ValueError, KeyError):
            return {}

    plans = {"matmul": load_plan(a.plan), "sdpa": load_plan(a.plan_sdpa) if a.plan_sdpa else {}}
    if not ours_all and not peer_all:
        print("no measurements (both sides failed; see the logs)")
        open(a.goals, "w").close()
        return 1
    ref = (ours_all or peer_all)[0]
    B, T, N, L, d = a.batch, a.seq, ref["world"], a.layers, a.dim
    # P: counted as docs/GPT_MINI.md does (V*d + T*d + L*(12 d^2 + 13 d) + 2d + V*d + V), V from the runs
    V = ref.get("vocab", 256)
    P = V * d + T * d + L * (12 * d * d + 13 * d) + 2 * d + V * d + V
    fpt = 6 * P + 12 * L * d * T
    peak_flops, matmul_flops = a.peak_tflops * 1e12, a.matmul_tflops * 1e12
    cpu = a.device == "cpu"
    attentions = [x for x in ("matmul", "sdpa")
                  if any(r.get("attention", "matmul") == x for r in ours_all + peer_all)]

    print("GPT-mini d=%s L=%s T=%d h=%s, %s parameters, batch %d x %d per rank, N=%d, %s; "
          "FLOPs per token = 6 P + 12 L d T = %s; MFU against %.0f TFLOP/s (datasheet) and %.0f TFLOP/s (a bf16 "
          "matmul on this GPU)%s." % (
              d, L, T, a.heads, "{:,}".format(P), B, T, N, ref.get("dtype", "?"),
              "{:,}".format(fpt), a.peak_tflops, a.matmul_tflops,
              " (CPU dry run: the MFU is not meaningful)" if cpu else ""))
    print()
    print("| attention | run | rounds x steps | step ms (median) | tokens/s | MFU | MFU of matmul peak "
          "| peak device memory | planner (`fsdp plan`) | engine's ledger |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    stats = {}
    for att in attentions:
        mine = [r for r in ours_all if r.get("attention", "matmul") == att]
        ours = [r for r in mine if r.get("strategy") == "FULL_SHARD"]
        comp = [r for r in mine if r.get("strategy") == "compute-only"]
        peer = [r for r in peer_all if r.get("attention", "matmul") == att]
        plan = plans[att]
        for label, rows, kind in (("fsdp-cpp FULL_SHARD (bench_train)", ours, "ours"),
                                  ("fsdp-cpp compute only (no FSDP)", comp, "comp"),
                                  ("PyTorch %s FSDP2 (fully_shard)" % (peer[0].get("torch", "") if peer else ""),
                                   peer, "fsdp2")):
            if not rows:
                print("| %s | %s | - | FAILED | - | - | - | - | - | - |" % (att, label))
                continue
            step = pooled(rows)
            tps = B * T * N / step
            mfu = tps * fpt / (peak_flops * N)
            mfu_mm = tps * fpt / (matmul_flops * N)
            dev = max(r.get("device_peak_bytes", -1) for r in rows)
            mem = mib(dev)
            if dev < 0 and kind != "fsdp2":
                mem = "not reported by the binary yet" if not cpu else mib(max(r["peak_bytes"] for r in rows)) + \
                    " (host, counting allocator)"
            ledger = (rows[0].get("ledger") or {}).get("predicted_peak")
            stats[(att, kind)] = {"step": step, "mfu": mfu, "dev": dev, "plan": plan.get("peak")}
            print("| %s | %s | %d x %d | %.2f | %.0f | %s | %s | %s | %s | %s |" % (
                att, label, len(rows), len(rows[0]["step_s"]), step * 1e3, tps,
                "%.1f%%" % (100 * mfu) if mfu else "-", "%.1f%%" % (100 * mfu_mm) if mfu_mm else "-", mem,
                mib(plan.get("peak")) if kind == "ours" else "", mib(ledger) if ledger else ""))
    print()
    print("Peak device memory: the CUDA caching allocator's peak of allocated bytes over the measured steps "
          "(FSDP2: torch.cuda.max_memory_allocated), largest rank; planner: `fsdp plan --json`'s peak for the same "
          "model, batch, dtype, prefetch and attention; engine's ledger: the wrapped model's own prediction "
          "(bench_train), measured on the same allocator.")
    print()

    goals = []

    def goal(name, value, target, ok, shown):
        status = "n/a" if cpu or value is None else ("PASS" if ok else "FAIL")
        goals.append((name, shown if value is not None else "-", target, status))

    for att in attentions:
        o, f = stats.get((att, "ours")), stats.get((att, "fsdp2"))
        r = o["step"] / f["step"] if o and f else None
        goal("%s: step time / FSDP2's" % att, r, "<= 1.00", r is not None and r <= 1.0, "%.3f" % r if r else "-")
        m = o["mfu"] if o else None
        goal("%s: MFU" % att, m, ">= 40%", m is not None and m >= 0.40, "%.1f%%" % (100 * m) if m else "-")
        q = o["dev"] / o["plan"] if o and o["dev"] >= 0 and o.get("plan") else None
        goal("%s: peak device memory / planner" % att, q, "within 10% (0.90 .. 1.10)",
             q is not None and abs(q - 1) <= 0.10, "%.3f" % q if q else "-")
    with open(a.goals, "w") as out:
        for g in goals:
            out.write("\t".join(g) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
