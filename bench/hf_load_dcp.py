# fsdp-cpp bench: the peer a PyTorch user would use to load a Hugging Face
# checkpoint into a sharded model, for bench/hf_load.sh's side-by-side:
# PyTorch FSDP2 (fully_shard on every decoder layer and the root, fp32
# parameters, as load_hf's masters) over a LlamaForCausalLM built on the meta
# device, then DCP's HuggingFaceStorageReader loading the same files into its
# DTensor state dict. Run under torchrun (gloo, CPU):
#   torchrun --nproc-per-node N bench/hf_load_dcp.py CKPT
# Each rank prints "build_seconds=... load_seconds=... peak_rss=... start_rss=..."
# as the llama example does, so the script's `slowest` reads both alike.
import os
import resource
import sys
import time


def rss_now():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main():
    ckpt = sys.argv[1]
    start_rss = rss_now()
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoConfig, LlamaForCausalLM

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t0 = time.perf_counter()
    cfg = AutoConfig.from_pretrained(ckpt)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg).to(torch.float32)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    model.to_empty(device="cpu")
    dist.barrier()
    t1 = time.perf_counter()
    state = model.state_dict()
    dcp.load(state, storage_reader=HuggingFaceStorageReader(ckpt))
    dist.barrier()
    t2 = time.perf_counter()
    # A check that the bytes arrived: the first decoder layer's norm is ones
    # in a fresh transformers model; a random checkpoint's is not all zero.
    probe = model.model.layers[0].input_layernorm.weight.to_local()
    ok = bool(torch.isfinite(probe).all()) and probe.numel() > 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"dcp rank {rank}: build_seconds={t1 - t0:.3f} load_seconds={t2 - t1:.3f} peak_rss={peak} "
          f"start_rss={start_rss} loaded_finite={int(ok)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
