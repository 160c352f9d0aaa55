"""Tiny random instances of the audio-visual model families avex.adapters supports, built from
configs (nothing downloaded), each with a batch of two prompts shaped as its processor would
shape them: ragged lengths, left padding, real placeholder layouts.

The text decoders use a large initialisation (``initializer_range=0.3``) so that a wrong
position changes the generated tokens."""
import itertools
from contextlib import contextmanager

import torch
from torch import nn

TEXT_VOCAB = 200
TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.3)
MROPE = dict(rope_type="default", mrope_section=[2, 1, 1], rope_theta=10000.0)


def left_pad(rows, pad_id=0):
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, width - len(row):] = torch.tensor(row)
        mask[b, width - len(row):] = 1
    return ids, mask


def _eval(model):
    return model.eval().requires_grad_(False)


# --- Qwen2.5-Omni thinker: video with its audio interleaved (use_audio_in_video) -------------
OMNI = dict(audio=190, image=191, video=192, audio_start=193, audio_end=194, vision_start=195,
            vision_end=196)


def _chunks(values, size):
    keys = [int(v) // size for v in values]
    return [len(list(group)) for _, group in itertools.groupby(keys)]


def omni_av_block(grid_t, tokens_per_frame, n_audio, per_second=2, chunk_seconds=2):
    """The processor's interleaving: each 2-second chunk holds its video tokens, then its
    audio tokens (positions per second and seconds per chunk as in the config)."""
    size = per_second * chunk_seconds
    video_t = [t * per_second for t in range(grid_t) for _ in range(tokens_per_frame)]
    video, audio = _chunks(video_t, size), _chunks(range(n_audio), size)
    seq = []
    for j in range(max(len(video), len(audio))):
        seq += [OMNI["video"]] * (video[j] if j < len(video) else 0)
        seq += [OMNI["audio"]] * (audio[j] if j < len(audio) else 0)
    return [OMNI["vision_start"], OMNI["audio_start"]] + seq + [OMNI["audio_end"],
                                                               OMNI["vision_end"]]


def omni_audio_tokens(frames):
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


def omni(end_with_av=False, seed=1, vocab=TEXT_VOCAB):
    from transformers import Qwen2_5OmniThinkerConfig, Qwen2_5OmniThinkerForConditionalGeneration
    config = Qwen2_5OmniThinkerConfig(
        text_config=dict(TEXT, vocab_size=vocab, rope_parameters=MROPE),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2,
                           out_hidden_size=32, fullatt_block_indexes=[0], patch_size=2,
                           spatial_merge_size=2, temporal_patch_size=2),
        audio_config=dict(num_mel_bins=8, encoder_layers=1, encoder_attention_heads=2,
                          encoder_ffn_dim=32, d_model=16, output_dim=32, n_window=4,
                          max_source_positions=64),
        audio_token_id=OMNI["audio"], image_token_id=OMNI["image"],
        video_token_id=OMNI["video"], audio_start_token_id=OMNI["audio_start"],
        audio_end_token_id=OMNI["audio_end"], vision_start_token_id=OMNI["vision_start"],
        vision_end_token_id=OMNI["vision_end"], position_id_per_seconds=2,
        seconds_per_chunk=2, pad_token_id=0)
    torch.manual_seed(0)
    model = _eval(Qwen2_5OmniThinkerForConditionalGeneration(config))
    frames = (40, 24)
    tail = ([], []) if end_with_av else ([20, 21, 22, 23], [20, 21, 22])
    rows = [[10, 11, 12] + omni_av_block(3, 4, omni_audio_tokens(frames[0])) + tail[0],
            [10, 11] + omni_av_block(2, 4, omni_audio_tokens(frames[1])) + tail[1]]
    ids, mask = left_pad(rows)
    grids = torch.tensor([[3, 4, 4], [2, 4, 4]])
    gen = torch.Generator().manual_seed(seed)
    features_mask = (torch.arange(40)[None] < torch.tensor(frames)[:, None]).long()
    inputs = dict(input_ids=ids, attention_mask=mask,
                  pixel_values_videos=torch.randn(int(grids.prod(-1).sum()), 24, generator=gen),
                  video_grid_thw=grids, video_second_per_grid=torch.tensor([1.0, 1.0]),
                  input_features=torch.randn(2, 8, 40, generator=gen),
                  feature_attention_mask=features_mask, use_audio_in_video=True)
    return model, inputs


