"""Runs the config module `search --emit torchtitan --json` printed against stand-ins for the
torchtitan modules it imports, and prints the config its function returns as JSON.

The stand-ins hold exactly the fields torchtitan's config dataclasses had at its August 2026
snapshot (torchtitan/config/configs.py; slots, so a field torchtitan lacks fails as it would
there), and record which registry config, flavour and activation checkpointing the module chose.
Usage: check_torchtitan_config.py SEARCH_JSON  (prints {"plan": ..., "config": ...}).
"""

import json
import sys
import types


class TrainingConfig:
    __slots__ = ("num_tokens_per_microbatch_per_dp_rank", "num_tokens_per_train_step", "max_context_length",
                 "max_norm", "steps", "enable_cpu_offload", "disable_cuda_graphs", "dtype", "mixed_precision_param",
                 "mixed_precision_reduce", "gc_freq", "gc_debug")


class ParallelismConfig:
    __slots__ = ("data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
                 "enable_fsdp_symm_mem", "tensor_parallel_degree", "enable_sequence_parallel", "spmd_backend",
                 "pipeline_parallel_degree", "module_fqns_per_model_part", "pipeline_parallel_first_stage_less_layers",
                 "pipeline_parallel_last_stage_less_layers", "pipeline_parallel_layers_per_stage",
                 "pipeline_parallel_schedule", "pipeline_parallel_schedule_csv", "num_pp_microbatches",
                 "context_parallel_degree", "context_parallel_load_balancer", "context_parallel_ptrr_mask_key",
                 "expert_parallel_degree")


class LossFn:
    __slots__ = ("global_vocab_size",)


class Loss:
    __slots__ = ("loss_fn",)


class TrainerConfig:
    __slots__ = ("registry_config", "model_spec", "hf_assets_path", "loss", "training", "parallelism",
                 "activation_checkpoint")


def registry_config(name):
    def make():
        config = TrainerConfig()
        config.registry_config = name
        config.model_spec = {"flavour": "the registry config's"}
        config.training, config.parallelism, config.loss = TrainingConfig(), ParallelismConfig(), Loss()
        config.loss.loss_fn = LossFn()
        return config
    return make


def checkpointing(mode):
    return type(mode, (), {"Config": staticmethod(lambda: {"mode": mode})})


def install_stand_ins():
    modules = {
        "torchtitan.distributed.activation_checkpoint": {"FullAC": checkpointing("full"),
                                                          "SelectiveAC": checkpointing("selective")},
        "torchtitan.models.common.config_utils": {"decoder_vocab_size": lambda spec: "the vocabulary of " + spec["flavour"]},
        "torchtitan.models.llama3": {"model_registry": lambda flavour: {"flavour": flavour}},
        "torchtitan.models.qwen3": {"model_registry": lambda flavour: {"flavour": flavour}},
        "torchtitan.models.llama3.config_registry": {
            name: registry_config(name) for name in ("llama3_8b", "llama3_70b", "llama3_405b")},
        "torchtitan.models.qwen3.config_registry": {
            name: registry_config(name) for name in ("qwen3_32b", "qwen3_30b_a3b")},
    }
    for name, members in modules.items():
        module = types.ModuleType(name)
        module.__dict__.update(members)
        sys.modules[name] = module


def as_json(value):
    if hasattr(type(value), "__slots__"):
        return {slot: as_json(getattr(value, slot)) for slot in type(value).__slots__ if hasattr(value, slot)}
    return value


def main():
    result = json.load(open(sys.argv[1]))
    install_stand_ins()
    namespace = {}
    exec(compile(result["torchtitan_config"], "megaplan_plan.py", "exec"), namespace)
    print(json.dumps({"plan": result["plans"][0], "config": as_json(namespace["megaplan_plan"]())}))


if __name__ == "__main__":
    main()
