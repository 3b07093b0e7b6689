"""PyTorch SDPA (bf16, causal) on the shapes of bench/attention_bench.cu, for comparison.

q, k, v are strided views of a packed qkv [batch, seq, heads, 3, dim], as in the megaplan bench;
the backward is timed alone (autograd.grad of a kept graph). Median of 30 runs after warm-up,
FLOPs counted as FlashAttention does (causal forward 2*b*h*s^2*d, backward 2.5 times that).
"""
import torch
import torch.nn.functional as F

CASES = [("gpt-1.3b", 8, 2048, 16, 128), ("gpt2-350m", 16, 1024, 16, 64), ("gpt2-124m", 16, 1024, 12, 64)]


def median_ms(fn):
    for _ in range(5):
        fn()
    times = []
    for _ in range(30):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return sorted(times)[len(times) // 2]


def main():
    print(f"{'model':<10} {'shape':<22} {'fwd_ms':>9} {'fwd_TF/s':>10} {'bwd_ms':>9} {'bwd_TF/s':>10}")
    for name, b, s, h, d in CASES:
        qkv = torch.randn(b, s, h, 3, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        q, k, v = (qkv[:, :, :, i].transpose(1, 2) for i in range(3))  # [b, h, s, d] views
        dout = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            fwd = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        bwd = median_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
        flops = 4.0 * b * h * s * s * d / 2
        label = f"b{b} s{s} h{h} d{d}"
        print(f"{name:<10} {label:<22} {fwd:9.3f} {flops / fwd / 1e9:10.1f} {bwd:9.3f} {2.5 * flops / bwd / 1e9:10.1f}")


if __name__ == "__main__":
    main()
