"""The PyTorch side of bench/train_speed.sh: the same GPT as megaplan's executor trains (learned
positions, LayerNorm eps 1e-5, tanh GELU, biases, tied embeddings, vocabulary padded to a
multiple of 128, no dropout), or with --llama the Llama family's (RMSNorm, SwiGLU, rotary
embeddings, grouped-query attention through SDPA's enable_gqa, untied, no biases; with --experts
every MLP a Mixtral-style mixture of experts, MoeMlp below), in the plain
fast PyTorch way: bf16 autocast, SDPA, fused AdamW, torch.compile. Prints one JSON line:
tokens/s, model TFLOP/s (the same formula megaplan logs, core/formulas.cc) and peak allocated bytes.
Under torchrun, --parallel ddp (DistributedDataParallel, its default 25 MiB buckets overlapping the
backward) or fsdp (FSDP2's fully_shard per block and at the root, bf16 parameters gathered, fp32
gradient reduction) trains data-parallel over the launched ranks; tokens/s is then the world's and
TFLOP/s one GPU's. --microbatches N accumulates N micro-batches per step (DDP syncs on the last).

Usage: python3 torch_gpt_reference.py --layers 12 --hidden 768 --heads 12 --seq 1024 --mbs 16
       python3 torch_gpt_reference.py --llama --layers 16 --hidden 2048 --heads 32 --groups 8 --ffn 8192 \
           --seq 4096 --mbs 4 --vocab 128256
       torchrun --nproc-per-node 2 torch_gpt_reference.py --parallel ddp --layers 24 --hidden 2048 --heads 16 \
           --seq 2048 --mbs 8
"""
import argparse
import contextlib
import json
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden, eps=1e-5)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden, eps=1e-5)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, layers, hidden, heads, seq, vocab):
        super().__init__()
        self.word = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(seq, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden, eps=1e-5)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "fc2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, tokens, labels):
        x = self.word(tokens) + self.position(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.word.weight)  # tied
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.reshape(-1))


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class MoeMlp(nn.Module):
    """Mixtral's MLP as megaplan's default router runs it (Megatron's): the top k of the router's
    logits, softmax over those k, each token's rows gathered expert by expert, each expert a SwiGLU
    MLP over its rows (one GEMM per expert, the row counts on the host as HF's and torchtitan's loop
    has them), the outputs weighted and summed back; the switch loss over the microbatch's tokens.
    The expert loop runs eagerly (its shapes change every step; torch.compile takes the rest); with
    `grouped` the experts run as torchtitan's, compiled (routed_grouped)."""

    def __init__(self, hidden, experts, topk, ffn, aux_coeff, grouped=False):
        super().__init__()
        self.experts, self.topk, self.aux_coeff, self.grouped = experts, topk, aux_coeff, grouped
        self.router = nn.Linear(hidden, experts, bias=False)
        self.fc1 = nn.Parameter(torch.empty(experts, 2 * ffn, hidden))
        self.fc2 = nn.Parameter(torch.empty(experts, hidden, ffn))

    def forward(self, x):
        b, s, h = x.shape
        x = x.reshape(-1, h)
        logits = self.router(x)
        top, chosen = torch.topk(logits, self.topk, dim=-1)
        probs = F.softmax(top.float(), dim=-1)
        counts = torch.bincount(chosen.reshape(-1), minlength=self.experts)
        tokens = x.shape[0]
        scores = F.softmax(logits.float(), dim=-1)
        aux = (scores.sum(0) * counts).sum() * (self.experts * self.aux_coeff / (self.topk * tokens * tokens))
        routed = self.routed_grouped if self.grouped else self.routed
        return routed(x, chosen, probs, counts).view(b, s, h), aux

    def routed_grouped(self, x, chosen, probs, counts):
        # torchtitan's way, compiled whole: torch._grouped_mm over every expert's rows at once, each
        # expert's run padded to a multiple of 16 rows (the weight gradients' grouped GEMMs reduce
        # over rows) inside a buffer of a fixed size, so nothing waits for the counts on the host.
        align = 16
        order = chosen.reshape(-1).argsort(stable=True)
        token = order // self.topk
        padded = (counts + align - 1) // align * align
        ends = torch.cumsum(padded, 0)
        first = ends - padded
        starts = torch.cumsum(counts, 0) - counts
        expert_of = chosen.reshape(-1)[order]
        place = first[expert_of] + (torch.arange(order.shape[0], device=x.device) - starts[expert_of])
        room = order.shape[0] + self.experts * align
        rows = x.new_zeros(room, x.shape[1]).index_copy(0, place, x[token])
        offsets = ends.to(torch.int32)
        dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled() else x.dtype
        fc1 = torch._grouped_mm(rows.to(dtype), self.fc1.to(dtype).transpose(-2, -1), offs=offsets)
        gate, up = fc1.chunk(2, dim=-1)
        out = torch._grouped_mm(F.silu(gate) * up, self.fc2.to(dtype).transpose(-2, -1), offs=offsets)
        weighted = out[place] * probs.reshape(-1)[order, None].to(out.dtype)
        return torch.zeros_like(x, dtype=weighted.dtype).index_add_(0, token, weighted)

    @torch.compiler.disable
    def routed(self, x, chosen, probs, counts):
        order = chosen.reshape(-1).argsort(stable=True)
        token = order // self.topk
        rows = x[token]
        outputs = []
        for e, part in enumerate(rows.split(counts.tolist())):
            if part.shape[0] == 0:
                continue
            gate, up = F.linear(part, self.fc1[e]).chunk(2, dim=-1)
            outputs.append(F.linear(F.silu(gate) * up, self.fc2[e]))
        weighted = torch.cat(outputs) * probs.reshape(-1)[order, None].to(outputs[0].dtype)
        return torch.zeros_like(x, dtype=weighted.dtype).index_add_(0, token, weighted)


