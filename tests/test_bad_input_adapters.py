"""Bad input to the model adapters, the modality helpers and the checked forward: one case a
line (tests/badinput.py). Each is refused naming the argument and the value, before any tower
or decoder runs; the cases the adapters used to take silently (another family's inputs,
placeholders without features, a stray keyword, a mask holding 2, Qwen2.5-VL without
mm_token_type_ids, Omni's use_audio_in_video against the prompt's layout) come first."""
import inspect

import pytest
import torch
import transformers

import tiny_av_models as tiny
from avex import pruning
from avex.adapters import adapt
from avex.modality import AUDIO, PAD, TEXT, VISUAL, check_codes, codes_from_ids
from badinput import NAN, case, raises

OMNI, VL, GEMMA = tiny.OMNI, tiny.VL, tiny.GEMMA
# transformers releases whose Gemma 3n forward takes no per_layer_inputs (5.17, the GPU image's)
# refuse the model in adapt (tests/test_adapters.py) before any of its rows could be reached
GEMMA3N = pytest.mark.skipif(
    "per_layer_inputs" not in inspect.signature(
        transformers.Gemma3nForConditionalGeneration.forward).parameters,
    reason=f"transformers {transformers.__version__}'s Gemma3nForConditionalGeneration takes no "
           "per_layer_inputs, so adapt refuses Gemma 3n first")


@pytest.fixture(scope="module")
def families():
    """name -> (model, processor outputs); each call of a case gets fresh copies of the
    outputs' dict (the tensors are shared and never written)."""
    built = {}

    def get(name, **overrides):
        if name not in built:
            built[name] = tiny.BUILDERS[name]()
        model, inputs = built[name]
        inputs = dict(inputs, **overrides)
        return model, {k: v for k, v in inputs.items() if v is not DROP}
    return get


DROP = object()  # an override that removes the keyword


def adapting(name, **overrides):
    def call(families):
        model, inputs = families(name, **overrides)
        return adapt(model, **inputs)
    return call


def other_inputs(name, family):
    """``name``'s model given ``family``'s processor outputs."""
    return lambda families: adapt(families(name)[0], **families(family)[1])


def replaced(name, key, row, position, value):
    """``name``'s ``key`` with one entry changed."""
    def call(families):
        model, inputs = families(name)
        changed = inputs[key].clone()
        changed[row, position] = value
        return adapt(model, **dict(inputs, **{key: changed}))
    return call


def omni_prompt(block, use_audio_in_video=True):
    """Omni's first sample alone, its video/audio block replaced by ``block``."""
    def call(families):
        model, inputs = families("qwen2_5_omni")
        ids = [10, 11, 12] + block + [20, 21, 22, 23]
        return adapt(model, input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                                                                                    dtype=int),
                     pixel_values_videos=inputs["pixel_values_videos"][:48],
                     video_grid_thw=inputs["video_grid_thw"][:1],
                     video_second_per_grid=inputs["video_second_per_grid"][:1],
                     input_features=inputs["input_features"][:1],
                     feature_attention_mask=inputs["feature_attention_mask"][:1],
                     use_audio_in_video=use_audio_in_video)
    return call


VIDEO_12 = [OMNI["video"]] * 12  # video 0: 3 frames of 2 x 2 merged patches
AUDIO_10 = [OMNI["audio"]] * 10  # audio 0: 40 frames through the tower
SEPARATE = [OMNI["vision_start"]] + VIDEO_12 + [OMNI["vision_end"], OMNI["audio_start"]] + \
    AUDIO_10 + [OMNI["audio_end"]]
UNCHUNKED = [OMNI["vision_start"], OMNI["audio_start"]] + VIDEO_12 + AUDIO_10 + \
    [OMNI["audio_end"], OMNI["vision_end"]]


def swapped_video_grids(families):
    model, inputs = families("qwen2_5_vl")
    return adapt(model, **dict(inputs, video_grid_thw=inputs["video_grid_thw"].flip(0)))


