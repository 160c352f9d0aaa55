"""Edges of the public API found by probing: what padding may hold, which sample an error names,
positions of the wrong rank, load_policy's arguments, unsigned codes and numpy retentions."""
import numpy as np
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

import avex
from avex.policy import AVEXPolicy, PolicyConfig, TrainedOn
from avex.pruning import (AUDIO, PAD, TEXT, VISUAL, expand_av_keep, forward, generate,
                          item_index, prune_inputs, select_keep)
from badinput import INF, NAN

WIDTH = 8
ROWS = [[TEXT] * 2 + [VISUAL] * 8 + [AUDIO] * 4 + [TEXT] * 2,
        [TEXT] * 3 + [VISUAL] * 5 + [TEXT]]


def policy(selection="topk"):
    torch.manual_seed(0)
    return AVEXPolicy(PolicyConfig(input_size=WIDTH, hidden_size=WIDTH, num_heads=2,
                                   selection=selection,
                                   redundancy=2.0 if selection == "set-aware" else 0.0)).eval()


def padded(fill, left=True):
    """(embeds of each row alone, the batch left- or right-padded with ``fill``, its codes)."""
    torch.manual_seed(1)
    alone = [torch.randn(len(row), WIDTH) for row in ROWS]
    width = max(map(len, ROWS))
    embeds, modality = torch.full((2, width, WIDTH), fill), torch.full((2, width), PAD)
    for i, (row, e) in enumerate(zip(ROWS, alone)):
        span = slice(width - len(row), width) if left else slice(0, len(row))
        embeds[i, span], modality[i, span] = e, torch.tensor(row)
    return alone, embeds, modality


@pytest.mark.parametrize("fill", [NAN, INF, -INF, 1e30])
@pytest.mark.parametrize("selection", ["topk", "set-aware"])
@pytest.mark.parametrize("left", [True, False], ids=["left", "right"])
def test_padding_is_never_read_by_the_policy(fill, selection, left):
    """Whatever padding holds, a padded batch keeps what its rows keep alone (the policy's
    masked keys read 0 * NaN = NaN where the gathered slots held padding)."""
    pol = policy(selection)
    alone, embeds, modality = padded(fill, left)
    _, zeros, _ = padded(0.0, left)
    torch.testing.assert_close(pol.score(embeds, modality), pol.score(zeros, modality))
    for per_item in (False, True):
        batch = prune_inputs(embeds, modality, policy=pol, retention=0.4, per_item=per_item)
        for i, row in enumerate(ROWS):
            one = prune_inputs(alone[i][None], torch.tensor([row]), policy=pol, retention=0.4,
                               per_item=per_item)
            present = modality[i] != PAD
            assert torch.equal(batch.keep[i, 0, present], one.keep[0, 0])


@pytest.mark.parametrize("per_item", [False, True])
def test_a_non_finite_token_embedding_is_named_as_inputs_embeds(per_item):
    """Where the policy's scores would be NaN because a real token's embedding is, the error
    names inputs_embeds and where, not the scores the user never gave."""
    pol = policy()
    _, embeds, modality = padded(0.0)
    embeds[1, 10, 3] = NAN        # a visual token of sample 1
    with pytest.raises(ValueError, match=r"inputs_embeds holds nan at sample 1, position 10 "
                                         r"\(a visual token\)"):
        prune_inputs(embeds, modality, policy=pol, retention=0.4, per_item=per_item)
    embeds[1, 10, 3], embeds[0, 1, 0] = 0.0, INF     # a text token of sample 0
    with pytest.raises(ValueError, match=r"inputs_embeds holds inf at sample 0, position 1 "
                                         r"\(a text token\)"):
        pol.score(embeds, modality)


def test_per_item_errors_name_the_sample_and_the_item():
    modality = torch.tensor([[TEXT, VISUAL, VISUAL, VISUAL, AUDIO, AUDIO, AUDIO, TEXT],
                             [TEXT, TEXT, VISUAL, VISUAL, VISUAL, VISUAL, TEXT, TEXT]])
    embeds, scores = torch.randn(2, 8, 4), torch.randn(2, 8)
    scores[1, 2:6] = -INF          # sample 1's only item: items 0, 1 are sample 0's
    with pytest.raises(ValueError, match="scores: item 0 of sample 1 has 0 audio-visual"):
        prune_inputs(embeds, modality, scores=scores, retention=0.5, per_item=True)
    scores[1, 2:6], scores[0, 5] = 0.0, NAN
    with pytest.raises(ValueError, match="NaN at audio-visual position 5 of item 1 of sample 0"):
        prune_inputs(embeds, modality, scores=scores, retention=0.5, per_item=True)
    with pytest.raises(ValueError, match=r"scores must have shape \[2, 8\]"):
        prune_inputs(embeds, modality, scores=scores[:1], retention=0.5, per_item=True)


@pytest.fixture(scope="module")
def plain_lm():
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, pad_token_id=0, eos_token_id=None)).eval()


@pytest.mark.parametrize("run", [lambda m, p: generate(m, p, max_new_tokens=2), forward],
                         ids=["generate", "forward"])
