"""avex.adapters + prune_inputs + generate on tiny random instances of the five supported
audio-visual families (tests/tiny_av_models.py), batch of two, ragged and left-padded, real
placeholder layouts (Qwen2.5-Omni: audio interleaved with video through use_audio_in_video).

The reference is the full sequence with the dropped tokens masked out of attention, at the
model's own positions (and, for Gemma 3n, its own per-layer inputs). A deliberately wrong
position must fail the same checks."""
import contextlib
import inspect

import pytest
import torch
import transformers
from packaging.version import Version

import tiny_av_models as tiny
from avex.adapters import adapt, adapter_for, has_own_positions
from avex.modality import AUDIO, PAD, TEXT, VISUAL
from avex import pruning
from avex.pruning import generation
from avex.pruning import generate

STEPS = 5


# transformers 5.17's Gemma3nForConditionalGeneration.forward has no per_layer_inputs: the
# adapter refuses it there (test_gemma3n_is_refused_where_per_layer_inputs_cannot_be_passed)
GEMMA3N_SUPPORTED = "per_layer_inputs" in inspect.signature(
    transformers.Gemma3nForConditionalGeneration.forward).parameters


@pytest.fixture(scope="module", params=list(tiny.BUILDERS))
def family(request):
    if request.param == "gemma3n" and not GEMMA3N_SUPPORTED:
        pytest.skip(f"transformers {transformers.__version__} can't take Gemma 3n's "
                    "per_layer_inputs with inputs_embeds; adapt refuses it (tested below)")
    model, inputs = tiny.BUILDERS[request.param]()
    return request.param, model, inputs, adapt(model, **inputs)


def test_gemma3n_is_refused_where_per_layer_inputs_cannot_be_passed():
    model, inputs = tiny.gemma3n()
    if GEMMA3N_SUPPORTED:
        assert adapt(model, **inputs).per_token["per_layer_inputs"].shape[:2] == \
            inputs["input_ids"].shape
    else:
        with pytest.raises(ValueError, match="takes no per_layer_inputs"):
            adapt(model, **inputs)


def native_positions(adapted):
    if adapted.position_ids is not None:
        return adapted.position_ids
    return (adapted.attention_mask.cumsum(1) - 1).clamp_min(0)


