"""prune_inputs / generate on tiny random-weight Qwen2 and Llama models: the pruned, compacted
sequence (original positions) must behave exactly like the full sequence with the dropped
tokens masked out of attention, for prefill logits, greedy decoding and beam search, with
ragged batches and left or right padding."""
import importlib.util
import inspect
import sys
import warnings

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from avex import pruning
from avex.pruning import generation
from avex.pruning import inputs as pruning_inputs
from avex.kernels.exchange import build_exchanges
from avex.pruning import (AUDIO, PAD, TEXT, VISUAL, PrunedInputs, expand_av_keep, generate,
                          num_kept, prune_inputs)
from conftest import DEVICE, layout_atol, requires_cuda

HIDDEN, VOCAB = 32, 61


def tiny_model(kind):
    common = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=256, initializer_range=0.2,
                  attn_implementation="sdpa", pad_token_id=0, eos_token_id=None)
    torch.manual_seed(0)
    if kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        model = LlamaForCausalLM(LlamaConfig(**common))
    return model.to(DEVICE).eval()


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model(request):
    return tiny_model(request.param)


@pytest.fixture(scope="module")
def qwen2():
    return tiny_model("qwen2")


def make_batch(seed=0, ends_with_av=False):
    """Three samples with different numbers of AV tokens: left-padded, right-padded, unpadded.
    Text before and after the AV block, as in a chat prompt (unless ``ends_with_av``)."""
    gen = torch.Generator().manual_seed(seed)
    rows = [[PAD] * 4 + [TEXT] * 3 + [9] * 10 + [TEXT] * 5,
            [TEXT] * 2 + [9] * 13 + [TEXT] * 4 + [PAD] * 3,
            [TEXT] * 4 + [9] * 6 + [TEXT] * 12]
    if ends_with_av:
        rows[1] = [TEXT] * 3 + [9] * 16 + [PAD] * 3   # the prompt ends with AV tokens
        rows[2] = [TEXT] * 4 + [9] * 18
    modality = torch.tensor(rows)
    av = modality == 9
    modality[av] = torch.randint(VISUAL, AUDIO + 1, (int(av.sum()),), generator=gen)
    embeds = torch.randn(*modality.shape, HIDDEN, generator=gen)
    scores = torch.randn(modality.shape, generator=gen)
    return embeds.to(DEVICE), modality.to(DEVICE), scores.to(DEVICE)


def original_positions(modality):
    return ((modality != PAD).long().cumsum(1) - 1).clamp_min(0)


def masked_full(embeds, modality, keep):
    """The reference input: the full sequence, dropped tokens masked out of attention,
    original positions, re-laid with the padding on the left (HF's layout for generation)."""
    present = modality != PAD
    order = torch.sort(present.int(), dim=1, stable=True).indices  # padding first, order kept
    take = lambda t: t.gather(1, order)  # noqa: E731
    mask = take(keep & present).long()
    return (embeds.gather(1, order[..., None].expand_as(embeds)), mask,
            take(original_positions(modality)))


@torch.no_grad()
def greedy_reference(model, embeds, modality, keep, steps):
    """No cache, one sample at a time: each step reruns the full masked sequence plus the
    tokens generated so far, which sit at positions (number of original tokens) + t."""
    out = []
    for b in range(embeds.shape[0]):
        present = modality[b] != PAD
        seq, mask = embeds[b][present], keep[b][present].long()
        pos = torch.arange(seq.shape[0], device=seq.device)
        last = int(torch.nonzero(mask).max())  # the prediction comes from the last kept token
        tokens = []
        for _ in range(steps):
            logits = model(inputs_embeds=seq[None], attention_mask=mask[None],
                           position_ids=pos[None]).logits[0, last]
            token = int(logits.argmax())
            tokens.append(token)
            emb = model.get_input_embeddings()(torch.tensor([token], device=seq.device))
            seq = torch.cat([seq, emb])
            mask = torch.cat([mask, mask.new_ones(1)])
            pos = torch.cat([pos, pos[-1:] + 1])
            last = seq.shape[0] - 1
        out.append(tokens)
    return torch.tensor(out)


