#!/usr/bin/env python3
"""Checks megaplan's arithmetic against transformers', where transformers is installed (the lent
GPUs): for each of llama, llama3.1 (RoPE scaling), mistral, qwen2, qwen3, gpt2, mixtral, qwen2_moe and qwen3_moe, a
small randomly initialised model built by
transformers is imported (`megaplan convert --to megaplan`), and on one sequence of 32 byte tokens
(a dataset whose every sample is that sequence, so that megaplan's batches are exactly it):
- the loss megaplan logs before its first step against transformers' on the same tokens (the
  logits' summary: the mean cross entropy over every position), and the gradient norm it logs
  against torch autograd's of that loss (every parameter's gradient in one number);
- every parameter's gradient, tensor by tensor: megaplan takes one AdamW step with lr 1, eps 1 and
  no weight decay, whose update is exactly -g / (|g| + 1) (the first step's bias-corrected moments
  are g and g^2), so the exported weights before and after it give each gradient back;
- megaplan trains two steps and saves; the checkpoint exported (`convert --to hf`) and loaded in
  transformers gives the loss megaplan logs on a held-out sequence with those weights.
megaplan runs on the CPU backend (fp32) and, where a GPU is visible, on the CUDA backend (bf16
compute). Prints a table, exits 1 when a difference exceeds its tolerance.

Usage: tools/hf_numerics_check.py MEGAPLAN_BINARY WORK_DIR [TYPE,...]
"""
import json
import os
import random
import subprocess
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import (AutoModelForCausalLM, GPT2Config, LlamaConfig, MistralConfig, MixtralConfig, Qwen2Config,
                          Qwen2MoeConfig, Qwen3Config, Qwen3MoeConfig)

from hf_reference import saved_random_model

SEQ = 32
SHAPE = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, max_position_embeddings=SEQ, rms_norm_eps=1e-6, rope_theta=10000.0,
             tie_word_embeddings=False)
CONFIGS = {
    "llama": LlamaConfig(**SHAPE),
    # Llama 3.1's RoPE scaling over 16 original positions: head dim 64 at theta 500000 puts three
    # frequencies in the blended band and the rest past it, so 32 positions turn them measurably.
    "llama3.1": LlamaConfig(**{**SHAPE, "rope_theta": 500000.0},
                            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
    "mistral": MistralConfig(**SHAPE, sliding_window=None),
    "qwen2": Qwen2Config(**SHAPE),
    # Qwen3: each query and key head RMS-normalised before RoPE, heads of 128 over a stream of 128
    # (the queries twice its width, as Qwen3-30B-A3B's).
    "qwen3": Qwen3Config(**SHAPE, head_dim=128),
    "gpt2": GPT2Config(vocab_size=512, n_embd=128, n_layer=2, n_head=2, n_positions=SEQ, n_ctx=SEQ,
                       attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0),
    # Mixtures of experts without the router's loss (router_aux_loss_coef 0): transformers' loss is
    # the cross entropy alone unless asked for the router's logits, and its balancing loss pools
    # the layers' tokens where Megatron's sums each layer's. Mixtral: softmax over the top 2 of 4;
    # Qwen2-MoE: the top 2 of the softmax over all 4 unrenormalised, beside a gated shared expert.
    "mixtral": MixtralConfig(**SHAPE, num_local_experts=4, num_experts_per_tok=2, sliding_window=None,
                             router_aux_loss_coef=0.0),
    "qwen2_moe": Qwen2MoeConfig(**SHAPE, moe_intermediate_size=64, shared_expert_intermediate_size=128, num_experts=4,
                                num_experts_per_tok=2, decoder_sparse_step=1, norm_topk_prob=False,
                                router_aux_loss_coef=0.0),
    # Qwen3-MoE: Qwen3's attention, the first layer dense (mlp_only_layers), then the top 2 of 4
    # experts renormalised (norm_topk_prob), no shared expert.
    "qwen3_moe": Qwen3MoeConfig(**SHAPE, head_dim=128, moe_intermediate_size=64, num_experts=4,
                                num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[0],
                                norm_topk_prob=True, router_aux_loss_coef=0.0),
}
# Relative tolerances (loss, gradients): fp32 sums in another order, and a gradient read back
# through an fp32 weight update; bf16 compute (the CUDA backend) against fp32.
TOLERANCE = {"cpu": (1e-5, 1e-4), "cuda": (2e-2, 5e-2)}


def run(*command):
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command[1:3])}: {result.stderr.strip()}")
    return result.stdout