SILENT_CASES = [  # each of these used to return AdaptedInputs without a word
    case("Qwen2.5-VL inputs to Qwen2-Audio", other_inputs("qwen2_audio", "qwen2_5_vl"), ValueError, r"Qwen2AudioForConditionalGeneration takes no keyword 'mm_token_type_ids', 'pixel_values', .* Is this another model family's processor output\?"),
    case("Qwen2-Audio inputs to Qwen2.5-VL", other_inputs("qwen2_5_vl", "qwen2_audio"), ValueError, r"Qwen2_5_VLForConditionalGeneration takes no keyword 'input_features', 'feature_attention_mask'"),
    case("audio placeholders without input_features", adapting("qwen2_audio", input_features=DROP, feature_attention_mask=DROP), ValueError, r"input_ids hold 16 audio placeholder tokens \(id 190\) but no input_features was given"),
    case("video placeholders without pixel_values_videos", adapting("qwen2_5_vl", pixel_values_videos=DROP), ValueError, r"input_ids hold 20 video placeholder tokens \(id 192\) but no pixel_values_videos was given"),
    case("Omni audio placeholders without input_features", adapting("qwen2_5_omni", input_features=DROP), ValueError, r"input_ids hold 16 audio placeholder tokens \(id 190\) but no input_features was given"),
    case("Gemma 3n input_features without input_features_mask", adapting("gemma3n", input_features_mask=DROP), ValueError, r"input_ids hold 12 audio placeholder tokens \(id 321\) but no input_features_mask was given", marks=GEMMA3N),
    case("LLaVA-OneVision video placeholders without pixels", adapting("llava_onevision", pixel_values_videos=DROP), ValueError, r"input_ids hold 18 video placeholder tokens \(id 192\) but no pixel_values_videos"),
    case("image pixels without image placeholders", replaced("qwen2_5_vl", "input_ids", 0, slice(3, 7), 12), ValueError, r"pixel_values was given but input_ids hold no image placeholder \(id 191\), so the model would ignore it"),
    case("unknown keyword bogus=1", adapting("qwen2_5_vl", bogus=1), ValueError, r"Qwen2_5_VLForConditionalGeneration takes no keyword 'bogus' \(got bogus=1\); its forward would drop it"),
    case("inputs_embeds= to adapt", adapting("qwen2_audio", inputs_embeds=torch.zeros(2, 18, 32)), ValueError, r"inputs_embeds= is not a processor output \(the adapter builds the embeddings from input_ids\); got a tensor \[2, 18, 32\]"),
    case("attention_mask holding 2", replaced("qwen2_5_vl", "attention_mask", 0, 5, 2), ValueError, r"attention_mask must hold 0 \(padding\) or 1 \(token\), got 2 at sample 0, position 5"),
    case("Qwen2.5-VL without mm_token_type_ids", adapting("qwen2_5_vl", mm_token_type_ids=DROP), ValueError, "mm_token_type_ids is missing: this model computes M-RoPE positions only with it, so the image and video tokens would silently get 1-D positions"),
    case("Qwen2.5-VL mm_token_type_ids all 0", lambda f: adapting("qwen2_5_vl", mm_token_type_ids=torch.zeros(2, 27, dtype=torch.long))(f), ValueError, r"mm_token_type_ids must be 1 at image placeholders \(id 191\), 2 at video placeholders \(id 192\) and 0 elsewhere, got 0 at sample 0, position 3 \(token id 191\)"),
    case("Omni use_audio_in_video=True, video and audio in separate blocks", omni_prompt(SEPARATE), ValueError, r"use_audio_in_video is True but video 0 \(sample 0, positions 4..15\) holds no audio token: the prompt isn't interleaved"),
    case("Omni use_audio_in_video=False on an interleaved prompt", adapting("qwen2_5_omni", use_audio_in_video=False), ValueError, r"use_audio_in_video is False but video 0 \(sample 0, positions 5..26\) holds its audio interleaved with it; pass use_audio_in_video=True"),
    case("Omni use_audio_in_video=True, one chunk of video then its audio", omni_prompt(UNCHUNKED), ValueError, r"video 0 \(sample 0, positions 5..26\) interleaves its video and audio tokens otherwise than the model's 4-position chunks"),
    case("Omni use_audio_in_video='yes'", adapting("qwen2_5_omni", use_audio_in_video="yes"), TypeError, "use_audio_in_video must be True or False, got str: 'yes'"),
]