class LlamaBlock(nn.Module):
    def __init__(self, hidden, heads, groups, ffn, moe=None):
        super().__init__()
        self.heads, self.groups, self.dim = heads, groups, hidden // heads
        self.ln1 = nn.RMSNorm(hidden, eps=1e-5)
        self.qkv = nn.Linear(hidden, (heads + 2 * groups) * self.dim, bias=False)
        self.proj = nn.Linear(heads * self.dim, hidden, bias=False)
        self.ln2 = nn.RMSNorm(hidden, eps=1e-5)
        self.moe = MoeMlp(hidden, **moe) if moe else None
        if not moe:
            self.fc1 = nn.Linear(hidden, 2 * ffn, bias=False)
            self.fc2 = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x, cos, sin):
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split([self.heads * self.dim, self.groups * self.dim, self.groups * self.dim], dim=2)
        q = rotate(q.view(b, s, self.heads, self.dim).transpose(1, 2), cos, sin)
        k = rotate(k.view(b, s, self.groups, self.dim).transpose(1, 2), cos, sin)
        v = v.view(b, s, self.groups, self.dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, s, self.heads * self.dim))
        if self.moe:
            out, aux = self.moe(self.ln2(x))
            return x + out, aux
        gate, up = self.fc1(self.ln2(x)).chunk(2, dim=-1)
        return x + self.fc2(F.silu(gate) * up), 0.0


class Llama(nn.Module):
    def __init__(self, layers, hidden, heads, groups, ffn, seq, vocab, theta=500000.0, moe=None):
        super().__init__()
        self.word = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(LlamaBlock(hidden, heads, groups, ffn, moe) for _ in range(layers))
        self.ln_f = nn.RMSNorm(hidden, eps=1e-5)
        self.output = nn.Linear(hidden, vocab, bias=False)
        dim = hidden // heads
        inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2).float() / dim)
        angles = torch.outer(torch.arange(seq).float(), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "fc2.weight", "fc2")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, tokens, labels):
        x = self.word(tokens)
        aux = 0.0
        for block in self.blocks:
            x, layer_aux = block(x, self.cos, self.sin)
            aux = aux + layer_aux
        logits = self.output(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.reshape(-1)) + aux