def test_logits_at_kept_positions_match_the_masked_full_sequence(model):
    embeds, modality, scores = make_batch(1)
    pruned = prune_inputs(embeds, modality, scores=scores, retention=0.4)
    keep = pruned.keep[:, 0]
    full, mask, positions = masked_full(embeds, modality, keep)
    with torch.no_grad():
        ref = model(inputs_embeds=full, attention_mask=mask, position_ids=positions).logits
        got = model(inputs_embeds=pruned.inputs_embeds, attention_mask=pruned.attention_mask,
                    position_ids=pruned.position_ids).logits
    ref_kept = ref[mask.bool()]
    got_kept = got[pruned.attention_mask.bool()]
    assert got_kept.shape == ref_kept.shape
    torch.testing.assert_close(got_kept, ref_kept, rtol=0, atol=layout_atol())
    # the compacted batch is shorter, and every row's positions keep their gaps
    assert pruned.inputs_embeds.shape[1] < embeds.shape[1]
    assert torch.equal(pruned.position_ids[pruned.attention_mask.bool()], positions[mask.bool()])


def test_several_keep_sets_per_sample_match_their_masked_references(qwen2):
    embeds, modality, scores = make_batch(2)
    gen = torch.Generator().manual_seed(3)
    keep = (torch.rand(3, 4, modality.shape[1], generator=gen) < 0.5).to(DEVICE)
    keep |= (modality == TEXT)[:, None]
    pruned = prune_inputs(embeds, modality, keep=keep)
    assert pruned.inputs_embeds.shape[0] == 12 and pruned.num_sets == 4
    with torch.no_grad():
        got = qwen2(inputs_embeds=pruned.inputs_embeds, attention_mask=pruned.attention_mask,
                    position_ids=pruned.position_ids).logits
        for s in range(4):
            full, mask, positions = masked_full(embeds, modality, keep[:, s])
            ref = qwen2(inputs_embeds=full, attention_mask=mask, position_ids=positions).logits
            rows = torch.arange(3, device=DEVICE) * 4 + s
            torch.testing.assert_close(got[rows][pruned.attention_mask[rows].bool()],
                                       ref[mask.bool()], rtol=0, atol=layout_atol())


@pytest.mark.parametrize("attention", ["padded", "varlen"])
def test_greedy_generate_matches_the_masked_full_sequence(model, attention):
    embeds, modality, scores = make_batch(4)
    pruned = prune_inputs(embeds, modality, scores=scores, retention=0.3)
    tokens = generate(model, pruned, attention=attention, max_new_tokens=6, do_sample=False)
    full, mask, positions = masked_full(embeds, modality, pruned.keep[:, 0])
    hf = model.generate(inputs_embeds=full, attention_mask=mask, position_ids=positions,
                        max_new_tokens=6, do_sample=False)
    assert torch.equal(tokens, hf)
    assert torch.equal(tokens.cpu(), greedy_reference(model, embeds, modality,
                                                      pruned.keep[:, 0], 6))


@pytest.mark.parametrize("attention", ["padded", "varlen"])
def test_beam_search_matches_the_masked_full_sequence(qwen2, attention):
    embeds, modality, scores = make_batch(5)
    pruned = prune_inputs(embeds, modality, scores=scores, retention=0.5)
    kwargs = dict(max_new_tokens=5, num_beams=3, num_return_sequences=2, do_sample=False)
    tokens = generate(qwen2, pruned, attention=attention, **kwargs)
    full, mask, positions = masked_full(embeds, modality, pruned.keep[:, 0])
    hf = qwen2.generate(inputs_embeds=full, attention_mask=mask, position_ids=positions, **kwargs)
    assert tokens.shape == (6, 5) and torch.equal(tokens, hf)


@pytest.mark.parametrize("attention", ["padded", "varlen"])
def test_decoding_continues_after_a_dropped_final_token(qwen2, attention):
    embeds, modality, scores = make_batch(6, ends_with_av=True)
    scores[:, -1] = -10.0  # the last AV token of row 2 (and of row 1's AV block) is dropped
    scores[1, -4] = -10.0
    pruned = prune_inputs(embeds, modality, scores=scores, retention=0.5)
    assert (pruned.next_position > pruned.position_ids[:, -1] + 1).sum() == 2
    tokens = generate(qwen2, pruned, attention=attention, max_new_tokens=5, do_sample=False)
    assert torch.equal(tokens.cpu(), greedy_reference(qwen2, embeds, modality,
                                                      pruned.keep[:, 0], 5))
    assert not qwen2._forward_pre_hooks  # the position hook is gone