# --- Qwen2.5-VL: an image and a video ----------------------------------------------------------
VL = dict(image=191, video=192, vision_start=195, vision_end=196)


def qwen2_5_vl(seed=1, vocab=TEXT_VOCAB):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    config = Qwen2_5_VLConfig(
        text_config=dict(TEXT, vocab_size=vocab, rope_parameters=MROPE),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2,
                           out_hidden_size=32, fullatt_block_indexes=[0], patch_size=2,
                           spatial_merge_size=2, temporal_patch_size=2, window_size=8),
        image_token_id=VL["image"], video_token_id=VL["video"],
        vision_start_token_id=VL["vision_start"], vision_end_token_id=VL["vision_end"],
        pad_token_id=0)
    torch.manual_seed(0)
    model = _eval(Qwen2_5_VLForConditionalGeneration(config))
    image = [VL["vision_start"]] + [VL["image"]] * 4 + [VL["vision_end"]]
    video = [[VL["vision_start"]] + [VL["video"]] * (4 * t) + [VL["vision_end"]] for t in (3, 2)]
    rows = [[10, 11] + image + [12, 13] + video[0] + [20, 21, 22],
            [10] + video[1] + [20, 21]]
    ids, mask = left_pad(rows)
    types = torch.zeros_like(ids)
    types[ids == VL["image"]] = 1
    types[ids == VL["video"]] = 2
    gen = torch.Generator().manual_seed(seed)
    video_grids = torch.tensor([[3, 4, 4], [2, 4, 4]])
    inputs = dict(input_ids=ids, attention_mask=mask, mm_token_type_ids=types,
                  pixel_values=torch.randn(16, 24, generator=gen),
                  image_grid_thw=torch.tensor([[1, 4, 4]]),
                  pixel_values_videos=torch.randn(int(video_grids.prod(-1).sum()), 24,
                                                  generator=gen),
                  video_grid_thw=video_grids, second_per_grid_ts=torch.tensor([1.0, 2.0]))
    return model, inputs


# --- LLaVA-OneVision: a video (pooled frames, then the image_newline) --------------------------
LLAVA = dict(image=191, video=192)


def llava_onevision():
    from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration
    config = LlavaOnevisionConfig(
        text_config=dict(TEXT, model_type="qwen2", vocab_size=TEXT_VOCAB, pad_token_id=0),
        vision_config=dict(model_type="siglip_vision_model", hidden_size=16,
                           intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                           image_size=8, patch_size=2),
        image_token_index=LLAVA["image"], video_token_index=LLAVA["video"],
        vision_feature_layer=-1, vision_feature_select_strategy="full")
    torch.manual_seed(0)
    model = _eval(LlavaOnevisionForConditionalGeneration(config))
    video = [LLAVA["video"]] * (2 * 4 + 1)  # 2 frames of 2x2 pooled patches, then a newline
    rows = [[10, 11, 12] + video + [20, 21, 22, 23], [10] + video + [20, 21]]
    ids, mask = left_pad(rows)
    gen = torch.Generator().manual_seed(1)
    inputs = dict(input_ids=ids, attention_mask=mask,
                  pixel_values_videos=torch.randn(2, 2, 3, 8, 8, generator=gen))
    return model, inputs


# --- Qwen2-Audio -------------------------------------------------------------------------------
QWEN2_AUDIO = dict(audio=190, bos=193, eos=194)


def qwen2_audio():
    from transformers import Qwen2AudioConfig, Qwen2AudioForConditionalGeneration
    config = Qwen2AudioConfig(
        audio_config=dict(d_model=16, encoder_layers=1, encoder_attention_heads=2,
                          encoder_ffn_dim=32, num_mel_bins=8, max_source_positions=20),
        text_config=dict(TEXT, model_type="qwen2", vocab_size=TEXT_VOCAB, pad_token_id=0),
        audio_token_index=QWEN2_AUDIO["audio"])
    torch.manual_seed(0)
    model = _eval(Qwen2AudioForConditionalGeneration(config))
    frames = (40, 24)
    audio = [[QWEN2_AUDIO["bos"]] + [QWEN2_AUDIO["audio"]] * omni_audio_tokens(n)
             + [QWEN2_AUDIO["eos"]] for n in frames]
    rows = [[10, 11] + audio[0] + [20, 21, 22, 23], [10] + audio[1] + [20, 21]]
    ids, mask = left_pad(rows)
    gen = torch.Generator().manual_seed(1)
    inputs = dict(input_ids=ids, attention_mask=mask,
                  input_features=torch.randn(2, 8, 40, generator=gen),
                  feature_attention_mask=(torch.arange(40)[None]
                                          < torch.tensor(frames)[:, None]).long())
    return model, inputs


