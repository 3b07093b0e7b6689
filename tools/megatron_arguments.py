#!/usr/bin/env python3
"""Lists every argument of Megatron-LM's training parser, the reference core/megatron_arguments.cc's
table is tested against (tests/data/megatron_arguments.tsv).

Megatron builds its parser from argparse calls and from dataclass fields (ArgumentGroupFactory), so
the list is read from the parser itself: `add_megatron_arguments` on a fresh ArgumentParser. Its
imports need torch and a dozen optional packages; where they are missing (this is meant to run on a
CPU machine) they are replaced by stand-in modules, which is enough because building the parser
never calls into them.

Usage: megatron_arguments.py MEGATRON_LM_DIR > tests/data/megatron_arguments.tsv
Prints one line per spelling: flag, arity (switch, one, list, three), argparse group, and the
first spelling of its argument (the row it aliases).
"""
import argparse
import importlib.abc
import importlib.machinery
import logging
import re
import sys
import types
import typing

typing.override = getattr(typing, "override", lambda function: function)  # Python < 3.12

STAND_INS = {
    "torch", "transformer_engine", "apex", "einops", "numpy", "nvidia_resiliency_ext", "wandb", "tensorboard",
    "triton", "flash_attn", "tqdm", "safetensors", "modelopt", "psutil", "mamba_ssm", "causal_conv1d", "tensorstore",
    "zarr", "nvtx", "onelogger", "one_logger", "sentencepiece", "tiktoken", "transformers", "emerging_optimizers",
    "multistorageclient", "flashinfer", "nv_one_logger", "pynvml", "nltk", "msc", "datasets", "scipy", "PIL", "flask",
    "flask_restful", "opentelemetry", "requests", "pydantic", "wrapt", "lightning", "hydra", "omegaconf", "tokenizers",
    "fsspec", "jinja2", "torch_memory_saver", "nvshmem", "deep_ep", "grouped_gemm", "amp_C", "fused_layer_norm_cuda",
    "fused_weight_gradient_mlp_cuda", "nvidia_kitchen", "cuda", "packaging",
}


class StandInMeta(type(typing.Protocol)):
    """Classes that answer any attribute, subscript or call with another stand-in."""

    def __new__(mcls, name, bases, namespace, **_):
        return super().__new__(mcls, name, bases, namespace)

    def __init__(cls, name, bases, namespace, **_):
        super().__init__(name, bases, namespace)

    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return stand_in(f"{cls.__name__}.{name}")

    def __getitem__(cls, _):
        return cls

    def __or__(cls, other):
        return typing.Union[cls, other]

    def __ror__(cls, other):
        return typing.Union[other, cls]

    def __call__(cls, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator
        return type.__call__(cls)

    def __iter__(cls):
        return iter(())

    def __lt__(cls, _):
        return False

    __gt__ = __lt__

    def __le__(cls, _):
        return True

    __ge__ = __le__


class StandIn(metaclass=StandInMeta):
    def __init_subclass__(cls, **_):
        pass

    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return stand_in(name)

    def __call__(self, *args, **kwargs):
        return stand_in("result")()

    def __iter__(self):
        return iter(())

    def __getitem__(self, _):
        return stand_in("item")()

    def __bool__(self):
        return False

    def __int__(self):
        return 0

    __index__ = __int__


def stand_in(name):
    return StandInMeta(name.split(".")[-1], (StandIn,), {"__module__": name.rsplit(".", 1)[0]})


class Version:
    """packaging.version.Version's comparisons, on the leading numbers."""

    def __init__(self, text):
        self.text = str(text)
        self.numbers = tuple(int(n) for n in re.findall(r"\d+", self.text)[:3])
        self.major, self.minor, self.micro = (self.numbers + (0, 0, 0))[:3]
        self.base_version = self.text

    def __lt__(self, other):
        return self.numbers < other.numbers

    def __le__(self, other):
        return self.numbers <= other.numbers

    def __gt__(self, other):
        return self.numbers > other.numbers

    def __ge__(self, other):
        return self.numbers >= other.numbers

    def __eq__(self, other):
        return self.numbers == other.numbers

    def __hash__(self):
        return hash(self.numbers)

    def __str__(self):
        return self.text


class StandInModule(types.ModuleType):
    def __getattr__(self, name):
        if name == "__version__":
            return "99.0.0"
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if self.__name__.startswith("packaging") and name in ("Version", "parse"):
            return Version
        value = stand_in(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        root = name.split(".")[0]
        if root not in STAND_INS:
            return None
        try:  # a package that is installed is used as it is
            if root != name or importlib.machinery.PathFinder.find_spec(root) is None:
                raise ImportError
            return None
        except ImportError:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        module = StandInModule(spec.name)
        module.__path__ = []
        module.__spec__ = spec
        return module

    def exec_module(self, module):
        pass


def arity(action):
    if action.nargs == 0:
        return "switch"
    if action.nargs in ("+", "*"):
        return "list"
    if action.nargs == 3:
        return "three"
    return "one"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    logging.disable(logging.INFO)  # Megatron's import-time messages would land in the list
    sys.meta_path.insert(0, StandInFinder())
    sys.path.insert(0, sys.argv[1])
    from megatron.training.arguments import add_megatron_arguments

    parser = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
    add_megatron_arguments(parser)
    for group in parser._action_groups:
        for action in group._group_actions:
            for spelling in action.option_strings:
                print(f"{spelling}\t{arity(action)}\t{group.title}\t{action.option_strings[0]}")


if __name__ == "__main__":
    main()