UNCLEAR_CASES = [  # each of these used to fail inside transformers or torch
    case("Qwen2-Audio without feature_attention_mask", adapting("qwen2_audio", feature_attention_mask=DROP), ValueError, r"input_ids hold 16 audio placeholder tokens \(id 190\) but no feature_attention_mask was given"),
    case("Qwen2.5-VL without video_grid_thw", adapting("qwen2_5_vl", video_grid_thw=DROP), ValueError, r"input_ids hold 20 video placeholder tokens \(id 192\) but no video_grid_thw was given"),
    case("1-D input_ids", lambda f: adapting("qwen2_audio", input_ids=f("qwen2_audio")[1]["input_ids"][0])(f), ValueError, r"input_ids must be 2-D, got shape \[18\]"),
    case("float input_ids", lambda f: adapting("qwen2_audio", input_ids=f("qwen2_audio")[1]["input_ids"].float())(f), TypeError, "input_ids must be an integer tensor, got dtype torch.float32"),
    case("list input_ids", lambda f: adapting("qwen2_audio", input_ids=f("qwen2_audio")[1]["input_ids"].tolist())(f), TypeError, r"input_ids must be a torch.Tensor \[B, L\] of token ids \(the processor's return_tensors='pt'\), got list"),
    case("an audio block one placeholder short", replaced("qwen2_audio", "input_ids", 0, 12, 194), ValueError, r"audio 0 \(sample 0, positions 3..11\) has 9 placeholder tokens \(id 190\) but feature_attention_mask .* give\(s\) it 10"),
    case("one audio placeholder too many blocks", replaced("qwen2_audio", "input_ids", 0, 6, 10), ValueError, r"input_ids hold 3 audio block\(s\) \(placeholder id 190\) but feature_attention_mask .* describe\(s\) 2 audio\(s\)"),
    case("video_grid_thw disagrees with the placeholders", swapped_video_grids, ValueError, r"video 0 \(sample 0, positions 11..22\) has 12 placeholder tokens \(id 192\) but video_grid_thw .* give\(s\) it 8"),
    case("pixel_values_videos disagree with video_grid_thw", lambda f: adapting("qwen2_5_vl", pixel_values_videos=f("qwen2_5_vl")[1]["pixel_values_videos"][:-4])(f), ValueError, r"pixel_values_videos has 76 patch rows but video_grid_thw \[\[3, 4, 4\], \[2, 4, 4\]\] describes 80"),
    case("image_grid_thw h not a multiple of the merge size", adapting("qwen2_5_vl", image_grid_thw=torch.tensor([[1, 3, 4]])), ValueError, r"image_grid_thw must be \[items, 3\] rows of \(t, h, w\) >= 1 with h and w multiples of the spatial merge size 2, got \[\[1, 3, 4\]\]"),
    case("second_per_grid_ts for one of two videos", adapting("qwen2_5_vl", second_per_grid_ts=torch.tensor([1.0])), ValueError, r"second_per_grid_ts must hold one value per video \(\[2\], as video_grid_thw has 2 rows\), got \[1\]"),
    case("Omni video without video_second_per_grid", adapting("qwen2_5_omni", video_second_per_grid=DROP), ValueError, r"input_ids hold 20 video placeholder tokens \(id 192\) but no video_second_per_grid"),
    case("Omni audio_feature_lengths instead of the mask", adapting("qwen2_5_omni", audio_feature_lengths=torch.tensor([40, 24])), ValueError, r"audio_feature_lengths= is not a processor output \(pass feature_attention_mask"),
    case("Omni feature_attention_mask of one audio", lambda f: adapting("qwen2_5_omni", feature_attention_mask=f("qwen2_5_omni")[1]["feature_attention_mask"][:1])(f), ValueError, r"feature_attention_mask must have shape \[2, 40\] \(one row per audio of input_features \[2, 8, 40\]\), got \[1, 40\]"),
    case("Gemma 3n one image for two image blocks", lambda f: adapting("gemma3n", pixel_values=f("gemma3n")[1]["pixel_values"][:1])(f), ValueError, r"input_ids hold 2 image block\(s\) \(placeholder id 257\) but pixel_values \[1, 3, 8, 8\] \(4 tokens each\) describe\(s\) 1 image\(s\)", marks=GEMMA3N),
    case("Gemma 3n image block one token short", replaced("gemma3n", "input_ids", 0, 7, GEMMA["eoi"]), ValueError, r"image 0 \(sample 0, positions 4..6\) has 3 placeholder tokens \(id 257\) but pixel_values", marks=GEMMA3N),
    case("LLaVA-OneVision videos of 3 frames for 2-frame blocks", adapting("llava_onevision", pixel_values_videos=torch.randn(2, 3, 3, 8, 8)), ValueError, r"video 0 \(sample 0, positions 3..11\) has 9 placeholder tokens \(id 192\) but pixel_values_videos \[2, 3, 3, 8, 8\] \(3 frames x 4 pooled patches \+ 1 newline each\) give\(s\) it 13"),
    case("LLaVA-OneVision attention_mask row all 0", lambda f: adapting("llava_onevision", attention_mask=f("llava_onevision")[1]["attention_mask"] * torch.tensor([[1], [0]]))(f), ValueError, "attention_mask row 1 is all 0: that sample has no token"),
]


