"""prune_inputs with a model's own positions of any rank and extra per-token inputs, and the
modality helper and checks (avex.modality). No model here: tests/test_adapters.py runs the real
families end to end."""
import pytest
import torch

from avex.modality import AUDIO, PAD, TEXT, VISUAL, check_codes, codes_from_ids
from avex.pruning import gather_tokens, prune_inputs

IMAGE, VIDEO, SOUND, START, END = 91, 92, 93, 94, 95


def batch(seed=0):
    """Two rows, the second left-padded; a [3, B, L] position tensor with axes that differ
    inside the AV block (as M-RoPE's do) and a per-token tensor [B, L, 2, 3]."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.tensor([[5, 6, START, IMAGE, IMAGE, IMAGE, IMAGE, SOUND, SOUND, END, 7, 8],
                        [0, 0, 0, 5, START, VIDEO, VIDEO, SOUND, SOUND, SOUND, END, 7]])
    mask = (torch.arange(12)[None] >= torch.tensor([[0], [3]])).long()
    modality = codes_from_ids(ids, mask, visual_ids=(IMAGE, VIDEO), audio_ids=SOUND)
    positions = torch.randint(0, 50, (3, 2, 12), generator=gen)
    embeds = torch.randn(2, 12, 4, generator=gen)
    per_layer = torch.randn(2, 12, 2, 3, generator=gen)
    return ids, mask, modality, positions, embeds, per_layer


def test_codes_from_ids_marks_placeholders_and_keeps_markers_as_text():
    ids, mask, modality, *_ = batch()
    assert modality[0].tolist() == [TEXT, TEXT, TEXT] + [VISUAL] * 4 + [AUDIO] * 2 + [TEXT] * 3
    assert modality[1].tolist() == [PAD] * 3 + [TEXT, TEXT] + [VISUAL] * 2 + [AUDIO] * 3 + \
        [TEXT] * 2
    with pytest.raises(ValueError, match=r"token id\(s\) \[93\] are in both"):
        codes_from_ids(ids, mask, visual_ids=(IMAGE, SOUND), audio_ids=SOUND)
    with pytest.raises(TypeError, match="visual_ids must be token ids"):
        codes_from_ids(ids, mask, visual_ids=("<image>",))
    with pytest.raises(ValueError, match="attention_mask must have the shape of input_ids"):
        codes_from_ids(ids, mask[:, 1:], visual_ids=IMAGE)


def test_check_codes_refuses_codes_that_cannot_be_right():
    ids, mask, modality, *_ = batch()
    check_codes(modality, input_ids=ids, placeholder_ids=(IMAGE, VIDEO, SOUND))
    # Hugging Face's mm_token_type_ids (0 text, 1 image, 2 video) are not modality codes
    mm_token_type_ids = torch.where(ids == IMAGE, 1, torch.where(ids == VIDEO, 2, 0))
    with pytest.raises(ValueError, match="modality row 0 has no text token"):
        check_codes(mm_token_type_ids)
    video_only = torch.where(ids == VIDEO, 2, 0)[1:]
    # its "text" (the video) sits inside, its real text (0: VISUAL) at both ends
    with pytest.raises(ValueError, match="modality row 0 begins and ends with audio-visual"):
        check_codes(video_only)
    with pytest.raises(ValueError, match="modality row 0 begins and ends with audio-visual"):
        check_codes(video_only, input_ids=ids[1:], placeholder_ids=(IMAGE, VIDEO, SOUND))
    # zeros_like(input_ids) with only the audio marked: all the text would be VISUAL
    only_audio = torch.where(ids == SOUND, AUDIO, torch.zeros_like(ids))
    with pytest.raises(ValueError, match="has no text token"):
        prune_inputs(torch.randn(2, 12, 4), only_audio, keep=only_audio == TEXT)
    with pytest.raises(ValueError, match="got 5"):
        check_codes(modality.masked_fill(modality == AUDIO, 5))


def test_positions_of_any_rank_and_per_token_inputs_follow_the_kept_tokens():
    ids, mask, modality, positions, embeds, per_layer = batch()
    gen = torch.Generator().manual_seed(1)
    keep = (torch.rand(2, 3, 12, generator=gen) < 0.5) | (modality == TEXT)[:, None]
    for native in (positions, positions[0], positions[None]):  # [3, B, L], [B, L], [1, 3, B, L]
        pruned = prune_inputs(embeds, modality, keep=keep, position_ids=native,
                              per_token={"per_layer_inputs": per_layer})
        rows = pruned.attention_mask.bool()
        assert pruned.position_ids.shape == (*native.shape[:-2], 6, pruned.index.shape[1])
        for r in range(6):
            b, s = divmod(r, 3)
            kept = keep[b, s] & (modality[b] != PAD)
            assert torch.equal(pruned.position_ids[..., r, :][..., rows[r]], native[..., b, kept])
            assert not pruned.position_ids[..., r, :][..., ~rows[r]].any()  # 0 at padding
            assert torch.equal(pruned.per_token["per_layer_inputs"][r][rows[r]],
                               per_layer[b][kept])
            # decoding goes on after the last original token, on each axis
            assert torch.equal(pruned.next_position[..., r], native[..., b, -1] + 1)
        assert torch.equal(pruned.original_length, torch.tensor([12, 12, 12, 9, 9, 9]))


def test_the_default_positions_are_unchanged():
    ids, mask, modality, positions, embeds, per_layer = batch()
    counted = (mask.cumsum(1) - 1).clamp_min(0)
    scores = torch.randn(2, 12)
    default = prune_inputs(embeds, modality, scores=scores, retention=0.5)
    given = prune_inputs(embeds, modality, scores=scores, retention=0.5, position_ids=counted)
    assert torch.equal(default.position_ids, given.position_ids)
    assert torch.equal(default.next_position, given.next_position)
    assert default.per_token == {}


def test_gather_tokens_reads_the_varlen_index_too():
    values = torch.arange(2 * 3 * 4).reshape(3, 2, 4)        # [3, B, L]
    index = torch.tensor([1, 2, 4, 7])                         # varlen: rows of [B * L]
    assert gather_tokens(values, index).tolist() == [[1, 2, 4, 7], [9, 10, 12, 15],
                                                     [17, 18, 20, 23]]
    per_token = torch.arange(8.0).reshape(2, 4, 1)
    assert gather_tokens(per_token, torch.tensor([[-1, 3], [5, 6]]), batch_first=True)[..., 0]\
        .tolist() == [[0.0, 3.0], [5.0, 6.0]]


@pytest.mark.parametrize("change,error,match", [
    (dict(position_ids=torch.zeros(3, 2, 11, dtype=torch.long)), ValueError,
     r"position_ids must have shape \[2, 12\] or \[..., 2, 12\]"),
    (dict(position_ids=torch.zeros(2, 12)), TypeError, "position_ids must be an integer"),
    (dict(position_ids=torch.zeros(2, 12, dtype=torch.long), positions="contiguous"),
     ValueError, "need positions='original'"),
    (dict(per_token={"per_layer_inputs": torch.zeros(2, 11, 3)}), ValueError,
     r"per_token\['per_layer_inputs'\] must have shape \[2, 12, ...\]"),
    (dict(per_token=[torch.zeros(2, 12)]), TypeError, "per_token must be a dict"),
    (dict(per_token={"position_ids": torch.zeros(2, 12)}), ValueError,
     "per_token may not hold 'position_ids'"),
])
def test_bad_native_inputs_are_refused(change, error, match):
    ids, mask, modality, positions, embeds, per_layer = batch()
    with pytest.raises(error, match=match):
        prune_inputs(embeds, modality, scores=torch.randn(2, 12), retention=0.5, **change)
