"""What the transformers checks (hf_convert_check.py, hf_numerics_check.py) share: a small model
built by transformers from `config`, seeded, its norms and biases randomised too (around 1, so
that a misplaced one shows), saved as fp32 safetensors in `directory` and returned in eval mode
(GPT-2's configs default to dropout 0.1; megaplan trains without); a mixture of experts' routers
scaled up so that the choice of experts does not hang on rounding."""
import torch
from transformers import AutoModelForCausalLM


def saved_random_model(config, directory):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() == 1:
                parameter.normal_(1.0, 0.1)
            elif name.endswith("gate.weight") and "shared_expert_gate" not in name:
                # A router: at std 0.02 its logits are nearly equal, so that bf16 rounding would pick
                # other experts than fp32 does; at 5 times that the choice is clear, and the softmax
                # not so steep that bf16's logits move the probabilities far.
                parameter.mul_(5.0)
    model.save_pretrained(directory, safe_serialization=True)
    return model.eval()