def test_contiguous_positions_renumber_the_kept_tokens(qwen2):
    embeds, modality, scores = make_batch(7)
    pruned = prune_inputs(embeds, modality, scores=scores, retention=0.5, positions="contiguous")
    mask = pruned.attention_mask.bool()
    n = mask.sum(1)
    assert torch.equal(pruned.next_position, n)
    for r in range(3):
        assert pruned.position_ids[r][mask[r]].tolist() == list(range(int(n[r])))
    # HF's own position rule (mask cumsum) is the contiguous one
    tokens = generate(qwen2, pruned, max_new_tokens=4, do_sample=False)
    hf = qwen2.generate(inputs_embeds=pruned.inputs_embeds, attention_mask=pruned.attention_mask,
                        max_new_tokens=4, do_sample=False)
    assert torch.equal(tokens, hf)


def test_top_k_keeps_round_rho_n_highest_av_tokens_and_all_text():
    embeds, modality, scores = make_batch(8)
    scores[0, 7:10] = 5.0  # ties: the lower positions win
    pruned = prune_inputs(embeds, modality, scores=scores, retention=0.25)
    keep = pruned.keep[:, 0]
    is_av = (modality == VISUAL) | (modality == AUDIO)
    n_av = is_av.sum(1)
    assert (keep & is_av).sum(1).tolist() == [3, 3, 2]      # round(0.25 * [10, 13, 6])
    assert torch.equal(keep & (modality == TEXT), modality == TEXT)
    assert not (keep & (modality == PAD)).any()
    for b in range(3):
        kept_scores = scores[b][keep[b] & is_av[b]]
        dropped = scores[b][~keep[b] & is_av[b]]
        assert kept_scores.min() >= dropped.max()
    assert keep[0, 7:10].tolist() == [True, True, True]
    assert num_kept(0.25, n_av).tolist() == [3, 3, 2]
    assert num_kept(0.01, torch.tensor([0, 5, 50])).tolist() == [0, 1, 1]
    everything = prune_inputs(embeds, modality, scores=scores, retention=1.0)
    assert torch.equal(everything.keep[:, 0], modality != PAD)
    text_only = modality.clone()
    text_only[2][is_av[2]] = TEXT  # a sample with no AV tokens keeps its text, nothing else
    pruned = prune_inputs(embeds, text_only, scores=scores, retention=0.25)
    assert torch.equal(pruned.keep[2, 0], text_only[2] != PAD)


def test_top_k_ranks_the_av_axis_not_the_whole_sequence(monkeypatch):
    """A long prompt must not widen the rows Top-K ranks: gumbel_topk sees [B, M] (M = the most
    AV tokens of a row), and the keep-set is the brute-force Top-K over AV positions."""
    embeds, modality, scores = make_batch(14)
    long_text = torch.full((3, 500), TEXT, device=DEVICE)
    modality = torch.cat([long_text, modality], 1)
    embeds = torch.cat([torch.randn(3, 500, HIDDEN, device=DEVICE), embeds], 1)
    scores = torch.cat([torch.randn(3, 500, device=DEVICE), scores], 1)
    scores[0, 507:510] = 5.0  # ties: the lower positions win
    widths = []
    ranked = pruning_inputs.gumbel_topk

    def spy(av_scores, *args, **kwargs):
        widths.append(av_scores.shape[1])
        return ranked(av_scores, *args, **kwargs)
    monkeypatch.setattr(pruning_inputs, "gumbel_topk", spy)
    keep = prune_inputs(embeds, modality, scores=scores, retention=0.4).keep[:, 0]
    is_av = (modality == VISUAL) | (modality == AUDIO)
    assert widths == [int(is_av.sum(1).max())]
    for b in range(3):
        positions = torch.nonzero(is_av[b]).flatten()
        k = int(num_kept(0.4, is_av[b].sum()))
        order = torch.sort(-scores[b, positions].double(), stable=True).indices[:k]
        want = torch.zeros_like(is_av[b])
        want[positions[order]] = True
        assert torch.equal(keep[b] & is_av[b], want)


