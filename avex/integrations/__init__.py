"""Integrations with serving stacks, each an optional extra: ``avex.integrations.vllm``
(``pip install avex-prune[vllm]``, docs/serving.md)."""
