"""The AVEX policy: masking, text conditioning, initialisation from an LLM, sizes."""
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from avex.policy import AVEXPolicy, PolicyConfig, parameter_count, position_features
from avex.policy.__main__ import main as count_main
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


def test_init_layers_copies_that_many_llm_layers_and_nothing_else():
    """``init_layers`` n: blocks 0..n-1 are the LLM's layers 0..n-1, every other weight is the
    one a policy with 1 copied layer draws (the random init comes first)."""
    llm = tiny_llm()
    torch.manual_seed(3)
    one = AVEXPolicy.from_llm(llm).state_dict()
    for n in (0, 2):
        torch.manual_seed(3)
        policy = AVEXPolicy.from_llm(llm, init_layers=n)
        for i, block in enumerate(policy.encoder):
            source = llm.model.layers[i].state_dict()
            # matrices only: RMSNorm weights start at 1 in both
            copied = [torch.equal(v, source[k]) for k, v in block.state_dict().items()
                      if v.dim() == 2]
            assert all(copied) if i < n else not any(copied), (n, i)
        for name, value in policy.state_dict().items():
            if not name.startswith(tuple(f"encoder.{i}." for i in range(2))):
                assert torch.equal(value, one[name]), (n, name)
        assert torch.equal(policy.encoder[1].self_attn.q_proj.weight,
                           one["encoder.1.self_attn.q_proj.weight"]) == (n < 2)


@pytest.mark.parametrize("kwargs, message", [
    (dict(init_layers=3), r"init_layers must be an int in \[0, 2\] \(the policy's blocks\), "
                          r"got 3"),
    (dict(init_layers=True), r"init_layers must be an int in \[0, 2\].*got True"),
    (dict(init_layers=2, hidden_size=16), r"init_layers = 2 copies the LLM's decoder layers, so "
                                          r"the policy must be as wide as the LLM \(32\), not 16"),
    (dict(init_layers=2, num_layers=3), r"init_layers = 2, but Qwen2ForCausalLM has 1 decoder"),
])
def test_init_layers_refuses_what_it_cannot_copy(kwargs, message):
    num_layers = kwargs.pop("num_layers", 2)
    llm = tiny_llm()
    if num_layers == 3:   # a 3-block policy over a 1-layer LLM: ask for 2 of its layers
        llm.model.layers = llm.model.layers[:1]
    with pytest.raises(ValueError, match=message):
        AVEXPolicy.from_llm(llm, num_layers=num_layers, **kwargs)


def test_compact_policy_projects_inputs_and_trains():
    embeds, modality = batch()
    policy = AVEXPolicy.from_llm(tiny_llm(), hidden_size=16)
    assert policy.config.hidden_size == 16
    scores = policy(embeds, modality)
    scores[torch.isfinite(scores)].sum().backward()
    assert all(p.grad is not None for p in policy.parameters())


def test_size_at_the_papers_dimensions():
    """Qwen2-7B width, compact policy of width 768: close to the paper's ~30M."""
    count = count_main(["--backbone", "qwen2-7b", "--hidden-size", "768"])
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


# ------------------------------------------------------------------------------------------------
# The inference path (score: AV tokens and text gathered first) against forward
# ------------------------------------------------------------------------------------------------