def test_exchange_sets_feed_prune_inputs_through_expand_av_keep():
    embeds, modality, scores = make_batch(9)
    is_av = (modality == VISUAL) | (modality == AUDIO)
    # AV-only view: the j-th AV token of each row, padded with -1 / -inf
    width = int(is_av.sum(1).max())
    av_rank = is_av.long().cumsum(1) - 1
    av_mod = torch.full((3, width), -1, dtype=torch.long, device=DEVICE)
    av_scores = torch.full((3, width), float("-inf"), device=DEVICE)
    rows, cols = torch.nonzero(is_av, as_tuple=True)
    av_mod[rows, av_rank[rows, cols]] = modality[rows, cols]
    av_scores[rows, av_rank[rows, cols]] = scores[rows, cols]
    from avex.kernels.gumbel_topk import gumbel_topk
    indices, _ = gumbel_topk(av_scores, num_kept(0.5, is_av.sum(1)), sample=False)
    exchanges = build_exchanges(av_scores, indices, av_mod, g=2)
    keep = expand_av_keep(exchanges.sets(), modality)        # [B, 5, L]
    assert keep.shape == (3, 5, modality.shape[1])
    is_text = (modality == TEXT)[:, None]
    assert torch.equal((keep & ~is_text).sum(-1), exchanges.sets().sum(-1))
    assert keep[is_text.expand_as(keep)].all()  # text is always kept
    pruned = prune_inputs(embeds, modality, keep=keep)
    assert pruned.inputs_embeds.shape[0] == 15
    # the anchor rows keep the same tokens as Top-K through scores
    direct = prune_inputs(embeds, modality, scores=scores, retention=0.5)
    assert torch.equal(pruned.inputs_embeds[::5], direct.inputs_embeds)
    assert torch.equal(expand_av_keep(exchanges.anchor, modality), direct.keep[:, 0])
    with pytest.raises(ValueError, match="av_keep has 3 columns but a row of modality has 13"):
        expand_av_keep(exchanges.anchor[:, :3], modality)


def test_gradients_reach_inputs_embeds():
    embeds, modality, scores = make_batch(10)
    embeds = embeds.double().requires_grad_()
    pruned = prune_inputs(embeds, modality, scores=scores, retention=0.5)
    pruned.inputs_embeds.sum().backward()
    kept = pruned.keep[:, 0]
    assert torch.equal(embeds.grad[kept], torch.ones_like(embeds.grad[kept]))
    assert not embeds.grad[~kept].any()
    f = lambda e: prune_inputs(e, modality, keep=kept).inputs_embeds  # noqa: E731
    assert torch.autograd.gradcheck(f, (embeds[:, :, :2].detach().requires_grad_(),))


@pytest.mark.parametrize("kernel", ["reference", "torch varlen_attn"])
def test_auto_uses_the_padded_path_without_flash_attn(qwen2, monkeypatch, kernel):
    """Without flash-attn, "auto" prefills padded, also where PyTorch's varlen_attn would serve
    (CUDA in bf16, pretended here): that packed path was slower than padded on an H100."""
    embeds, modality, scores = make_batch(11)
    pruned = prune_inputs(embeds, modality, scores=scores, retention=0.5)
    monkeypatch.setattr(generation, "_flash_attn_installed", lambda: False)
    if kernel == "torch varlen_attn":
        monkeypatch.setattr(generation, "packed_attention",
                            lambda *_: generation.VARLEN_TORCH_ATTENTION)

    def refuse(*args, **kwargs):
        raise AssertionError("the varlen path ran without flash-attn")
    monkeypatch.setattr(generation, "_varlen_prefill", refuse)
    generate(qwen2, pruned, max_new_tokens=2)



def test_auto_uses_the_packed_path_with_flash_attn(qwen2, monkeypatch):
    embeds, modality, scores = make_batch(11)
    pruned = prune_inputs(embeds, modality, scores=scores, retention=0.5)
    monkeypatch.setattr(generation, "packed_attention", lambda *_: "flash_attention_2")

    class Packed(Exception):
        pass

    def packed(*args, **kwargs):
        raise Packed
    monkeypatch.setattr(generation, "_varlen_prefill", packed)
    with pytest.raises(Packed):
        generate(qwen2, pruned, max_new_tokens=2)

def test_flash_attn_is_imported_only_when_installed(qwen2):
    installed = importlib.util.find_spec("flash_attn") is not None
    assert generation._flash_attn_installed() == installed
    embeds, modality, scores = make_batch(11)
    pruned = prune_inputs(embeds, modality, scores=scores, retention=0.5)
    for attention in ("auto", "varlen"):
        generate(qwen2, pruned, attention=attention, max_new_tokens=2)
    if not installed:  # here: flash-attn is absent, and nothing tried to import it
        assert "flash_attn" not in sys.modules


