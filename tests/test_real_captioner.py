"""``python -m avex.train --data <cache> --captioner <dir>`` against a real architecture: tiny
random Qwen2.5-Omni thinker and Qwen2.5-VL models saved with save_pretrained, their clips
exported through avex.adapters into the feature cache (merged embeddings, modality codes,
[3, L] native positions), and a policy trained end to end. Nothing is downloaded."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

import tiny_av_models as tiny
from avex.adapters import adapt
from avex.captioner import FrozenCaptioner
from avex.data import CacheWriter, FeatureCache
from avex.methods import make_selector
from avex.scoring import caption_split
from avex.modality import PAD

REPO = Path(__file__).resolve().parents[1]
WORDS = [f"w{i}" for i in range(tiny.TEXT_VOCAB - 3)]


def save_tokenizer(directory: Path):
    """A word-level tokenizer over the model's whole vocabulary, so captions decode."""
    vocab = {w: i for i, w in enumerate(["<pad>", "<unk>", "<eos>", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>",
                            eos_token="<eos>").save_pretrained(str(directory))


def export(builder, root: Path) -> tuple[Path, Path]:
    """The model saved with its tokenizer, and a cache of its clips (4 batches of 2)."""
    model, _ = builder(seed=0)
    with torch.no_grad():  # it writes only the references' words (ids 3..42): a random model
        head = model.get_output_embeddings().weight   # would score 0 on every reward, and
        head[:3].zero_()                              # avex.train refuses to train on that
        head[43:].zero_()
    model_dir = root / "captioner"
    model.save_pretrained(str(model_dir))
    save_tokenizer(model_dir)
    gen = torch.Generator().manual_seed(0)
    with CacheWriter(root / "cache", dim=tiny.TEXT["hidden_size"]) as writer:
        for seed in range(4):
            _, inputs = builder(seed=seed + 10)
            adapted = adapt(model, **inputs)
            for row in range(2):
                present = adapted.modality[row] != PAD
                refs = [" ".join(WORDS[int(i)] for i in torch.randint(0, 40, (4,),
                                                                      generator=gen))
                        for _ in range(6)]
                writer.add_merged(f"clip{seed}-{row}", "train" if seed < 3 else "test",
                                  adapted.inputs_embeds[row][present],
                                  adapted.modality[row][present],
                                  adapted.position_ids[:, row][:, present], refs_av=refs[:2],
                                  refs_v=refs[2:4], refs_a=refs[4:])
    return model_dir, root / "cache"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen2_5_omni", "qwen2_5_vl"])
def test_train_against_a_real_architecture(name, tmp_path):
    builder = tiny.BUILDERS[name]
    model_dir, cache_dir = export(builder, tmp_path)

    # the cache holds what the adapter gave, and the captioner reads it back as it was
    model, inputs = builder(seed=10)
    adapted = adapt(FrozenCaptioner.load(model_dir, device="cpu").model, **inputs)
    cache = FeatureCache(cache_dir)
    clips = [cache.get("clip0-0"), cache.get("clip0-1")]
    assert clips[0].merged["position_ids"].shape[0] == 3
    captioner = FrozenCaptioner.load(model_dir, device="cpu")
    batch = captioner.embed(clips)
    present = adapted.modality != PAD
    assert torch.equal(batch.modality, adapted.modality)
    assert torch.equal(batch.native_position_ids[:, present], adapted.position_ids[:, present])
    torch.testing.assert_close(batch.inputs_embeds[present], adapted.inputs_embeds[present])
    with pytest.raises(ValueError, match="needs its own position_ids"):
        captioner.generate_captions(batch.inputs_embeds, batch.modality,
                                    batch.modality != PAD, max_new_tokens=2)
    # the attention-scoring baselines run on it too (at its own positions)
    for method in ("fastv", "fastav", "tome"):
        selector = make_selector(method, captioner=captioner)
        assert len(caption_split(captioner, clips, selector, 0.4, max_new_tokens=2)) == 2

    run = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "avex.train", "--data", str(cache_dir), "--captioner",
         str(model_dir), "--run-dir", str(run), "--device", "cpu", "--batch-size", "2",
         "--micro-batch-size", "2", "--epochs", "1", "--warmup-epochs", "0.5",
         "--exchanges",   # the exchange path too, on real M-RoPE models
         "--max-new-tokens", "4", "--eval-retentions", "0.4", "--no-progress"],
        cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    log = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    assert [r["phase"] for r in log].count("rl") >= 3  # 6 clips, batches of 2, one epoch
    assert (run / "results.md").read_text().startswith("Results on the test split")
    assert (run / "checkpoints" / "latest").is_file()


@pytest.mark.parametrize("change,match", [
    (dict(modality=torch.tensor([2, 0, -1, 2])), r"no padding\), got \[-1, 0, 2\]"),
    (dict(modality=torch.tensor([0, 0, 1, 1])), "has no text token"),
    (dict(modality=torch.tensor([2, 0, 1])), r"must be an int tensor \[4\], got \[3\]"),
    (dict(position_ids=torch.zeros(3, 5, dtype=torch.long)),
     r"position_ids for clip 'c' must be an int tensor \[..., 4\], got \[3, 5\]"),
    (dict(inputs_embeds=torch.zeros(4, 7)), r"must be a float tensor \[L, 8\], got \[4, 7\]"),
])
def test_add_merged_refuses_bad_clips_before_writing(tmp_path, change, match):
    args = dict(inputs_embeds=torch.zeros(4, 8), modality=torch.tensor([2, 0, 1, 2]),
                position_ids=torch.zeros(3, 4, dtype=torch.long))
    args.update(change)
    writer = CacheWriter(tmp_path / "cache", dim=8)
    with pytest.raises(ValueError, match=match):
        writer.add_merged("c", "train", args["inputs_embeds"], args["modality"],
                          args["position_ids"], refs_av=["a b"])
    writer.abort()
    assert not (tmp_path / "cache").exists()