# --- Gemma 3n: an image and an audio clip ------------------------------------------------------
GEMMA = dict(image=257, audio=321, boi=250, eoi=251, boa=252, eoa=253, image_tokens=4,
             audio_tokens=6)


class StandInVisionTower(nn.Module):
    """Gemma 3n's vision tower is a timm MobileNetV5, and timm is not installed here: this conv
    stands in for it ([B, 3, 8, 8] -> [B, 16, 2, 2]). Everything after the tower is the real
    model."""

    def __init__(self, hidden):
        super().__init__()
        self.conv = nn.Conv2d(3, hidden, kernel_size=4, stride=4)

    def forward(self, pixel_values, **kwargs):
        from transformers.modeling_outputs import BaseModelOutputWithPooling
        return BaseModelOutputWithPooling(last_hidden_state=self.conv(pixel_values))


@contextmanager
def _stand_in_vision_tower():
    from transformers.models.gemma3n import modeling_gemma3n
    real = modeling_gemma3n.AutoModel

    class Auto:
        @staticmethod
        def from_config(config, **kwargs):
            if config.model_type == "gemma3n_vision":
                return StandInVisionTower(config.hidden_size)
            return real.from_config(config, **kwargs)

    modeling_gemma3n.AutoModel = Auto
    try:
        yield
    finally:
        modeling_gemma3n.AutoModel = real


def gemma3n(sliding_window=64, layer_types=("sliding_attention", "full_attention")):
    from transformers import Gemma3nConfig, Gemma3nForConditionalGeneration
    text = dict(TEXT, vocab_size=384, vocab_size_per_layer_input=256,
                hidden_size_per_layer_input=8, head_dim=8, laurel_rank=4,
                altup_num_inputs=2, num_kv_shared_layers=0,
                activation_sparsity_pattern=[0.0, 0.0], sliding_window=sliding_window,
                layer_types=list(layer_types), pad_token_id=0)
    config = Gemma3nConfig(
        text_config=text,
        vision_config=dict(hidden_size=16, vocab_size=64, vocab_offset=256),
        audio_config=dict(input_feat_size=8, hidden_size=16, conf_num_attention_heads=2,
                          conf_num_hidden_layers=1, sscp_conv_channel_size=[8, 4],
                          conf_attention_chunk_size=4, conf_attention_context_left=5,
                          vocab_size=64, vocab_offset=320),
        audio_soft_tokens_per_image=GEMMA["audio_tokens"],
        vision_soft_tokens_per_image=GEMMA["image_tokens"], image_token_id=GEMMA["image"],
        audio_token_id=GEMMA["audio"], boi_token_id=GEMMA["boi"], eoi_token_id=GEMMA["eoi"],
        boa_token_id=GEMMA["boa"], eoa_token_id=GEMMA["eoa"])
    torch.manual_seed(0)
    with _stand_in_vision_tower():
        model = _eval(Gemma3nForConditionalGeneration(config))
    # AltUp scales the per-layer inputs' contribution by correct_output_scale, initialised to 0:
    # without this a wrong or missing per_layer_inputs would change no output
    with torch.no_grad():
        for layer in model.model.language_model.layers:
            layer.altup.correct_output_scale.fill_(1.0)
    image = [GEMMA["boi"]] + [GEMMA["image"]] * GEMMA["image_tokens"] + [GEMMA["eoi"]]
    audio = [GEMMA["boa"]] + [GEMMA["audio"]] * GEMMA["audio_tokens"] + [GEMMA["eoa"]]
    rows = [[2, 10, 11] + image + [12] + audio + [20, 21, 22, 23],
            [2, 10] + image + audio + [20, 21]]
    ids, mask = left_pad(rows)
    gen = torch.Generator().manual_seed(1)
    inputs = dict(input_ids=ids, attention_mask=mask,
                  pixel_values=torch.randn(2, 3, 8, 8, generator=gen),
                  input_features=torch.randn(2, 96, 8, generator=gen),
                  input_features_mask=torch.arange(96)[None] < torch.tensor([[96], [64]]))
    return model, inputs


BUILDERS = {"qwen2_5_omni": omni, "qwen2_5_vl": qwen2_5_vl, "llava_onevision": llava_onevision,
            "qwen2_audio": qwen2_audio, "gemma3n": gemma3n}