def fake_varlen_attn(causal_flag: str, with_scale: bool = True):
    """A stand-in for torch.nn.attention.varlen.varlen_attn on a CPU (the real one runs on CUDA
    only): it checks the documented contract (q/k/v [total, H, d], int32 cu_seqlens with a
    leading 0, the longest sequence, causality asked for) and attends within each sequence."""
    def attend(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=None,
               window_size=(-1, -1), is_causal=False):
        assert query.dim() == 3 and key.shape == value.shape and key.shape[1] == query.shape[1]
        assert cu_seq_q.dtype == torch.int32 and int(cu_seq_q[0]) == 0
        assert int(cu_seq_q[-1]) == query.shape[0] and torch.equal(cu_seq_q, cu_seq_k)
        assert max_q == max_k == int(cu_seq_q.diff().max())
        assert (window_size == (-1, 0)) if causal_flag == "window_size" else is_causal
        out = torch.empty_like(query)
        bounds = cu_seq_q.tolist()
        for start, end in zip(bounds[:-1], bounds[1:]):
            out[start:end] = torch.nn.functional.scaled_dot_product_attention(
                query[start:end].transpose(0, 1), key[start:end].transpose(0, 1),
                value[start:end].transpose(0, 1), is_causal=True, scale=scale).transpose(0, 1)
        return out

    if causal_flag == "window_size" and with_scale:
        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None,
                        window_size=(-1, -1)):
            return attend(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=scale,
                          window_size=window_size)
    elif causal_flag == "window_size":
        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *,
                        window_size=(-1, -1)):
            return attend(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k,
                          window_size=window_size)
    else:
        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *,
                        is_causal=False, scale=None):
            return attend(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=scale,
                          is_causal=is_causal)
    return varlen_attn


@pytest.mark.parametrize("causal_flag,with_scale", [("window_size", True),
                                                    ("window_size", False),
                                                    ("is_causal", True)])
def test_torch_varlen_attention_matches_the_per_sequence_reference(monkeypatch, causal_flag,
                                                                    with_scale):
    """The adapter to torch's varlen_attn (the signatures of torch 2.10+ and of earlier
    releases, with and without a scale argument) against the SDPA reference, GQA included."""
    monkeypatch.setattr(generation, "_torch_varlen_attn",
                        lambda: fake_varlen_attn(causal_flag, with_scale))
    gen = torch.Generator().manual_seed(13)
    lengths = [5, 1, 9, 3]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    query = torch.randn(1, 4, sum(lengths), 8, generator=gen)
    key, value = torch.randn(2, 1, 2, sum(lengths), 8, generator=gen)
    kwargs = dict(scaling=0.3, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=9,
                  max_length_k=9)
    got, _ = generation._torch_varlen_attention(None, query, key, value, None, **kwargs)
    want, _ = generation._varlen_reference_attention(None, query, key, value, None, **kwargs)
    assert got.shape == (1, sum(lengths), 4, 8)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_packed_attention_dispatch(monkeypatch):
    """flash-attn when installed, else torch's varlen_attn, for CUDA fp16/bf16; the SDPA
    reference everywhere else (a CPU, float32, or a torch without varlen_attn)."""
    cuda = torch.device("cuda")
    monkeypatch.setattr(generation, "_torch_varlen_attn", lambda: fake_varlen_attn("window_size"))
    monkeypatch.setattr(generation, "_flash_attn_installed", lambda: True)
    assert generation.packed_attention(cuda, torch.bfloat16) == "flash_attention_2"
    monkeypatch.setattr(generation, "_flash_attn_installed", lambda: False)
    assert generation.packed_attention(cuda, torch.bfloat16) == generation.VARLEN_TORCH_ATTENTION
    assert generation.packed_attention(cuda, torch.float16) == generation.VARLEN_TORCH_ATTENTION
    for device, dtype in ((cuda, torch.float32), (torch.device("cpu"), torch.bfloat16)):
        assert generation.packed_attention(device, dtype) == generation.VARLEN_REFERENCE_ATTENTION
    monkeypatch.setattr(generation, "_torch_varlen_attn", lambda: None)
    assert generation.packed_attention(cuda, torch.bfloat16) == generation.VARLEN_REFERENCE_ATTENTION


def test_this_torch_has_varlen_attn_with_a_causal_option():
    """torch 2.13 here (and 2.11 on the GPU image) ship varlen_attn; the adapter finds a way
    to ask it for causal attention."""
    varlen_attn = generation._torch_varlen_attn()
    if varlen_attn is None:
        pytest.skip(f"torch {torch.__version__} has no torch.nn.attention.varlen")
    params = inspect.signature(varlen_attn).parameters
    assert "window_size" in params or "is_causal" in params