def one_sequence(megaplan, work, name, seed):
    """A document of SEQ - 1 bytes and its end-of-document token: SEQ tokens, so that the epochs
    the dataset repeats it in have a period of SEQ and every sample (SEQ + 1 tokens) is the
    document and its first token again, whichever one the shuffle puts first."""
    rng = random.Random(seed)
    text = "".join(rng.choice("abcdefghij klmnop") for _ in range(SEQ - 1))
    path = os.path.join(work, name + ".txt")
    with open(path, "w") as f:
        f.write(text)
    run(megaplan, "data", "prepare", "--tokenizer", "byte", "--append-eod", "--input", path, "--output-prefix",
        os.path.join(work, name))
    document = list(text.encode()) + [256]
    return torch.tensor([document + document[:1]])


def torch_loss(model, tokens, backward=False):
    model.zero_grad(set_to_none=True)
    logits = model(tokens[:, :-1]).logits
    loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    if not backward:
        return loss.item(), None
    loss.backward()
    norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None))
    return loss.item(), norm.item()


def saved_gradients(model, directory):
    """The gradients by the names of the saved checkpoint: the model saved with each parameter's
    gradient in its place (transformers may hold tensors otherwise than it saves them: its mixtures
    of experts fuse the experts' weights, and save them expert by expert)."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.data = parameter.grad.clone() if parameter.grad is not None else torch.zeros_like(parameter)
    model.save_pretrained(directory, safe_serialization=True)
    return {n: g.double() for n, g in load_file(os.path.join(directory, "model.safetensors")).items()}


def gradients_from_step(before, after):
    """Each tensor's gradient from one AdamW step of lr 1, eps 1: r = w0 - w1 = g / (|g| + 1)."""
    gradients = {}
    for name, w0 in before.items():
        r = (w0.double() - after[name].double())
        gradients[name] = r / (1 - r.abs())
    return gradients


def megaplan_log(megaplan, device, config, data, log, *extra, lr="1e-3"):
    if os.path.exists(log):
        os.remove(log)
    # The config's vocabulary, not the data's largest id plus one (train's default without a tokenizer).
    vocab = str(json.load(open(config))["vocab_size"])
    run(megaplan, "train", "--device", device, "--model", config, "--vocab-size", vocab, "--seq-length", str(SEQ),
        "--mbs", "1", "--gbs", "1",
        "--data-path", data, "--split", "1,0,0", "--eval-iters", "0", "--log-interval", "1", "--clip-grad", "0",
        "--lr", lr, "--lr-warmup-iters", "0", "--log-file", log, *extra)
    return [json.loads(line) for line in open(log)]


