#!/usr/bin/env python3
"""Checks `megaplan convert` against transformers, where transformers is installed (the lent GPUs):
for each of llama, mistral, qwen2 and gpt2, a small randomly initialised model built and saved by
transformers (fp32 safetensors) goes to a megaplan checkpoint laid out for tp 2 x pp 2 and back
(`convert --to megaplan`, then `--to hf`). Every tensor must come back bit for bit under the same
name, transformers must load the written directory with no missing or unexpected weight, and the
two models' logits on the same tokens must be equal. Prints a table, exits 1 on a failure.

Usage: tools/hf_convert_check.py MEGAPLAN_BINARY WORK_DIR
"""
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file
from transformers import (AutoModelForCausalLM, GPT2Config, LlamaConfig, MistralConfig, Qwen2Config)

from hf_reference import saved_random_model

# Vocabulary 512 (a multiple of 128 x tp 2): megaplan pads nothing, so shapes round-trip too.
SHAPE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=10000.0,
             tie_word_embeddings=False)
CONFIGS = {
    "llama": LlamaConfig(**SHAPE),
    "mistral": MistralConfig(**SHAPE, sliding_window=None),
    "qwen2": Qwen2Config(**SHAPE),
    "gpt2": GPT2Config(vocab_size=512, n_embd=64, n_layer=4, n_head=4, n_positions=64, n_ctx=64),
}


def tensors(directory):
    return load_file(os.path.join(directory, "model.safetensors"))


def main():
    megaplan, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    failures = 0
    print(f"{'type':<8}{'tensors':>8}{'bitwise':>9}{'loading':>9}{'max |dlogit|':>14}")
    for name, config in CONFIGS.items():
        source, checkpoint, back = (os.path.join(work, f"{name}-{part}") for part in ("hf", "megaplan", "back"))
        model = saved_random_model(config, source)
        for command in ([megaplan, "convert", "--to", "megaplan", "--load", source, "--save", checkpoint, "--tp", "2",
                         "--pp", "2"],
                        [megaplan, "convert", "--to", "hf", "--load", checkpoint, "--save", back]):
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode != 0:
                print(f"{name}: {' '.join(command[1:3])} failed: {result.stderr.strip()}")
                failures += 1
                break
        else:
            want, got = tensors(source), tensors(back)
            same_names = set(want) == set(got)
            bitwise = same_names and all(torch.equal(want[k].view(torch.int32), got[k].view(torch.int32)) for k in want)
            loaded, info = AutoModelForCausalLM.from_pretrained(back, dtype=torch.float32, output_loading_info=True)
            clean = not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
            tokens = torch.randint(0, 512, (2, 48), generator=torch.Generator().manual_seed(1))
            with torch.no_grad():
                difference = (model(tokens).logits - loaded(tokens).logits).abs().max().item()
            ok = bitwise and clean and difference == 0.0
            failures += not ok
            if not same_names:
                print(f"{name}: names differ: only in the source {sorted(set(want) - set(got))}, "
                      f"only in the round trip {sorted(set(got) - set(want))}")
            if not clean:
                print(f"{name}: loading info {info}")
            print(f"{name:<8}{len(want):>8}{str(bitwise):>9}{str(clean):>9}{difference:>14.3g}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
