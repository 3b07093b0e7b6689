"""What the transformers checks (hf_convert_check.py, hf_numerics_check.py) share: a small model
built by transformers from `config`, seeded, its norms and biases randomised too (around 1, so
that a misplaced one shows), saved as fp32 safetensors in `directory` and returned in eval mode
(GPT-2's configs default to dropout 0.1; megaplan trains without)."""
import torch
from transformers import AutoModelForCausalLM


def saved_random_model(config, directory):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 1:
                parameter.normal_(1.0, 0.1)
    model.save_pretrained(directory, safe_serialization=True)
    return model.eval()