def test_greedy_generate_through_torch_varlen_matches_the_masked_full_sequence(qwen2,
                                                                                monkeypatch):
    monkeypatch.setattr(generation, "_torch_varlen_attn", lambda: fake_varlen_attn("window_size"))
    torch_varlen = generation._register_attention(generation.VARLEN_TORCH_ATTENTION,
                                               generation._torch_varlen_attention)
    monkeypatch.setattr(generation, "packed_attention", lambda device, dtype: torch_varlen)
    embeds, modality, scores = make_batch(4)
    pruned = prune_inputs(embeds, modality, scores=scores, retention=0.3)
    tokens = generate(qwen2, pruned, attention="varlen", max_new_tokens=6, do_sample=False)
    assert torch.equal(tokens.cpu(), greedy_reference(qwen2, embeds, modality,
                                                      pruned.keep[:, 0], 6))


def test_varlen_generate_names_the_cache_as_this_transformers_does(qwen2):
    # transformers 5.24 renames past_key_values to cache: the old name warns there and goes
    # later, while 5.17 (the GPU image) knows only the old one
    assert generation.cache_keyword(qwen2) in inspect.signature(qwen2.forward).parameters
    embeds, modality, scores = make_batch(4)
    pruned = prune_inputs(embeds, modality, scores=scores, retention=0.3)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*past_key_values.*deprecated",
                                category=FutureWarning)
        tokens = generate(qwen2, pruned, attention="varlen", max_new_tokens=3, do_sample=False)
    assert tokens.shape == (embeds.shape[0], 3)


@requires_cuda
def test_torch_varlen_prefill_matches_padded_sdpa_on_cuda():
    """The real varlen_attn (bf16, CUDA) against the padded SDPA prefill: the same next-token
    logits within bf16 rounding (both accumulate in float32; the kernels differ)."""
    if generation._torch_varlen_attn() is None:
        pytest.skip(f"torch {torch.__version__} has no varlen_attn")
    model = tiny_model("qwen2").to(torch.bfloat16)
    embeds, modality, scores = make_batch(4)
    pruned = prune_inputs(embeds.to(torch.bfloat16), modality, scores=scores, retention=0.5)
    cache = generation._varlen_prefill(model, pruned, 1)
    with torch.no_grad():
        padded = model(inputs_embeds=pruned.inputs_embeds[:, :-1],
                       attention_mask=pruned.attention_mask[:, :-1],
                       position_ids=pruned.position_ids[:, :-1], use_cache=True)
    mask = pruned.attention_mask[:, :-1].bool()
    for layer, ref in zip(cache.layers, padded.past_key_values.layers):
        torch.testing.assert_close(layer.keys.transpose(1, 2)[mask].float(),
                                   ref.keys.transpose(1, 2)[mask].float(),
                                   rtol=1.6e-2, atol=layout_atol(torch.bfloat16))


def _bad(change):
    embeds, modality, scores = make_batch(12)
    args = {"embeds": embeds, "modality": modality, "scores": scores, "keep": None,
            "retention": 0.5, "positions": "original"}
    change(args)
    return args


@pytest.mark.parametrize("change,error,match", [
    (lambda a: a.update(modality=a["modality"][:, 1:]), ValueError, "modality must have shape"),
    (lambda a: a.update(scores=a["scores"][:, 1:]), ValueError, "scores must have shape"),
    (lambda a: a.update(embeds=a["embeds"][0]), ValueError, "inputs_embeds must be 3-D"),
    (lambda a: a["modality"].__setitem__((0, 5), 3), ValueError, "modality must hold .* got 3"),
    (lambda a: a["modality"].__setitem__((0, 5), -2), ValueError, "got -2"),
    (lambda a: a.update(modality=a["modality"].float()), TypeError, "modality must be an int"),
    (lambda a: a.update(retention=0.0), ValueError, r"retention must be in \(0, 1\], got 0.0"),
    (lambda a: a.update(retention=1.5), ValueError, r"retention must be in \(0, 1\], got 1.5"),
    (lambda a: a.update(retention=None), ValueError, "retention is required"),
    (lambda a: a.update(scores=None), ValueError, "scores is required"),
    (lambda a: a["scores"].__setitem__((1, 5), float("nan")), ValueError, "NaN"),
    (lambda a: a.update(keep=a["modality"] != PAD), ValueError, "either keep"),
    (lambda a: a.update(keep=a["modality"] == VISUAL, scores=None, retention=None), ValueError,
     "keep drops text token"),
    (lambda a: a.update(keep=(a["modality"] != PAD).long(), scores=None, retention=None),
     TypeError, "keep must be a bool"),
    (lambda a: a.update(keep=(a["modality"] != PAD)[:, 1:], scores=None, retention=None),
     ValueError, "keep must have shape"),
    (lambda a: a.update(positions="shifted"), ValueError, "positions must be one of"),
    (lambda a: a.update(scores=a["scores"].to("meta")), ValueError, "scores is a meta tensor"),
])
def test_prune_inputs_rejects_bad_input(change, error, match):
    a = _bad(change)
    with pytest.raises(error, match=match):
        prune_inputs(a["embeds"], a["modality"], scores=a["scores"], keep=a["keep"],
                     retention=a["retention"], positions=a["positions"])


