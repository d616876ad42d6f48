#!/usr/bin/env python3
"""The peers of bench_train: GPT-mini under PyTorch FSDP2, DDP and DDP + ZeRO, on CPU.

    python3 bench/ddp_reference.py --world 2 [--modes fsdp2,ddp,zero] [--dtype fp32|bf16] [--json FILE]
    python3 bench/ddp_reference.py --world 2 --check-grads   # FSDP2's gradients against one process
    python3 bench/ddp_reference.py --device cuda --world 1 --modes fsdp2 --dtype bf16 \
        --dim 768 --layers 12 --heads 12 --seq 1024 --batch 8     # on a GPU (tests/gpu/run.sh)

The same model as examples/gpt (docs/GPT_MINI.md; the Python definition is
tests/python/gpt_reference.py), the same per-rank batch (B=4, T=128), one
compute thread per rank, AdamW (betas 0.9/0.95, weight decay 0.1 on 2-D
weights; fused=True, one kernel per group as bench_train's fsdp::FusedAdamW,
unless --optimizer adamw), Gloo over loopback TCP. --attention sdpa makes
both sides use scaled_dot_product_attention (bench_train --attention sdpa). This script starts the N ranks itself
(torch.multiprocessing, MASTER_ADDR=127.0.0.1 and a free port), so it does
not depend on torchrun being packaged.

Modes:
  plain the model itself, no wrapper and no communication (the C++ engine's
        NO_SHARD at N = 1 is compared with this: same kernels, no collectives)
  fsdp2 PyTorch's own FSDP2: torch.distributed.fsdp.fully_shard on every block
        and the root, over a CPU device mesh on gloo; --dtype bf16 gives it
        MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16), as
        bench_train's bf16 (bf16 all-gather, compute and reduce-scatter, fp32
        master shards). pytorch #162338 reports FSDP2 on gloo summing gradients
        instead of averaging them: --check-grads compares its gradients with
        one process's on the whole batch, as FSDP2 comes and with an explicit
        gradient_divide_factor = N (on torch 2.15 both agree to 1.4e-6, so
        the timed runs use FSDP2 as it comes).
  ddp   DistributedDataParallel (default buckets of 25 MiB) + torch.optim.AdamW
  zero  the same DDP + torch.distributed.optim.ZeroRedundancyOptimizer(AdamW):
        optimizer state sharded over ranks, parameters broadcast after step

--device cuda: rank r runs on cuda:r (so N is at most the GPUs), the model,
the batch and FSDP2's mesh on the GPU, NCCL instead of Gloo; each timed step
ends with torch.cuda.synchronize(), and the JSON line adds the peak of
torch.cuda.max_memory_allocated over the measured steps (largest rank).
Without it (the default, cpu) everything above holds unchanged.

Timing is the same as bench_train's: each rank times every step (zero_grad,
forward, loss, backward, optimizer step) with no barrier inside the loop; the
step's time is the maximum over ranks, the reported figure the median over
the measured steps. Rank 0 prints one line per mode and appends one JSON line
per mode to --json.
"""
import argparse
import json
import os
import resource
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from gpt_reference import GPT  # noqa: E402  the one Python definition of GPT-mini


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def param_groups(model):
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() != 2]
    return [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]