def test_mrope_positions_for_a_plain_rope_model_are_refused(plain_lm, run):
    row = [TEXT] * 3 + [VISUAL] * 6 + [TEXT] * 2
    n = len(row)
    pruned = prune_inputs(torch.randn(1, n, 16), torch.tensor([row]), scores=torch.randn(1, n),
                          retention=0.5, position_ids=torch.arange(n).expand(3, 1, n).clone())
    with pytest.raises(ValueError, match=r"pruned.position_ids has shape \[3, 1, 8\] .* "
                                         r"Qwen2ForCausalLM takes position_ids of shape \[B, L\]"):
        run(plain_lm, pruned)


@pytest.fixture(scope="module")
def saved_policy(tmp_path_factory, plain_lm):
    pol = AVEXPolicy.from_llm(plain_lm, hidden_size=8)
    pol.trained_on = TrainedOn.of_model(plain_lm, "visual-then-audio", [0.1, 0.5])
    return pol.save_pretrained(tmp_path_factory.mktemp("policy") / "p")


NO_CUDA = not torch.cuda.is_available()


@pytest.mark.parametrize("kw,error,match", [
    (dict(device="gpu"), ValueError, r"device must be 'auto', 'cpu', 'cuda' or 'cuda:N' .* "
                                     r"got 'gpu'"),
    (dict(device="cuda:99"), ValueError, r"device is 'cuda:99' but (CUDA is not available|"
                                         r"this machine has)"),
    pytest.param(dict(device="cuda"), ValueError, "device is 'cuda' but CUDA is not available",
                 marks=pytest.mark.skipif(not NO_CUDA, reason="this machine has CUDA")),
    (dict(device=3), ValueError, "device must be .* got 3"),
    (dict(model="qwen2"), TypeError, r"model must be the Hugging Face model .* got str: 'qwen2'"),
    (dict(captioner="qwen2"), TypeError, "captioner must be a FrozenCaptioner .* got str"),
])
def test_load_policy_refuses_a_bad_device_or_model_first(saved_policy, kw, error, match):
    with pytest.raises(error, match=match):
        avex.load_policy(saved_policy, **kw)


def test_load_policy_places_the_policy_where_asked(saved_policy):
    with pytest.raises(ValueError, match="device must be .* got 'gpu'"):
        AVEXPolicy.from_pretrained(saved_policy, device="gpu")
    for device in ("cpu", torch.device("cpu"), "auto"):
        loaded = avex.load_policy(saved_policy, device=device)
        expected = "cuda" if device == "auto" and not NO_CUDA else "cpu"
        assert next(loaded.parameters()).device.type == expected


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int32])
def test_codes_of_any_integer_dtype_read_as_their_values(dtype):
    """uint8 codes (no padding: -1 isn't one) used to be refused, compared as -1 -> 255."""
    row = [TEXT, VISUAL, VISUAL, VISUAL, AUDIO, AUDIO, TEXT]
    modality = torch.tensor([row, row])
    small = modality.to(dtype)
    embeds, scores = torch.randn(2, len(row), WIDTH), torch.randn(2, len(row))
    for kw in (dict(scores=scores), dict(policy=policy()), dict(policy=policy("set-aware"))):
        for per_item in (False, True):
            expected = prune_inputs(embeds, modality, retention=0.5, per_item=per_item, **kw)
            got = prune_inputs(embeds, small, retention=0.5, per_item=per_item, **kw)
            assert torch.equal(got.keep, expected.keep)
            assert torch.equal(got.position_ids, expected.position_ids)
            chosen = select_keep(embeds, small, retention=0.5, per_item=per_item, **kw)
            assert torch.equal(chosen, expected.keep[:, 0] & (modality <= AUDIO))
    assert torch.equal(item_index(small), item_index(modality))
    av_keep = torch.tensor([[True, False, True, False, True]] * 2)
    assert torch.equal(expand_av_keep(av_keep, small), expand_av_keep(av_keep, modality))
    assert torch.equal(policy().score(embeds, small), policy().score(embeds, modality))
    bad = 200 if dtype == torch.uint8 else 5
    with pytest.raises(ValueError, match=f"got {bad} at sample 0, position 0"):
        prune_inputs(embeds, torch.full_like(small, bad), scores=scores, retention=0.5)


@pytest.mark.parametrize("retention", [np.float32(0.4), np.float64(0.4), np.float16(0.4),
                                       np.int64(1), np.array(0.4),
                                       np.array([0.4, 0.4], dtype=np.float32),
                                       [np.float32(0.4), np.float64(0.4)]],
                         ids=["float32", "float64", "float16", "int64", "0-d array",
                              "1-d array", "list"])
def test_numpy_retentions_are_read_as_numbers(retention):
    row = [TEXT] + [VISUAL] * 9 + [AUDIO] * 5 + [TEXT]
    modality = torch.tensor([row, row])
    embeds, scores = torch.randn(2, len(row), WIDTH), torch.randn(2, len(row))
    value = np.asarray(retention, dtype=np.float64).ravel()
    expected = [float(np.asarray(r).item()) for r in (retention if np.ndim(retention) else
                                                      [retention] * 2)]
    assert len(value) in (1, 2)
    for kw in (dict(scores=scores), dict(policy=policy())):
        got = prune_inputs(embeds, modality, retention=retention, **kw).keep
        assert torch.equal(got, prune_inputs(embeds, modality, retention=expected, **kw).keep)