def test_generate_rejects_bad_input(qwen2):
    embeds, modality, scores = make_batch(13)
    pruned = prune_inputs(embeds, modality, scores=scores, retention=0.5)
    with pytest.raises(TypeError, match="pruned must be the PrunedInputs"):
        generate(qwen2, pruned._asdict())
    with pytest.raises(ValueError, match="generate takes position_ids from pruned"):
        generate(qwen2, pruned, position_ids=pruned.position_ids)
    for cache_name in ("past_key_values", "cache"):   # the KV cache's name before and after 5.24
        with pytest.raises(ValueError, match=f"generate takes {cache_name} from pruned"):
            generate(qwen2, pruned, **{cache_name: None})
    with pytest.raises(ValueError, match="attention must be one of"):
        generate(qwen2, pruned, attention="flash")
    with pytest.raises(ValueError, match="needs use_cache=True"):
        generate(qwen2, pruned, attention="varlen", use_cache=False)
    no_text = modality.clone()
    no_text[0][no_text[0] == TEXT] = VISUAL  # sample 0: AV tokens and padding only
    with pytest.raises(ValueError, match="modality row 0 has no text token"):
        prune_inputs(embeds, no_text, keep=no_text == TEXT)
    empty = pruned._replace(attention_mask=pruned.attention_mask * torch.tensor(
        [0, 1, 1], device=DEVICE)[:, None])
    with pytest.raises(ValueError, match="pruned row 0 keeps no tokens"):
        generate(qwen2, empty)
    assert isinstance(pruned, PrunedInputs)


# --- per item: K = round(rho N) of each image / video, each scored alone with its row's text ---

def _two_items():
    from avex.policy import AVEXPolicy, PolicyConfig, TrainedOn

    T_, V_, A_, P_ = TEXT, VISUAL, AUDIO, PAD
    modality = torch.tensor([[P_, T_, V_, V_, V_, V_, V_, T_, T_, V_, V_, V_, T_],
                             [T_, V_, V_, V_, T_, A_, A_, A_, A_, A_, A_, A_, T_]])
    torch.manual_seed(3)
    embeds = torch.randn(2, 13, 16)
    policy = AVEXPolicy(PolicyConfig(input_size=16, hidden_size=16, num_heads=2)).eval()
    policy.trained_on = TrainedOn("qwen2", 16, "visual-then-audio", (0.1, 1.0))
    return embeds, modality, policy


def test_item_index_numbers_runs_of_one_modality():
    _, modality, _ = _two_items()
    assert pruning.item_index(modality).tolist() == [
        [-1, -1, 0, 0, 0, 0, 0, -1, -1, 1, 1, 1, -1],
        [-1, 0, 0, 0, -1, 1, 1, 1, 1, 1, 1, 1, -1]]


@pytest.mark.parametrize("retention", [0.1, 0.4, 1.0])
def test_per_item_scores_each_item_alone_with_the_text(retention):
    embeds, modality, policy = _two_items()
    keep = prune_inputs(embeds, modality, policy=policy, retention=retention,
                        per_item=True).keep[:, 0]
    items = pruning.item_index(modality)
    for row in range(2):
        for item in range(int(items[row].max()) + 1):
            alone = modality[row:row + 1].clone()
            alone[(items[row:row + 1] != item) & (items[row:row + 1] >= 0)] = PAD
            expected = prune_inputs(embeds[row:row + 1], alone, policy=policy,
                                    retention=retention).keep[0, 0]
            own = items[row] == item
            assert torch.equal(keep[row][own], expected[own])
            assert int(keep[row][own].sum()) == int(pruning.num_kept(retention, int(own.sum())))


def test_per_item_with_one_item_per_row_is_the_row_selection():
    embeds, modality, policy = _two_items()
    modality[0, 9:12] = TEXT
    modality[1, 5:12] = TEXT
    scores = torch.randn(2, 13)
    for kwargs in (dict(policy=policy), dict(scores=scores)):
        rows = prune_inputs(embeds, modality, retention=0.4, **kwargs).keep
        items = prune_inputs(embeds, modality, retention=0.4, per_item=True, **kwargs).keep
        assert torch.equal(rows, items)