def scores_for(adapted, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(adapted.modality.shape, generator=gen)


@contextlib.contextmanager
def prefill_only(model, per_token):
    """Hand per-token inputs to the prefill of model.generate (decode steps compute them from
    the generated ids, as the model does)."""
    def hook(module, args, kwargs):
        embeds = kwargs.get("inputs_embeds")
        if embeds is not None:
            expand = embeds.shape[0] // next(iter(per_token.values())).shape[0]
            for name, value in per_token.items():
                kwargs[name] = value.repeat_interleave(expand, dim=0)
        return args, kwargs
    handle = model.register_forward_pre_hook(hook, with_kwargs=True) if per_token else None
    try:
        yield
    finally:
        if handle is not None:
            handle.remove()


@torch.no_grad()
def reference_logits(model, adapted, keep):
    mask = (keep & (adapted.modality != PAD)).long()
    out = model(inputs_embeds=adapted.inputs_embeds, attention_mask=mask,
                position_ids=native_positions(adapted), **adapted.per_token).logits
    return out[mask.bool()]


@torch.no_grad()
def reference_generate(model, adapted, keep, **kwargs):
    mask = (keep & (adapted.modality != PAD)).long()
    with prefill_only(model, adapted.per_token):
        return model.generate(inputs_embeds=adapted.inputs_embeds, attention_mask=mask,
                              position_ids=native_positions(adapted), do_sample=False,
                              max_new_tokens=STEPS, **kwargs)


@torch.no_grad()
def pruned_logits(model, pruned):
    out = model(inputs_embeds=pruned.inputs_embeds, attention_mask=pruned.attention_mask,
                position_ids=pruned.position_ids, **pruned.per_token).logits
    return out[pruned.attention_mask.bool()]


def test_modality_codes_follow_the_placeholders(family):
    name, model, inputs, adapted = family
    ids, codes = inputs["input_ids"], adapted.modality
    assert torch.equal(codes == PAD, inputs["attention_mask"] == 0)
    assert adapter_for(model).__name__.endswith(name)
    assert (codes == TEXT).any(1).all() and ((codes == VISUAL) | (codes == AUDIO)).any(1).all()
    placeholders = {"qwen2_5_omni": {tiny.OMNI["video"]: VISUAL, tiny.OMNI["audio"]: AUDIO},
                    "qwen2_5_vl": {tiny.VL["image"]: VISUAL, tiny.VL["video"]: VISUAL},
                    "llava_onevision": {tiny.LLAVA["video"]: VISUAL},
                    "qwen2_audio": {tiny.QWEN2_AUDIO["audio"]: AUDIO},
                    "gemma3n": {tiny.GEMMA["image"]: VISUAL, tiny.GEMMA["audio"]: AUDIO}}[name]
    present = inputs["attention_mask"].bool()
    for token, code in placeholders.items():
        at = (ids == token) & present
        if name == "llava_onevision":
            # the last slot of each video holds the learned image_newline: layout, so text
            newline = at & ~torch.roll(at, -1, dims=1)
            assert (codes[newline] == TEXT).all() and newline.sum() == 2
            at = at & ~newline
        assert (codes[at] == code).all()
    others = present & ~torch.isin(ids, torch.tensor(list(placeholders)))
    assert (codes[others] == TEXT).all()  # markers (start/end of image, audio, video) too


def test_own_positions_is_what_the_adapter_returns(family):
    # the frozen captioner asks has_own_positions whether clips need exported positions
    name, model, _, adapted = family
    assert has_own_positions(model.config.model_type) is (adapted.position_ids is not None)
    assert adapter_for(model).OWN_POSITIONS is (adapted.position_ids is not None)
    if adapted.position_ids is not None:  # M-RoPE: one row per axis
        assert adapted.position_ids.shape[0] == 3


def test_has_own_positions_is_false_for_types_no_adapter_knows():
    assert [has_own_positions(kind) for kind in ("qwen2", "llama", None)] == [False] * 3


def test_keeping_everything_generates_what_the_model_itself_generates(family):
    name, model, inputs, adapted = family
    pruned = adapted.prune(keep=adapted.modality != PAD)
    prompt = inputs["input_ids"].shape[1]
    for kwargs in (dict(), dict(num_beams=3)):
        if (name == "qwen2_5_omni" and kwargs
                and Version(transformers.__version__) < Version("5.24")):
            # 5.17 repeats pixel_values_videos patch by patch (not video by video) for beam
            # search, so the model's own beam output is wrong there; 5.24 expands it right
            continue
        with torch.no_grad():
            own = model.generate(**inputs, max_new_tokens=STEPS, do_sample=False, **kwargs)
        ours = generate(model, pruned, max_new_tokens=STEPS, do_sample=False, **kwargs)
        assert torch.equal(ours, own[:, prompt:]), (name, kwargs)


def test_kept_logits_match_the_masked_full_sequence(family):
    name, model, inputs, adapted = family
    pruned = adapted.prune(scores=scores_for(adapted, 1), retention=0.4)
    assert pruned.inputs_embeds.shape[1] < adapted.inputs_embeds.shape[1]
    ref = reference_logits(model, adapted, pruned.keep[:, 0])
    torch.testing.assert_close(pruned_logits(model, pruned), ref, rtol=0, atol=1e-5)
    # the positions the old 1-D path would give (a count of the kept tokens) fail the check
    wrong = pruned._replace(position_ids=(pruned.attention_mask.cumsum(1) - 1).clamp_min(0))
    with pytest.raises(AssertionError):
        torch.testing.assert_close(pruned_logits(model, wrong), ref, rtol=0, atol=1e-3)


def test_checked_forward_matches_the_masked_full_sequence(family):
    name, model, inputs, adapted = family
    pruned = adapted.prune(scores=scores_for(adapted, 1), retention=0.4)
    ref = reference_logits(model, adapted, pruned.keep[:, 0])
    with torch.no_grad():
        logits = pruning.forward(model, pruned).logits
    torch.testing.assert_close(logits[pruned.attention_mask.bool()], ref, rtol=0, atol=1e-5)
    if name == "gemma3n":  # a raw forward without the per-layer inputs is silently off
        with torch.no_grad():
            raw = model(inputs_embeds=pruned.inputs_embeds, attention_mask=pruned.attention_mask,
                        position_ids=pruned.position_ids).logits
        with pytest.raises(AssertionError):
            torch.testing.assert_close(raw[pruned.attention_mask.bool()], ref, rtol=0,
                                       atol=1e-2)


@pytest.mark.parametrize("beams", [1, 3])
def test_generation_matches_the_masked_full_sequence(family, beams):
    name, model, inputs, adapted = family
    pruned = adapted.prune(scores=scores_for(adapted, 2), retention=0.4)
    ref = reference_generate(model, adapted, pruned.keep[:, 0], num_beams=beams)
    ours = generate(model, pruned, max_new_tokens=STEPS, do_sample=False, num_beams=beams)
    assert torch.equal(ours, ref)
    if beams == 1:
        wrong = pruned._replace(position_ids=(pruned.attention_mask.cumsum(1) - 1).clamp_min(0),
                                next_position=pruned.attention_mask.sum(1))
        if pruning.uses_mrope(model):  # 1-D positions on M-RoPE: refused, not run
            with pytest.raises(ValueError, match="M-RoPE positions"):
                generate(model, wrong, max_new_tokens=STEPS, do_sample=False)
        else:  # the contiguous positions really are wrong: the check above can fail
            assert not torch.equal(generate(model, wrong, max_new_tokens=STEPS,
                                            do_sample=False), ref)


def test_gemma3n_without_its_per_layer_inputs_is_refused():
    model, inputs = tiny.gemma3n()
    embeds = torch.randn(2, 6, tiny.TEXT["hidden_size"])
    pruned = pruning.prune_inputs(embeds, torch.tensor([[TEXT, VISUAL, VISUAL, AUDIO, TEXT,
                                                         TEXT]] * 2), keep=torch.ones(2, 6,
                                                                                     dtype=bool))
    match = "needs per_layer_inputs" if GEMMA3N_SUPPORTED else "takes none beside inputs_embeds"
    with pytest.raises(ValueError, match=match):
        generate(model, pruned, max_new_tokens=2)


def test_decoding_continues_where_the_model_would_after_a_pruned_final_av_token():
    """Prompts that end in the video/audio block; the last AV token of each row is dropped."""
    model, inputs = tiny.omni(end_with_av=True)
    adapted = adapt(model, **inputs)
    scores = scores_for(adapted, 3)
    scores[:, -3:] = -10.0  # the last AV tokens (before the two end markers) go
    keep = adapted.modality == TEXT
    keep[:, -4:-2] = False
    pruned = adapted.prune(scores=scores, retention=0.5)
    assert not pruned.keep[:, 0, -3].any()
    # the first generated token follows the last original token on each axis
    last = adapted.position_ids[:, :, -1]
    assert torch.equal(pruned.next_position, last + 1)
    for beams in (1, 3):
        ref = reference_generate(model, adapted, pruned.keep[:, 0], num_beams=beams)
        assert torch.equal(generate(model, pruned, max_new_tokens=STEPS, do_sample=False,
                                    num_beams=beams), ref)


@pytest.mark.parametrize("name", ["qwen2_5_omni", "qwen2_5_vl", "gemma3n_full_attention"])
def test_varlen_prefill_carries_native_positions_and_per_token_inputs(name):
    if name.startswith("gemma3n"):
        if not GEMMA3N_SUPPORTED:
            pytest.skip("Gemma 3n is refused on this transformers version (tested above)")
        model, inputs = tiny.gemma3n(layer_types=["full_attention", "full_attention"])
    else:
        model, inputs = tiny.BUILDERS[name]()
    adapted = adapt(model, **inputs)
    pruned = adapted.prune(scores=scores_for(adapted, 4), retention=0.4)
    ref = reference_generate(model, adapted, pruned.keep[:, 0], num_beams=3)
    ours = generate(model, pruned, attention="varlen", max_new_tokens=STEPS, do_sample=False,
                    num_beams=3)
    assert torch.equal(ours, ref)


def test_sliding_window_is_exact_where_it_cannot_bind_and_refused_where_it_could():
    if not GEMMA3N_SUPPORTED:
        pytest.skip("Gemma 3n is refused on this transformers version (tested above)")
    longest = 22  # row 0 of the Gemma 3n batch
    model, inputs = tiny.gemma3n(sliding_window=longest + STEPS - 1)  # just reaches: exact
    adapted = adapt(model, **inputs)
    assert int(adapted.attention_mask.sum(1).max()) == longest
    pruned = adapted.prune(scores=scores_for(adapted, 5), retention=0.4)
    ref = reference_generate(model, adapted, pruned.keep[:, 0])
    assert torch.equal(generate(model, pruned, max_new_tokens=STEPS, do_sample=False), ref)
    with pytest.raises(ValueError, match="does not support sliding-window"):
        generate(model, pruned, attention="varlen", max_new_tokens=STEPS)
    with pytest.raises(ValueError, match=rf"sliding_window={longest + STEPS - 1} .* a prompt "
                                         rf"of {longest} tokens \+ max_new_tokens={STEPS + 1}"):
        generate(model, pruned, max_new_tokens=STEPS + 1)


def test_a_binding_window_would_be_silently_wrong_without_the_refusal(monkeypatch):
    if not GEMMA3N_SUPPORTED:
        pytest.skip("Gemma 3n is refused on this transformers version (tested above)")
    model, inputs = tiny.gemma3n(sliding_window=16)
    adapted = adapt(model, **inputs)
    pruned = adapted.prune(scores=scores_for(adapted, 5), retention=0.4)
    ref = reference_generate(model, adapted, pruned.keep[:, 0])
    monkeypatch.setattr(generation, "_check_window_cannot_bind", lambda *args: None)
    assert not torch.equal(generate(model, pruned, max_new_tokens=STEPS, do_sample=False), ref)
    # the same for one forward: pruning.forward refuses it, a raw forward is off
    with pytest.raises(ValueError, match="sliding_window=16 .* a prompt of 22 tokens"):
        pruning.forward(model, pruned)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(pruned_logits(model, pruned),
                                   reference_logits(model, adapted, pruned.keep[:, 0]),
                                   rtol=0, atol=1e-2)


def test_qwen2_with_use_sliding_window_is_exact_or_refused():
    """Text-only Qwen2 with sliding windows on every layer, through prune_inputs directly."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=tiny.TEXT_VOCAB, use_sliding_window=True, sliding_window=20,
        max_window_layers=0, pad_token_id=0, **tiny.TEXT)).eval()
    assert pruning.sliding_window(model) == 20
    gen = torch.Generator().manual_seed(6)
    modality = torch.tensor([[TEXT] * 3 + [VISUAL] * 8 + [AUDIO] * 4 + [TEXT] * 3,
                             [PAD] * 4 + [TEXT] * 2 + [VISUAL] * 6 + [AUDIO] * 3 + [TEXT] * 3])
    embeds = torch.randn(2, 18, tiny.TEXT["hidden_size"], generator=gen)
    pruned = pruning.prune_inputs(embeds, modality, scores=torch.randn(2, 18, generator=gen),
                                  retention=0.4)
    mask = (pruned.keep[:, 0] & (modality != PAD)).long()
    positions = ((modality != PAD).cumsum(1) - 1).clamp_min(0)
    with torch.no_grad():
        ref = model.generate(inputs_embeds=embeds, attention_mask=mask, position_ids=positions,
                             max_new_tokens=3, do_sample=False)
    assert torch.equal(generate(model, pruned, max_new_tokens=3, do_sample=False), ref)
    with pytest.raises(ValueError, match="sliding_window=20 .* a prompt of 18 tokens"):
        generate(model, pruned, max_new_tokens=4)


class _FullOmniConfig:
    """A stand-in for the full Qwen2.5-Omni's config (thinker + talker): only its type and
    text config are read before the refusal."""
    model_type = "qwen2_5_omni"

    def get_text_config(self):
        return type("TextConfig", (), {"hidden_size": 32})()


class _Thinker(torch.nn.Module):
    config = type("ThinkerConfig", (), {"model_type": "qwen2_5_omni_thinker"})()


class _FullOmni(torch.nn.Module):
    config = _FullOmniConfig()

    def __init__(self):
        super().__init__()
        self.thinker = _Thinker()


def test_the_full_omni_model_is_refused_with_what_to_pass():
    with pytest.raises(ValueError, match=r"model \(_FullOmni, model_type 'qwen2_5_omni'\) wraps "
                       r"the part pruning serves; pass model\.thinker \(qwen2_5_omni_thinker\)"):
        adapt(_FullOmni())


def test_a_thinker_policy_given_the_full_omni_model_says_to_pass_the_thinker():
    from avex.policy import TrainedOn
    thinker = TrainedOn("qwen2_5_omni_thinker", 32, "interleaved", (0.1, 0.5))
    with pytest.raises(ValueError, match=r"model type 'qwen2_5_omni', the policy was trained "
                       r"with 'qwen2_5_omni_thinker' \(pass model\.thinker, the "
                       r"'qwen2_5_omni_thinker' inside it\)"):
        thinker.check_model(_FullOmni())
    # a policy of another family gets no such hint: the thinker would not fit it either
    other = TrainedOn("qwen2_5_vl", 32, "interleaved", (0.1, 0.5))
    with pytest.raises(ValueError, match=r"trained with 'qwen2_5_vl'$"):
        other.check_model(_FullOmni())
