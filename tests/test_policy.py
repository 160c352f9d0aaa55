"""The AVEX policy: masking, text conditioning, initialisation from an LLM, sizes."""
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from avex.policy import (AVEXPolicy, PolicyConfig, _count_main, parameter_count,
                         position_features)
from avex.pruning import AUDIO, PAD, TEXT, VISUAL


def tiny_llm():
    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=50)
    return Qwen2ForCausalLM(config).eval()


def batch(width=32):
    torch.manual_seed(1)
    layout = [TEXT] * 3 + [VISUAL] * 6 + [AUDIO] * 3 + [TEXT] * 2
    modality = torch.tensor([layout, [PAD, PAD] + layout[:-2]])
    return torch.randn(2, len(layout), width), modality


def test_scores_are_finite_on_av_tokens_only():
    embeds, modality = batch()
    scores = AVEXPolicy.from_llm(tiny_llm())(embeds, modality)
    is_av = (modality == VISUAL) | (modality == AUDIO)
    assert scores.shape == modality.shape and scores.dtype == torch.float32
    assert torch.isfinite(scores[is_av]).all()
    assert (scores[~is_av] == float("-inf")).all()


def test_padding_does_not_leak_into_scores():
    embeds, modality = batch()
    policy = AVEXPolicy.from_llm(tiny_llm()).eval()
    before = policy(embeds, modality)
    changed = embeds.clone()
    changed[modality == PAD] = 100.0
    torch.testing.assert_close(policy(changed, modality), before)


def test_scores_depend_on_the_prompt():
    embeds, modality = batch()
    policy = AVEXPolicy.from_llm(tiny_llm()).eval()
    other = embeds.clone()
    other[modality == TEXT] = torch.randn_like(other[modality == TEXT])
    is_av = (modality == VISUAL) | (modality == AUDIO)
    assert not torch.allclose(policy(other, modality)[is_av], policy(embeds, modality)[is_av])


def test_first_block_starts_from_the_llm_first_layer():
    llm = tiny_llm()
    policy = AVEXPolicy.from_llm(llm)
    source = llm.model.layers[0].state_dict()
    for name, value in policy.encoder[0].state_dict().items():
        torch.testing.assert_close(value, source[name], msg=name)
    assert not torch.equal(policy.encoder[1].self_attn.q_proj.weight,
                           llm.model.layers[1].self_attn.q_proj.weight)
    assert policy.encoder[0].self_attn.q_proj.bias is not None  # Qwen2 has q/k/v bias


def test_compact_policy_projects_inputs_and_trains():
    embeds, modality = batch()
    policy = AVEXPolicy.from_llm(tiny_llm(), hidden_size=16)
    assert policy.config.hidden_size == 16
    scores = policy(embeds, modality)
    scores[torch.isfinite(scores)].sum().backward()
    assert all(p.grad is not None for p in policy.parameters())


def test_size_at_the_papers_dimensions():
    """Qwen2-7B width, compact policy of width 768: close to the paper's ~30M."""
    count = _count_main(["--backbone", "qwen2-7b", "--hidden-size", "768"])
    assert 25e6 < count < 30e6


def test_bad_input_is_rejected():
    policy = AVEXPolicy(PolicyConfig(input_size=32, hidden_size=32, num_heads=4))
    embeds, modality = batch()
    with pytest.raises(ValueError, match=r"modality has shape \[2, 13\]"):
        policy(embeds, modality[:, :-1])
    with pytest.raises(ValueError, match="inputs_embeds has width 8"):
        policy(embeds[..., :8], modality)
    with pytest.raises(TypeError, match="modality must be an integer tensor"):
        policy(embeds, modality.float())
    with pytest.raises(ValueError, match=r"hidden_size \(30\) must be divisible by num_heads"):
        PolicyConfig(input_size=8, hidden_size=30, num_heads=4)
    assert parameter_count(policy) > 0


def test_position_features_count_within_each_modality():
    _, modality = batch()
    features = position_features(modality)
    is_av = (modality == VISUAL) | (modality == AUDIO)
    assert (features[~is_av] == 0).all()
    # the last feature is the place within the modality: 0 first, 1 last, in order
    fraction = features[..., -1]
    for row in range(2):
        for code, count in ((VISUAL, 6), (AUDIO, 3)):
            expected = torch.arange(count, dtype=torch.float32) / (count - 1)
            torch.testing.assert_close(fraction[row][modality[row] == code], expected)
    # left padding shifts the sequence, not the features
    torch.testing.assert_close(features[1][is_av[1]], features[0][is_av[0]])


def test_positional_policy_tells_identical_tokens_apart():
    """Equal embeddings at different places: the same score without the position features
    (attention without positions is permutation-equivariant), different scores with them."""
    embeds, modality = batch()
    embeds[modality == VISUAL] = embeds[0, 3].clone()
    visual = modality[0] == VISUAL
    for positional, differ in ((False, False), (True, True)):
        torch.manual_seed(0)
        policy = AVEXPolicy.from_llm(tiny_llm(), positional=positional).eval()
        with torch.no_grad():
            scores = policy(embeds, modality)[0][visual]
        assert bool((scores.max() - scores.min()).abs() > 1e-5) == differ, positional
