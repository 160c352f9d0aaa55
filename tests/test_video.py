"""The video path of our own (avex.data.video) gives the pixels transformers' video processors
give, wherever torchvision imports (the vLLM environment, `make test-vllm`, and the GPU image);
elsewhere those comparisons skip, naming why, and the rest checks what needs no torchvision."""
import numpy as np
import pytest
import torch

from avex.data.video import (LlavaOnevisionFramesProcessor, QwenVLFramesProcessor,
                             frames_video_processor)


def torchvision_missing():
    try:
        import torchvision  # noqa: F401
        from transformers.models.qwen2_vl.video_processing_qwen2_vl import \
            Qwen2VLVideoProcessor  # noqa: F401
    except Exception as err:  # ImportError, or torchvision's own failure on a CPU torch
        return f"torchvision can't be imported here ({type(err).__name__}: {str(err)[:80]})"
    return None


needs_torchvision = pytest.mark.skipif(torchvision_missing() is not None,
                                       reason=str(torchvision_missing()))


def frames(count, height, width, seed=0):
    return list(np.random.default_rng(seed).integers(0, 256, (count, height, width, 3),
                                                     dtype=np.uint8))


QWEN = [  # (config, frames, height, width): resized up, down, kept, odd frame counts
    (dict(patch_size=2, merge_size=2, temporal_patch_size=2,
          size={"shortest_edge": 64, "longest_edge": 1024}), 3, 30, 44),
    (dict(patch_size=2, merge_size=2, temporal_patch_size=2,
          size={"shortest_edge": 256, "longest_edge": 4096}), 4, 8, 12),
    (dict(patch_size=2, merge_size=2, temporal_patch_size=2,
          size={"shortest_edge": 16, "longest_edge": 256}), 5, 48, 40),
    (dict(patch_size=2, merge_size=2, temporal_patch_size=2,
          size={"shortest_edge": 16, "longest_edge": 4096}), 2, 16, 24),
    (dict(patch_size=4, merge_size=2, temporal_patch_size=1, image_mean=[0.5] * 3,
          image_std=[0.25] * 3, resample=2, size={"shortest_edge": 64, "longest_edge": 2048}),
     3, 37, 21),
]


@needs_torchvision
@pytest.mark.parametrize("config,count,height,width", QWEN)
def test_qwen_frames_equal_transformers_video_processor(config, count, height, width):
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    video = frames(count, height, width)
    theirs = Qwen2VLVideoProcessor(**config)(videos=[video], return_tensors="pt",
                                             do_sample_frames=False)
    ours = QwenVLFramesProcessor(**config)(videos=[video], fps=2.0)
    assert torch.equal(ours["video_grid_thw"], theirs["video_grid_thw"])
    assert torch.equal(ours["pixel_values_videos"], theirs["pixel_values_videos"])


@needs_torchvision
@pytest.mark.parametrize("size,resample", [({"height": 16, "width": 16}, 3),
                                           ({"height": 12, "width": 20}, 2),
                                           ({"height": 30, "width": 44}, 3)])
def test_llava_onevision_frames_equal_transformers_video_processor(size, resample):
    from transformers.models.llava_onevision.video_processing_llava_onevision import \
        LlavaOnevisionVideoProcessor

    video = frames(3, 30, 44)
    theirs = LlavaOnevisionVideoProcessor(size=size, resample=resample)(
        videos=[video], return_tensors="pt", do_sample_frames=False)
    ours = LlavaOnevisionFramesProcessor(size=size, resample=resample)(videos=[video])
    assert torch.equal(ours["pixel_values_videos"], theirs["pixel_values_videos"])


@needs_torchvision
def test_a_saved_configuration_loads_into_transformers_own_class(tmp_path):
    from transformers import AutoVideoProcessor

    ours = QwenVLFramesProcessor(patch_size=2, merge_size=2, temporal_patch_size=2,
                                 size={"shortest_edge": 64, "longest_edge": 1024})
    ours.save_pretrained(str(tmp_path))
    theirs = AutoVideoProcessor.from_pretrained(str(tmp_path))
    assert type(theirs).__name__ == "Qwen2VLVideoProcessor"
    video = frames(3, 30, 44)
    assert torch.equal(ours(videos=[video])["pixel_values_videos"],
                       theirs(videos=[video], return_tensors="pt",
                              do_sample_frames=False)["pixel_values_videos"])


def test_patch_order_is_the_image_processors_for_a_still_video():
    """Without torchvision too: a video of one frame repeated gives, per temporal patch, the
    patches of that frame in the grid order (checked against a direct per-patch read)."""
    proc = QwenVLFramesProcessor(patch_size=2, merge_size=2, temporal_patch_size=2,
                                 size={"shortest_edge": 16, "longest_edge": 4096},
                                 do_normalize=False, do_rescale=False)
    frame = frames(1, 8, 12)[0]
    out = proc(videos=[[frame, frame]])
    assert out["video_grid_thw"].tolist() == [[1, 4, 6]]
    pixels = out["pixel_values_videos"].reshape(24, 3, 2, 2, 2)
    image = torch.from_numpy(frame).permute(2, 0, 1).float()
    order = [(bh * 2 + mh, bw * 2 + mw) for bh in range(2) for bw in range(3)
             for mh in range(2) for mw in range(2)]
    for row, (ph, pw) in enumerate(order):
        want = image[:, 2 * ph:2 * ph + 2, 2 * pw:2 * pw + 2]
        assert torch.equal(pixels[row, :, 0], want) and torch.equal(pixels[row, :, 1], want)


def test_refused_settings_are_named(tmp_path):
    with pytest.raises(ValueError, match="do_sample_frames=True"):
        QwenVLFramesProcessor(do_sample_frames=True)
    with pytest.raises(ValueError, match="resample 1 is not one this video path implements"):
        LlavaOnevisionFramesProcessor(resample=1)
    with pytest.raises(ValueError, match=r"size \{'shortest_edge': 16\} is not a fixed"):
        LlavaOnevisionFramesProcessor(size={"shortest_edge": 16})
    assert frames_video_processor("qwen2_vl", tmp_path).patch_size == 14   # no config: defaults