@pytest.mark.parametrize("call,error,match", SILENT_CASES + UNCLEAR_CASES)
def test_bad_processor_output_is_refused_before_the_towers_run(families, monkeypatch, call,
                                                                 error, match):
    from avex.adapters import _capture

    def no_tower(*args, **kwargs):
        raise AssertionError("the model ran before the inputs were checked")
    monkeypatch.setattr(_capture, "capture_decoder_inputs", no_tower)
    raises(lambda: call(families), error, match)


IDS = torch.tensor([[5, 6, 94, 91, 91, 95, 92, 92, 7, 8]])
MASK = torch.ones_like(IDS)


def mask_with(value):
    mask = MASK.float()
    mask[0, 3] = value
    return mask


def mm_token_type_ids(ids):
    return torch.where(ids == 91, 1, torch.where(ids == 92, 2, 0))


ENDS_IN_VIDEO = torch.tensor([[5, 94, 92, 92]])

MODALITY_CASES = [
    case("codes_from_ids visual_ids=-5", lambda: codes_from_ids(IDS, MASK, visual_ids=-5), ValueError, "visual_ids must be token ids >= 0, got -5"),
    case("codes_from_ids audio_ids beyond int64", lambda: codes_from_ids(IDS, MASK, audio_ids=[2**70]), ValueError, r"audio_ids must be token ids that fit input_ids' dtype torch.int64 \(at most 9223372036854775807\), got 1180591620717411303424"),
    case("codes_from_ids visual_ids beyond int32 ids", lambda: codes_from_ids(IDS.int(), MASK, visual_ids=2**40), ValueError, r"visual_ids must be token ids that fit input_ids' dtype torch.int32"),
    case("attention_mask holding 2", lambda: codes_from_ids(IDS, mask_with(2), visual_ids=91), ValueError, r"attention_mask must hold 0 \(padding\) or 1 \(token\), got 2.0 at sample 0, position 3"),
    case("attention_mask holding -1", lambda: codes_from_ids(IDS, mask_with(-1), visual_ids=91), ValueError, "attention_mask must hold 0 .* got -1.0 at sample 0, position 3"),
    case("attention_mask holding NaN", lambda: codes_from_ids(IDS, mask_with(NAN), visual_ids=91), ValueError, "attention_mask must hold 0 .* got nan at sample 0, position 3"),
    case("attention_mask holding 0.5", lambda: codes_from_ids(IDS, mask_with(0.5), visual_ids=91), ValueError, "attention_mask must hold 0 .* got 0.5 at sample 0, position 3"),
    case("check_codes float codes", lambda: check_codes(torch.tensor([[2.0, 0.0, 2.0]])), TypeError, "modality must be an integer tensor, got dtype torch.float32"),
    case("check_codes mm_token_type_ids of a video prompt", lambda: check_codes(mm_token_type_ids(IDS)), ValueError, r"modality row 0 begins and ends with audio-visual tokens \(codes 0 and 0\) and holds its text only in between: that is Hugging Face's mm_token_type_ids of a video prompt"),
    case("prune_inputs with mm_token_type_ids of a video prompt", lambda: pruning.prune_inputs(torch.randn(1, 10, 4), mm_token_type_ids(IDS), scores=torch.randn(1, 10), retention=0.5), ValueError, "modality row 0 begins and ends with audio-visual tokens"),
    case("check_codes mm_token_type_ids of a prompt ending in its video, with the ids", lambda: check_codes(mm_token_type_ids(ENDS_IN_VIDEO), input_ids=ENDS_IN_VIDEO, placeholder_ids=(91, 92)), ValueError, "modality row 0 codes as text only placeholder tokens"),
]


