"""``python -m avex.policy``: count the policy's parameters at a backbone's dimensions (no
weights are made: the LLM is built on the meta device)."""
from __future__ import annotations

import argparse
from dataclasses import asdict

import torch

from avex import _checks
from avex.backbones import BACKBONES, backbone_config
from avex.policy.network import AVEXPolicy, parameter_count


def main(argv=None):
    from transformers import AutoModelForCausalLM

    parser = argparse.ArgumentParser(
        prog="python -m avex.policy",
        description="Count the policy's parameters at a backbone's dimensions (no weights).")
    parser.add_argument("--backbone", default="qwen2-7b",
                        help=f"one of {sorted(BACKBONES)} or a path to a Hugging Face config")
    parser.add_argument("--hidden-size", type=int, default=None,
                        help="policy width; default: the LLM's width (first block from the LLM)")
    args = parser.parse_args(argv)
    try:  # a bad flag is a usage error, before any model is built
        _checks.optional_int_at_least("hidden_size", args.hidden_size, 1)
        config = backbone_config(args.backbone)
    except (ValueError, TypeError, OSError) as err:
        parser.error(str(err))
    with torch.device("meta"):
        llm = AutoModelForCausalLM.from_config(config)
        policy = AVEXPolicy.from_llm(llm, hidden_size=args.hidden_size, init_from_llm=False)
    count = parameter_count(policy)
    print(f"backbone {args.backbone}: LLM width {config.hidden_size}, policy width "
          f"{policy.config.hidden_size} -> {count / 1e6:.1f}M trainable parameters")
    print(asdict(policy.config))
    return count


if __name__ == "__main__":
    main()
