"""Packaging for avex-prune.

The top-level folders ``kernels/`` and ``profiling/`` are mapped into the ``avex`` namespace
(``avex.kernels``, ``avex.profiling``): PyPI already has distributions called ``kernels`` and
``profiling``, and ``transformers`` probes for an installed ``kernels`` package and imports it.
"""
from setuptools import setup

PACKAGE_DIRS = {
    "avex": "avex",
    "avex.kernels": "kernels",
    "avex.profiling": "profiling",
}

setup(
    name="avex-prune",
    version="0.1.0",
    description="Audio-visual exchange-aware token pruning for Video-LLMs: Triton kernels, "
    "PyTorch references and a training framework",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=list(PACKAGE_DIRS),
    package_dir=PACKAGE_DIRS,
    # Torch first, by hand: an unpinned torch on a CPU machine pulls CUDA wheels (see Makefile).
    install_requires=[
        "torch>=2.4",
        "triton>=3.2; platform_system=='Linux'",
        "transformers>=4.45",
        "fvcore",
        "pycocoevalcap",
        "safetensors",
        "tqdm",
        "numpy",
        "pyyaml",
        "matplotlib",
    ],
    extras_require={
        "dev": ["pytest", "pytest-benchmark", "hypothesis"],
        "flash": ["flash-attn"],
    },
)