@pytest.mark.parametrize("call,error,match", MODALITY_CASES)
def test_bad_modality_input_is_refused(call, error, match):
    raises(call, error, match)


def pruned_family(families, name, **model_kwargs):
    """(model, pruned inputs) of a family; ``model_kwargs`` build a model of its own."""
    model, inputs = tiny.BUILDERS[name](**model_kwargs) if model_kwargs else families(name)
    adapted = adapt(model, **inputs)
    gen = torch.Generator().manual_seed(5)
    return model, adapted.prune(scores=torch.randn(adapted.modality.shape, generator=gen),
                                retention=0.4)


def pruned_without_positions(families, name, call):
    """A family's inputs pruned by prune_inputs without the model's own position ids."""
    model, inputs = families(name)
    adapted = adapt(model, **inputs)
    pruned = pruning.prune_inputs(adapted.inputs_embeds, adapted.modality,
                                  scores=torch.randn(adapted.modality.shape), retention=0.4)
    return call(model, pruned, max_new_tokens=2) if call is pruning.generate else call(model, pruned)


def without_per_token(families):
    model, pruned = pruned_family(families, "gemma3n")
    return pruning.forward(model, pruned._replace(per_token={}))


FORWARD_CASES = [
    case("forward under a sliding window that binds", lambda f: pruning.forward(*pruned_family(f, "gemma3n", sliding_window=16)), ValueError, r"sliding_window=16 counts cache slots, .* a prompt of 22 tokens outgrows it, so the pruned forward would attend further back", marks=GEMMA3N),
    case("forward on Gemma 3n without its per-layer inputs", without_per_token, ValueError, "Gemma3nForConditionalGeneration needs per_layer_inputs beside inputs_embeds", marks=GEMMA3N),
    case("forward per_layer_inputs=", lambda f: pruning.forward(*pruned_family(f, "gemma3n"), per_layer_inputs=None), ValueError, "forward takes per_layer_inputs from pruned; don't pass per_layer_inputs=", marks=GEMMA3N),
    case("forward position_ids=", lambda f: pruning.forward(*pruned_family(f, "qwen2_audio"), position_ids=None), ValueError, "forward takes position_ids from pruned"),
    case("forward pruned a tuple", lambda f: pruning.forward(f("qwen2_audio")[0], tuple(pruned_family(f, "qwen2_audio")[1])), TypeError, "pruned must be the PrunedInputs returned by prune_inputs, got tuple"),
    case("forward on Qwen2.5-VL with 1-D positions", lambda f: pruned_without_positions(f, "qwen2_5_vl", pruning.forward), ValueError, r"Qwen2_5_VLForConditionalGeneration places audio-visual tokens with M-RoPE positions \(\[3, B, L\]\), but pruned row 0 holds \d+ of them with 1-D positions"),
    case("generate on the Omni thinker with 1-D positions", lambda f: pruned_without_positions(f, "qwen2_5_omni", pruning.generate), ValueError, r"places audio-visual tokens with M-RoPE positions"),
    case("forward(None, ...)", lambda f: pruning.forward(None, pruned_family(f, "qwen2_audio")[1]), TypeError, r"model must be a Hugging Face \*ForCausalLM"),
]


@pytest.mark.parametrize("call,error,match", FORWARD_CASES)
def test_bad_forward_is_refused(families, call, error, match):
    raises(lambda: call(families), error, match)