def ragged(seed: int, rows: int, width: int):
    """A ragged batch: per row a random prompt, video and audio (some rows one modality only,
    some interleaved, one left- and one right-padded), of random lengths."""
    gen = torch.Generator().manual_seed(seed)
    layouts = []
    for row in range(rows):
        nv, na = (int(x) for x in torch.randint(0, 40, (2,), generator=gen))
        nv, na = (nv or 1, na) if row % 3 else (nv, na or 1)
        prefix, suffix = [TEXT] * int(torch.randint(1, 6, (1,), generator=gen)), \
            [TEXT] * int(torch.randint(0, 9, (1,), generator=gen))
        if row % 4 == 3:   # interleaved chunks, as Qwen2.5-Omni lays out video with audio
            av = sum(([VISUAL] * 4 + [AUDIO] * 2 for _ in range(nv // 4 + 1)), [])
        else:
            av = [VISUAL] * nv + [AUDIO] * na
        layouts.append(prefix + av + suffix)
    length = max(map(len, layouts)) + 2
    modality = torch.full((rows, length), PAD)
    for row, layout in enumerate(layouts):
        start = 0 if row == 1 else length - len(layout)   # row 1 right-padded, others left
        modality[row, start:start + len(layout)] = torch.tensor(layout)
    return torch.randn(rows, length, width, generator=gen), modality


@pytest.mark.parametrize("hidden,positional", [(32, True), (16, True), (32, False)])
@pytest.mark.parametrize("seed", range(4))
def test_gathered_scores_equal_the_full_sequence_scores(hidden, positional, seed):
    """score() reads only the AV tokens and the text: it equals forward() over every position
    (today's scoring) to float32 rounding, and keeps the same Top-K at every retention, so no
    trained policy's selections change."""
    from avex.kernels import gumbel_topk
    from avex.selection import AVLayout

    torch.manual_seed(seed)
    policy = AVEXPolicy(PolicyConfig(input_size=32, hidden_size=hidden, num_heads=4,
                                     positional=positional)).eval()
    embeds, modality = ragged(seed, rows=6, width=32)
    with torch.no_grad():
        full = policy(embeds, modality)
    gathered = policy.score(embeds, modality)
    is_av = (modality == VISUAL) | (modality == AUDIO)
    assert (gathered[~is_av] == float("-inf")).all()
    torch.testing.assert_close(gathered[is_av], full[is_av], rtol=0, atol=1e-5)
    layout = AVLayout.of(modality)
    for retention in (0.5, 0.4, 0.3, 0.2, 0.1, 1.0):
        budget = layout.budget(retention)
        assert torch.equal(gumbel_topk(layout.gather(gathered), budget, sample=False)[0],
                           gumbel_topk(layout.gather(full), budget, sample=False)[0])


def test_gathered_scores_do_not_depend_on_the_other_rows():
    """A row scores the same alone and in a ragged batch (what serving one request and
    evaluating a batch of clips must agree on)."""
    policy = AVEXPolicy(PolicyConfig(input_size=32, hidden_size=32, num_heads=4)).eval()
    embeds, modality = ragged(7, rows=5, width=32)
    together = policy.score(embeds, modality)
    for row in range(5):
        present = modality[row] != PAD
        alone = policy.score(embeds[row, present][None], modality[row, present][None])
        torch.testing.assert_close(alone[0], together[row, present], rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------------------------
# The artifact: save_pretrained / from_pretrained / load_policy
# ------------------------------------------------------------------------------------------------

def trained_policy(llm, layout="visual-then-audio"):
    from avex.policy import TrainedOn
    policy = AVEXPolicy.from_llm(llm, hidden_size=16).eval()
    policy.trained_on = TrainedOn.of_model(llm, layout, [0.5, 0.1])
    return policy


def test_save_pretrained_round_trip(tmp_path):
    import json
    import avex

    llm = tiny_llm()
    policy = trained_policy(llm)
    policy.save_pretrained(tmp_path / "p")
    record = json.loads((tmp_path / "p" / "config.json").read_text())
    assert record["format"] == "avex-policy"
    assert record["trained_on"] == {"model_type": "qwen2", "hidden_size": 32,
                                    "layout": "visual-then-audio",
                                    "retention_range": [0.1, 0.5]}
    loaded = avex.load_policy(tmp_path / "p", model=llm)
    assert isinstance(loaded, avex.AVEXPolicy) and not loaded.training
    assert loaded.trained_on == policy.trained_on
    embeds, modality = batch()
    assert torch.equal(loaded.score(embeds, modality), policy.score(embeds, modality))
    assert torch.equal(AVEXPolicy.from_pretrained(tmp_path / "p").score(embeds, modality),
                       policy.score(embeds, modality))


def test_policy_prunes_like_its_scores():
    """prune_inputs(policy=) keeps what prune_inputs(scores=policy.score(...)) keeps."""
    from avex.pruning import prune_inputs

    policy = trained_policy(tiny_llm())
    embeds, modality = batch()
    served = prune_inputs(embeds, modality, policy=policy, retention=0.4)
    by_scores = prune_inputs(embeds, modality, scores=policy.score(embeds, modality),
                             retention=0.4)
    assert torch.equal(served.keep, by_scores.keep)
    with pytest.warns(UserWarning, match=r"retention=0.9 lies outside the range the policy was "
                                         r"trained at \(0.1-0.5\)"):
        prune_inputs(embeds, modality, policy=policy, retention=0.9)


def test_row_layouts():
    from avex.policy import layout_of, row_layouts

    V, A, T = VISUAL, AUDIO, TEXT
    modality = torch.tensor([[T, V, V, A, T, PAD], [T, V, A, V, A, T], [T, A, A, T, T, T],
                             [T, A, V, V, T, PAD], [PAD, T, V, T, V, T], [T, T, T, T, T, T]])
    names = row_layouts(modality)
    assert names == ["visual-then-audio", "interleaved", "audio", "audio-then-visual",
                     "visual", None]
    assert layout_of(names[:1] + names[2:3] + names[4:]) == "visual-then-audio"
    assert layout_of(["visual", "visual"]) == "visual"
    assert layout_of(names) == "interleaved"