def main():
    parser = argparse.ArgumentParser()
    for flag in ("layers", "hidden", "heads", "seq", "mbs"):
        parser.add_argument("--" + flag, type=int, required=True)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--llama", action="store_true")
    parser.add_argument("--groups", type=int, default=0, help="--llama: query groups (default: one per head)")
    parser.add_argument("--ffn", type=int, default=0, help="--llama: the MLP's width (SwiGLU's gate and up each)")
    parser.add_argument("--experts", type=int, default=0, help="--llama: every MLP a mixture of this many experts")
    parser.add_argument("--topk", type=int, default=2, help="--experts: each token's experts")
    parser.add_argument("--moe-ffn", type=int, default=0, help="--experts: each expert's width")
    parser.add_argument("--aux-coeff", type=float, default=0.01, help="--experts: the switch loss's coefficient")
    parser.add_argument("--grouped", action="store_true", help="--experts: torch._grouped_mm, compiled (torchtitan's)")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--parallel", choices=("none", "ddp", "fsdp"), default="none")
    parser.add_argument("--microbatches", type=int, default=1)
    args = parser.parse_args()
    padded = (args.vocab + 127) // 128 * 128
    world, rank = 1, 0
    if args.parallel != "none":
        torch.distributed.init_process_group("nccl")
        world, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.manual_seed(1234)
    torch.backends.cuda.matmul.allow_tf32 = True
    groups = args.groups or args.heads
    if args.llama:
        moe = dict(experts=args.experts, topk=args.topk, ffn=args.moe_ffn, aux_coeff=args.aux_coeff,
                   grouped=args.grouped) if args.experts else None
        model = Llama(args.layers, args.hidden, args.heads, groups, args.ffn, args.seq, padded, moe=moe).cuda()
    else:
        model = Gpt(args.layers, args.hidden, args.heads, args.seq, padded).cuda()
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    wrapped = model
    if args.parallel == "ddp":
        wrapped = torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()])
    elif args.parallel == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.blocks:
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        # fully_shard swaps the parameters for sharded ones: the optimizer takes those.
        decay = [p for n, p in model.named_parameters() if p.dim() == 2]
        no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=1e-4, betas=(0.9, 0.95), **({"foreach": True} if args.parallel == "fsdp" else {"fused": True}))
    step = torch.compile(wrapped)
    torch.manual_seed(1234 + rank)  # each data-parallel rank its own samples
    data = torch.randint(0, args.vocab, (args.microbatches, args.mbs, args.seq + 1), device="cuda")
    inputs, labels = data[:, :, :-1].contiguous(), data[:, :, 1:].contiguous()

    def iteration():
        for m in range(args.microbatches):
            last = m == args.microbatches - 1
            sync = wrapped.no_sync() if args.parallel == "ddp" and not last else contextlib.nullcontext()
            if args.parallel == "fsdp":
                model.set_requires_gradient_sync(last)
            with sync, torch.autocast("cuda", dtype=torch.bfloat16):
                loss = step(inputs[m], labels[m]) / args.microbatches
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    for _ in range(args.warmup):
        iteration()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(args.iters):
        loss = iteration()
    loss.item()
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / args.iters
    tokens_per_s = world * args.microbatches * args.mbs * args.seq / seconds
    # Megatron's model FLOPs per token, as megaplan's formulas (core/formulas.cc model_flops):
    # 12 l h^2 ((1 + groups/heads + s/h) + ffn/h x (1.5 with SwiGLU) + v / (2 l h)).
    h, s, l, v = args.hidden, args.seq, args.layers, padded
    ffn = args.ffn if args.llama else 4 * h
    if args.experts:  # an MoE layer's MLP through its top k experts (Megatron's count; the router left out)
        ffn = args.topk * args.moe_ffn
    gated = 1.5 if args.llama else 1.0
    flops_per_token = 12 * l * h * h * ((1 + groups / args.heads + s / h) + ffn / h * gated + v / (2 * l * h))
    if rank == 0:
        print(json.dumps({"framework": "pytorch", "parallel": args.parallel, "world": world,
                          "tokens_per_s": tokens_per_s, "model_tflops": tokens_per_s / world * flops_per_token / 1e12,
                          "peak_memory_bytes": torch.cuda.max_memory_allocated(),
                          "loss": loss.item(), "torch": torch.__version__}))
    if args.parallel != "none":
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