def peak_rss_bytes():
    # VmHWM after a reset (clear_refs 5) is the peak of this mode only;
    # ru_maxrss (KiB on Linux) is the fallback: the peak of the process.
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def shard_fsdp2(net, world, dtype, divide_fix=False, device_type="cpu"):
    """FSDP2 as its docs show it: one fully_shard per block, then the root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device_type, (world,))
    kw = dict(mesh=mesh)
    if dtype == "bf16":
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    for b in net.blocks:
        fully_shard(b, **kw)
    fully_shard(net, **kw)
    # pytorch #162338: FSDP2 on gloo was reported to sum the gradients
    # instead of averaging them (gloo has no AVG reduce-scatter); asking for
    # the division explicitly is the fix where that holds (--check-grads).
    if divide_fix:
        for m in list(net.blocks) + [net]:
            m.set_gradient_divide_factor(float(world))
    return net


def check_grads(args, rank, world):
    """FSDP2's full gradients after one step equal one process's on the
    concatenated batch (fp32), with and without the divide fix."""
    from torch.distributed.tensor import DTensor

    torch.manual_seed(1234)
    ref = GPT(args.vocab, args.seq, args.dim, args.layers, args.heads)
    xs, ys = [], []
    for q in range(world):
        gen = torch.Generator().manual_seed(1000 + q)
        xs.append(torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen))
        ys.append(torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen))
    logits = ref(torch.cat(xs))
    F.cross_entropy(logits.view(-1, args.vocab), torch.cat(ys).view(-1)).backward()
    want = {n: p.grad for n, p in ref.named_parameters()}
    out = {}
    for fix in (False, True):
        torch.manual_seed(1234)
        net = GPT(args.vocab, args.seq, args.dim, args.layers, args.heads)
        shard_fsdp2(net, world, "fp32", divide_fix=fix)  # without: FSDP2's default, as a user gets it
        logits = net(xs[rank])
        F.cross_entropy(logits.view(-1, args.vocab), ys[rank].view(-1)).backward()
        worst = 0.0
        for n, p in net.named_parameters():
            g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            worst = max(worst, (g - want[n]).abs().max().item() / max(want[n].abs().max().item(), 1e-12))
        out["fixed" if fix else "default"] = worst
    if rank == 0:
        print("  fsdp2 gradients vs one process (max relative difference): default %.3g, with the divide fix %.3g"
              % (out["default"], out["fixed"]), flush=True)
    return out


def run_mode(mode, args, rank, world):
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(1234)  # identical parameters on every rank (DDP also broadcasts)
    net = GPT(args.vocab, args.seq, args.dim, args.layers, args.heads, sdpa=args.attention == "sdpa")
    cuda = args.device == "cuda"
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        net = net.to(dev)  # drawn on the host from the seed, then moved: the same weights as on the CPU
    if mode == "fsdp2":
        model = shard_fsdp2(net, world, args.dtype, device_type=dev.type)
    else:
        model = net if mode == "plain" else DDP(net)
    hp = dict(lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    if mode in ("ddp", "plain", "fsdp2"):
        # fused: one kernel per parameter group, as fsdp-cpp's FusedAdamW
        # (bench_train's default); else PyTorch's default implementation.
        opt = torch.optim.AdamW(param_groups(net), fused=args.optimizer == "fused", **hp)
    else:
        opt = ZeroRedundancyOptimizer(param_groups(net), optimizer_class=torch.optim.AdamW, **hp)
    gen = torch.Generator().manual_seed(1000 + rank)
    idx = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen)
    targets = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen)
    if cuda:
        idx, targets = idx.to(dev), targets.to(dev)

    def step():
        opt.zero_grad(set_to_none=True)
        logits = model(idx)
        loss = F.cross_entropy(logits.view(-1, args.vocab), targets.view(-1))
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize(dev)  # the step's kernels are done: its time is the work, not the launches
        return loss

    for _ in range(args.warmup):
        step()
    dist.barrier()
    reset_peak_rss()
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    faults = (ru1.ru_minflt - ru0.ru_minflt + ru1.ru_majflt - ru0.ru_majflt) / args.steps
    rss = peak_rss_bytes()
    device_peak = torch.cuda.max_memory_allocated(dev) if cuda else -1

    # Agree on one time per step (the slowest rank) and the largest RSS
    # (NCCL reduces device tensors only).
    t = torch.tensor(times, dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    r = torch.tensor([float(rss), float(device_peak)], dtype=torch.float64, device=dev)
    dist.all_reduce(r, op=dist.ReduceOp.MAX)
    step_times = t.tolist()
    res = {
        "bench": "train_peer",
        "impl": "pytorch-" + mode,
        "world": world,
        "dtype": args.dtype if mode == "fsdp2" else "fp32",
        "batch": args.batch,
        "seq": args.seq,
        "threads": torch.get_num_threads(),
        "attention": args.attention,
        "optimizer": ("fused_adamw" if args.optimizer == "fused" else "adamw") if mode != "zero" else "adamw",
        "torch": torch.__version__,
        "step_s_median": statistics.median(step_times),
        "step_s": step_times,
        "peak_rss_bytes": int(r[0].item()),
        "page_faults_per_step": faults,  # rank 0
        "loss": float(loss.item()),
    }
    if cuda:
        res.update({"device": "cuda", "gpu": torch.cuda.get_device_name(dev), "cuda": torch.version.cuda,
                    "device_peak_bytes": int(r[1].item()), "dim": args.dim, "layers": args.layers,
                    "heads": args.heads, "vocab": args.vocab,
                    "params": sum(p.numel() for p in net.parameters())})
    return res


def worker(rank, world, port, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(args.threads)
    if args.device == "cuda":
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        if args.check_grads:
            check_grads(args, rank, world)
            return
        for mode in args.modes.split(","):
            res = run_mode(mode, args, rank, world)
            if rank == 0:
                print("  pytorch %-5s %s N=%d  step %7.1f ms (median of %d)  peak RSS %6.1f MiB  faults/step %7.1f"
                      "  loss %.4f" % (mode, res["dtype"], world, res["step_s_median"] * 1e3, args.steps,
                                       res["peak_rss_bytes"] / 2**20, res["page_faults_per_step"], res["loss"]),
                      flush=True)
                if "device_peak_bytes" in res:
                    print("  pytorch %-5s device peak %.1f MiB (torch.cuda.max_memory_allocated)"
                          % (mode, res["device_peak_bytes"] / 2**20), flush=True)
                if args.json:
                    with open(args.json, "a") as f:
                        f.write(json.dumps(res) + "\n")
            dist.barrier()
    finally:
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--modes", default="fsdp2,ddp,zero", help="comma-separated: plain, fsdp2, ddp, zero")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"), help="fsdp2's compute dtype (the others: fp32)")
    p.add_argument("--check-grads", action="store_true", help="compare FSDP2's gradients with one process, then exit")
    p.add_argument("--steps", type=int, default=10, help="measured steps (after --warmup)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="compute threads per rank")
    p.add_argument("--attention", default="matmul", choices=("matmul", "sdpa"),
                   help="GPT-mini's attention: matmul/mask/softmax, or F.scaled_dot_product_attention")
    p.add_argument("--optimizer", default="fused", choices=("fused", "adamw"),
                   help="AdamW with fused=True (as bench_train's FusedAdamW), or PyTorch's default AdamW")
    p.add_argument("--json", default="", help="append one JSON line per mode")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="cuda: rank r on cuda:r, NCCL, synchronized step times, device peak (default cpu: Gloo)")
    args = p.parse_args()
    for m in args.modes.split(","):
        if m not in ("plain", "fsdp2", "ddp", "zero"):
            p.error("unknown mode %r (expected plain, fsdp2, ddp or zero)" % m)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            p.error("--device cuda: torch %s sees no CUDA device" % torch.__version__)
        if args.world > torch.cuda.device_count():
            p.error("--device cuda: --world %d needs one GPU per rank, this machine has %d"
                    % (args.world, torch.cuda.device_count()))
        if args.check_grads:
            p.error("--check-grads runs on the CPU only")
    mp.start_processes(worker, args=(args.world, free_port(), args), nprocs=args.world, start_method="spawn")


if __name__ == "__main__":
    main()