def test_per_item_refusals():
    embeds, modality, policy = _two_items()
    with pytest.raises(ValueError, match="per_item applies to scores or policy with retention"):
        prune_inputs(embeds, modality, keep=modality == TEXT, per_item=True)
    with pytest.raises(TypeError, match="per_item must be"):
        prune_inputs(embeds, modality, policy=policy, retention=0.4, per_item="yes")


# --- one retention per row -------------------------------------------------------------------

def _same_as_rows_alone(batch, embeds, modality, retention, **kwargs):
    """Each row of the batch call keeps what a call on that row alone, at that row's retention
    (a Python float), keeps: the keep-set, the compacted embeddings and the positions."""
    for b, rho in enumerate(retention.tolist()):
        alone = prune_inputs(embeds[b:b + 1], modality[b:b + 1], retention=rho,
                             **{k: (v[b:b + 1] if isinstance(v, torch.Tensor) else v)
                                for k, v in kwargs.items()})
        assert torch.equal(batch.keep[b], alone.keep[0]), (b, rho)
        width = int(alone.attention_mask.sum())
        assert torch.equal(batch.inputs_embeds[b][batch.attention_mask[b].bool()],
                           alone.inputs_embeds[0][-width:])
        assert torch.equal(batch.position_ids[..., b, :][..., batch.attention_mask[b].bool()],
                           alone.position_ids[..., 0, -width:])


@pytest.mark.parametrize("retention", [[0.2, 0.5, 1.0], [0.35, 0.05, 0.7]])
def test_a_retention_per_row_is_each_row_at_its_own_retention(retention):
    embeds, modality, scores = make_batch(5)
    retention = torch.tensor(retention)
    batch = prune_inputs(embeds, modality, scores=scores, retention=retention)
    _same_as_rows_alone(batch, embeds, modality, retention, scores=scores)
    kept = batch.keep[:, 0] & ((modality == VISUAL) | (modality == AUDIO))
    counts = ((modality == VISUAL) | (modality == AUDIO)).sum(1)
    assert kept.sum(1).tolist() == [int(num_kept(r, int(n)))
                                    for r, n in zip(retention.tolist(), counts)]
    assert len(set(kept.sum(1).tolist())) > 1


def test_a_retention_per_row_with_a_policy_per_row_and_per_item():
    embeds, modality, policy = _two_items()
    retention = torch.tensor([0.25, 0.75])
    for per_item in (False, True):
        batch = prune_inputs(embeds, modality, policy=policy, retention=retention,
                             per_item=per_item)
        _same_as_rows_alone(batch, embeds, modality, retention, policy=policy,
                            per_item=per_item)


def test_adapted_inputs_prune_takes_a_retention_per_row():
    from avex.adapters import AdaptedInputs

    embeds, modality, policy = _two_items()
    mask = (modality != PAD).long()
    adapted = AdaptedInputs(embeds, modality, None, {}, mask, torch.zeros_like(mask), "qwen2")
    retention = torch.tensor([0.3, 0.9])
    batch = adapted.prune(policy=policy, retention=retention)
    _same_as_rows_alone(batch, embeds, modality, retention, policy=policy)


@pytest.mark.parametrize("retention,error,match", [
    (torch.tensor([0.5, 0.5]), ValueError, r"retention holds 2 values but inputs_embeds has 3 "
                                           r"rows; pass one per row"),
    (torch.full((3, 1), 0.5), ValueError, r"retention must be a number in \(0, 1\] or a 1-D "
                                          r"tensor \[B\] of them, one per row, got a "
                                          r"torch.float32 tensor of shape \[3, 1\]"),
    (torch.tensor([0.5, 1.5, 0.5]), ValueError, r"retention\[1\] must be in \(0, 1\], got 1.5"),
    (torch.tensor([0.5, float("nan"), 0.5]), ValueError, r"retention\[1\] must be in \(0, 1\]"),
    ([0.5, 0.0, 0.5], ValueError, r"retention\[1\] must be in \(0, 1\], got 0.0"),
])
def test_a_retention_per_row_is_checked(retention, error, match):
    embeds, modality, scores = make_batch(5)
    with pytest.raises(error, match=match):
        prune_inputs(embeds, modality, scores=scores, retention=retention)
