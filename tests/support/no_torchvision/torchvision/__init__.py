"""An importable stand-in for torchvision, for engines that serve the tiny Qwen3.5 on the CPU test bed only.

vLLM's qwen3_5.py imports qwen3_vl.py, which imports transformers' Qwen2-VL image processor, which imports
`torchvision.transforms.v2.functional` at module level. The package registries reachable here hold only CUDA
builds of torchvision, which fail to load beside torch+cpu ("operator torchvision::nms does not exist"). The
engines run `--language-model-only` and are sent text only: no image is ever processed, so every name here is a
placeholder that fails loudly if anything calls it. Put this folder on an engine's PYTHONPATH (tests/connector/
test_families.py does, for Qwen3.5 only); never on a real deployment's, where torchvision is installed for real.
"""

from torchvision._absent import module_getattr as __getattr__  # noqa: F401

__version__ = "0.0+absent"  # transformers parses it: an old version keeps it off torchvision code paths
