"""The README's "Use it in your pipeline" snippet, run as written.

``.ci/wheel_check.sh`` runs the same block, found by :func:`readme_pipeline_snippet`, against
the installed wheel from outside the repository.
"""
import re
from pathlib import Path

import torch

SNIPPET = '''\
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from avex.pruning import AUDIO, PAD, TEXT, VISUAL, generate, prune_inputs

# Any Hugging Face *ForCausalLM that takes inputs_embeds; a tiny random one stands in here.
model = Qwen2ForCausalLM(Qwen2Config(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, pad_token_id=0)).eval()

# Your multimodal prompt as embeddings, with one modality code per position: here
# [system text | 24 visual | 8 audio | question], the second sample shorter and left-padded.
embeds = torch.randn(2, 40, model.config.hidden_size)
modality = torch.tensor([
    [TEXT] * 4 + [VISUAL] * 24 + [AUDIO] * 8 + [TEXT] * 4,
    [PAD] * 10 + [TEXT] * 4 + [VISUAL] * 16 + [AUDIO] * 6 + [TEXT] * 4,
])
scores = torch.randn(2, 40)  # your policy's keep scores; only AV positions are read

# Keep round(0.4 * N) AV tokens per sample (all text), compacted with their original positions.
pruned = prune_inputs(embeds, modality, scores=scores, retention=0.4)
tokens = generate(model, pruned, max_new_tokens=16, num_beams=3)  # any model.generate kwargs
print(pruned.inputs_embeds.shape, tokens.shape)  # torch.Size([2, 21, 64]) torch.Size([2, 16])
'''


def test_snippet_runs_and_prunes():
    namespace = {}
    exec(compile(SNIPPET, "README.md", "exec"), namespace)
    pruned, tokens, modality = namespace["pruned"], namespace["tokens"], namespace["modality"]
    # round(0.4 * 32) = 13 and round(0.4 * 22) = 9 AV tokens, plus 8 text tokens each
    assert pruned.attention_mask.sum(1).tolist() == [21, 17]
    assert pruned.inputs_embeds.shape == (2, 21, 64)
    assert tokens.shape == (2, 16)
    assert pruned.next_position.tolist() == [40, 30]
    assert torch.equal(pruned.keep[:, 0] & (modality == 2), modality == 2)


def readme_pipeline_snippet(readme: str) -> str | None:
    """The first ```python block containing ``prune_inputs`` in the section (subsections
    included) of the first Markdown heading that mentions "pipeline"; None if there is none."""
    section_level, block, in_fence = None, None, False
    for line in readme.splitlines(keepends=True):
        if line.startswith("```"):
            if block is not None and in_fence:
                if "prune_inputs" in "".join(block):
                    return "".join(block)
                block = None
            elif section_level is not None and line.strip() == "```python":
                block = []
            in_fence = not in_fence
        elif in_fence:
            if block is not None:
                block.append(line)
        elif (heading := re.match(r"(#+)\s+(.*)", line)) is not None:
            level = len(heading.group(1))
            if section_level is not None and level <= section_level:
                return None
            if section_level is None and "pipeline" in heading.group(2).lower():
                section_level = level
    return None


def test_readme_pipeline_snippet_finds_the_block():
    readme = ("# T\n## Use it in your pipeline\n```bash\nprune_inputs\n```\n"
              "```python\n# not a heading\nx = 1\n```\n### Example\n"
              "```python\nfrom avex.pruning import prune_inputs\n```\n## Next\n")
    assert readme_pipeline_snippet(readme) == "from avex.pruning import prune_inputs\n"
    assert readme_pipeline_snippet(readme.replace("### Example", "## Example")) is None
    assert readme_pipeline_snippet("# T\n```python\nprune_inputs\n```\n") is None


def test_readme_shows_this_snippet():
    """The README's pipeline section shows exactly SNIPPET (the code tested above)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    assert readme_pipeline_snippet(readme) == SNIPPET
