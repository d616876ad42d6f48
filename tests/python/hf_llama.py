#!/usr/bin/python3
"""Hugging Face Llama cross-checks for fsdp-cpp's load_hf / save_hf (tests/test_hf.cpp).

transformers builds a small random LlamaForCausalLM from a config (no hub
download) and saves it in bf16 across several files; fsdp-cpp loads it and
compares its logits with the reference written here; an export of fsdp-cpp is
loaded back by transformers and by torch.distributed.checkpoint's
HuggingFaceStorageReader.

  hf_llama.py make DIR REF [--tied] [--rope llama3] [--vocab V]
      DIR: the checkpoint (bf16, max_shard_size 24 KB: several files)
      REF: safetensors with "ids" (int64 [2, 16]) and "logits" (fp32), the
           forward of the checkpoint as loaded (bf16 values, fp32 compute)
  hf_llama.py check EXPORT OURS
      OURS: safetensors with "ids" and "logits" computed by fsdp-cpp with the
            exported weights; prints TRANSFORMERS max_abs_diff=... and
            DCP tensors=N max_abs_diff=...
"""
import sys

import torch
from safetensors.torch import load_file, save_file


def fixed_ids(vocab):
    return ((torch.arange(2 * 16, dtype=torch.int64) * 7 + 3) % vocab).reshape(2, 16)


def make(out, ref, tied, rope, vocab=151):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(1234)
    rope_parameters = {"rope_type": "default", "rope_theta": 10000.0}
    if rope == "llama3":
        rope_parameters = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=120, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
                      rms_norm_eps=1e-5, tie_word_embeddings=tied, rope_parameters=rope_parameters)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # values far from the defaults (norms of ones), so a misplaced tensor shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))
    model.to(torch.bfloat16).save_pretrained(out, max_shard_size="24KB")
    loaded = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = fixed_ids(cfg.vocab_size)
    with torch.no_grad():
        logits = loaded(ids).logits.float().contiguous()
    save_file({"ids": ids, "logits": logits}, ref)
    print("MADE files=%d" % len([1 for _ in __import__("os").listdir(out) if _.endswith(".safetensors")]))


def check(export, ours):
    import torch.distributed.checkpoint as dcp
    from transformers import LlamaForCausalLM
    mine = load_file(ours)
    model = LlamaForCausalLM.from_pretrained(export, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(mine["ids"]).logits.float()
    print("TRANSFORMERS max_abs_diff=%.9g max_abs=%.6g" % ((logits - mine["logits"]).abs().max().item(),
                                                          logits.abs().max().item()))
    # PyTorch's own reader of the HF layout, into a state dict of the keys the files hold.
    want = {k: torch.empty_like(v) for k, v in model.state_dict().items()
            if not (model.config.tie_word_embeddings and k == "lm_head.weight")}
    dcp.load(want, storage_reader=dcp.HuggingFaceStorageReader(export), no_dist=True)
    ref = model.state_dict()
    worst = max((want[k] - ref[k]).abs().max().item() for k in want)
    print("DCP tensors=%d max_abs_diff=%.9g" % (len(want), worst))


if __name__ == "__main__":
    import warnings
    warnings.filterwarnings("ignore")
    if sys.argv[1] == "make":
        vocab = int(sys.argv[sys.argv.index("--vocab") + 1]) if "--vocab" in sys.argv else 151
        make(sys.argv[2], sys.argv[3], "--tied" in sys.argv, "llama3" if "llama3" in sys.argv else "default", vocab)
    elif sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: hf_llama.py make DIR REF [--tied] [--rope llama3] | check EXPORT OURS")