def main():
    megaplan, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    train_tokens = one_sequence(megaplan, work, "train", 1)
    held_tokens = one_sequence(megaplan, work, "held", 2)
    failures = 0
    print(f"{'type':<10}{'device':<6}{'loss rel':>10}{'grad norm rel':>14}{'worst tensor rel':>18}"
          f"{'exported loss rel':>19}")
    only = sys.argv[3].split(",") if len(sys.argv) > 3 else list(CONFIGS)
    for name, config in CONFIGS.items():
        if name not in only:
            continue
        source, checkpoint = os.path.join(work, name + "-hf"), os.path.join(work, name + "-megaplan")
        model = saved_random_model(config, source)
        if name == "llama3.1" and '"llama3"' not in open(os.path.join(source, "config.json")).read():
            raise RuntimeError("transformers saved the llama3.1 config without its RoPE scaling")
        subprocess.run(["rm", "-rf", checkpoint])
        run(megaplan, "convert", "--to", "megaplan", "--load", source, "--save", checkpoint)
        want_loss, want_norm = torch_loss(model, train_tokens, backward=True)
        want_gradients = saved_gradients(model, os.path.join(work, name + "-gradients"))
        before = load_file(os.path.join(source, "model.safetensors"))
        config_json = os.path.join(source, "config.json")
        for device in devices:
            trained, exported = (os.path.join(work, f"{name}-{device}-{part}") for part in ("trained", "exported"))
            subprocess.run(["rm", "-rf", trained, exported])
            # Two steps from the imported weights, saved; the first logged loss and norm are the
            # imported model's on the training sequence.
            log = megaplan_log(megaplan, device, config_json, os.path.join(work, "train_text_document"),
                               os.path.join(work, f"{name}-{device}.jsonl"), "--load", checkpoint, "--train-iters", "2",
                               "--save", trained)
            loss_error = abs(log[0]["loss"] - want_loss) / want_loss
            norm_error = abs(log[0]["grad_norm"] - want_norm) / want_norm
            # One step that gives the gradients back, exported.
            stepped, stepped_hf = (os.path.join(work, f"{name}-{device}-{part}") for part in ("stepped", "stepped-hf"))
            subprocess.run(["rm", "-rf", stepped, stepped_hf])
            megaplan_log(megaplan, device, config_json, os.path.join(work, "train_text_document"),
                         os.path.join(work, f"{name}-{device}-step.jsonl"), "--load", checkpoint, "--train-iters", "1",
                         "--save", stepped, "--adam-eps", "1", "--weight-decay", "0", "--lr-decay-style", "constant",
                         lr="1")
            run(megaplan, "convert", "--to", "hf", "--load", stepped, "--save", stepped_hf)
            got_gradients = gradients_from_step(before, load_file(os.path.join(stepped_hf, "model.safetensors")))
            # Against each tensor's largest gradient, but at least a thousandth of the model's: the
            # key bias's gradient is zero but for rounding (softmax ignores a shift that every score
            # of a row shares), and its rounding is no scale.
            largest = max(want.abs().max().item() for want in want_gradients.values())
            # The read-back resolves a gradient no finer than a unit in the last place of its fp32
            # weight (w1 = w0 - r is rounded): that much of each element's difference is the method's.
            tensor_error, worst_tensor = 0.0, ""
            for tensor, want in want_gradients.items():
                scale = max(want.abs().max().item(), 1e-3 * largest)
                weight = before[tensor].float()
                resolution = (torch.nextafter(weight, torch.full_like(weight, float("inf"))) - weight).double()
                error = ((got_gradients[tensor] - want).abs() - resolution).clamp(min=0).max().item() / scale
                if error > tensor_error:
                    tensor_error, worst_tensor = error, tensor
            # The trained weights' loss on the held-out sequence, in megaplan (one more logged
            # iteration, before its step) and in transformers from the exported directory.
            held = megaplan_log(megaplan, device, config_json, os.path.join(work, "held_text_document"),
                                os.path.join(work, f"{name}-{device}-held.jsonl"), "--load", trained, "--train-iters", "3")
            run(megaplan, "convert", "--to", "hf", "--load", trained, "--save", exported)
            loaded = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
            with torch.no_grad():
                exported_loss, _ = torch_loss(loaded, held_tokens)
            exported_error = abs(held[-1]["loss"] - exported_loss) / exported_loss
            loss_tolerance, norm_tolerance = TOLERANCE[device]
            ok = (loss_error <= loss_tolerance and exported_error <= loss_tolerance and norm_error <= norm_tolerance
                  and tensor_error <= norm_tolerance)
            failures += not ok
            print(f"{name:<10}{device:<6}{loss_error:>10.2e}{norm_error:>14.2e}{tensor_error:>18.2e}{exported_error:>19.2e}"
                  + ("" if ok else f"   FAILED (worst tensor {worst_tensor})"))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
