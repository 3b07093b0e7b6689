#!/usr/bin/env python3
"""Writes transformers' default config of each model type megaplan's Hugging Face importer reads or
refuses (core/hf_config.cc), as `config.json` holds it (every key, its default value, and the
causal language model's class in "architectures", as the Hub's files name it): the fixture of the
test that every key is read, refused or ignored with a reason (tests/core/hf_config_keys_test.cc).

Run where transformers is installed (the lent GPU machines have it):
    python3 tools/dump_hf_default_configs.py --out tests/data/hf_default_configs.json
"""
import argparse
import json

import transformers
from transformers import AutoConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

# Read by megaplan, and refused by it (the test checks the refusal names a key or the type).
READ = ["llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gpt2"]
REFUSED = ["deepseek_v2", "deepseek_v3", "gemma", "gemma2", "phi3", "gpt_oss", "olmo2", "granite"]


def default_config(model_type):
    config = AutoConfig.for_model(model_type)
    config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]]
    return json.loads(config.to_json_string(use_diff=False))  # what save_pretrained writes


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    table = {"transformers": transformers.__version__, "read": {}, "refused": {}}
    for group, types in (("read", READ), ("refused", REFUSED)):
        for model_type in types:
            try:
                table[group][model_type] = default_config(model_type)
            except Exception as error:  # a type this transformers lacks: say so, go on
                print(f"{model_type}: {error}")
    with open(args.out, "w") as out:
        json.dump(table, out, indent=1, sort_keys=True)
        out.write("\n")


if __name__ == "__main__":
    main()
