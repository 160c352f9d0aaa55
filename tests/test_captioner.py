"""The frozen captioner: a tiny one trains, saves and reloads; the input layout; captioning of
full and pruned inputs; attention; any local Hugging Face causal LM loads by the same path."""
import dataclasses
import re
import json

import pytest
import torch

from avex.captioner import AVBatch, FrozenCaptioner, PRESETS, ensure_captioner, train_captioner
from avex.modality import AUDIO, PAD, TEXT, VISUAL
from avex.captioner.__main__ import main as captioner_cli
from avex.data import FeatureCache


@pytest.fixture(scope="module")
def tiny(tiny_cache_dir, tiny_benchmark, tiny_captioner):
    """The session's tiny benchmark and captioner (tests/conftest.py)."""
    return tiny_cache_dir, tiny_benchmark, tiny_captioner, FeatureCache(tiny_benchmark)


def test_trained_captioner_is_saved_and_reloads(tiny):
    root, bench, path, cache = tiny
    for name in ("config.json", "model.safetensors", "avex_projector.safetensors",
                 "avex_captioner.json", "tokenizer/tokenizer.json"):
        assert (path / name).is_file(), name
    info = json.loads((path / "avex_captioner.json").read_text())
    assert info["feature_dim"] == cache.meta.dim and info["training"]["steps"] == 150
    assert info["training"]["val_cider"] >= 0
    a = FrozenCaptioner.load(path, device="cpu")
    b = FrozenCaptioner.load(path, device="cpu")
    assert a.model.config.model_type == "qwen2"
    assert not a.model.training and not a.projector.training
    assert not any(p.requires_grad for p in list(a.model.parameters())
                   + list(a.projector.parameters()))
    assert a.feature_dim == cache.meta.dim and a.hidden_size == PRESETS["tiny"].hidden_size
    for (name, x), (_, y) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert torch.equal(x, y), name
    clips = list(cache.split("test"))
    captions = a.caption(clips)
    assert captions == b.caption(clips) and len(captions) == len(clips)
    assert all(isinstance(c, str) for c in captions)
    # the tokenizer decodes words with spaces (a reloaded word-level tokenizer without a
    # decoder glues them together)
    ids = a.tokenizer("a dog barks", add_special_tokens=False)["input_ids"]
    assert a.tokenizer.decode(ids) == "a dog barks"


def test_no_progress_silences_transformers_loading_bar_and_restores_it(tiny, capfd):
    """transformers 5.25 draws a "Loading weights" bar on every load; a load with
    progress=False (--no-progress) draws none, and leaves transformers' bars as they were."""
    from transformers.utils import logging as hf_logging

    path = tiny[2]
    assert hf_logging.is_progress_bar_enabled()
    capfd.readouterr()
    FrozenCaptioner.load(path, device="cpu", progress=False)
    assert "Loading weights" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()


def test_training_learns(tiny):
    """A few dozen steps already cut the loss well below where it started."""
    _, _, path, _ = tiny
    training = json.loads((path / "avex_captioner.json").read_text())["training"]
    assert training["initial_loss"] > 4.0  # about log(vocabulary) at random init
    assert training["final_loss"] < 0.75 * training["initial_loss"]


def test_embed_layout_is_videollama2_order(tiny):
    _, _, path, cache = tiny
    cap = FrozenCaptioner.load(path, device="cpu")
    clip = cache.split("test")[0]
    short = dataclasses.replace(clip, clip_id="short", prompt_suffix_ids=clip.prompt_suffix_ids[:3])
    batch = cap.embed([clip, short])
    lp, ls = len(clip.prompt_prefix_ids), len(clip.prompt_suffix_ids)
    expected = [TEXT] * lp + [VISUAL] * clip.n_visual + [AUDIO] * clip.n_audio + [TEXT] * ls
    assert batch.modality[0].tolist() == expected
    pad = ls - 3  # the shorter row is left-padded
    assert batch.modality[1, :pad].tolist() == [PAD] * pad
    assert batch.modality[1, pad:].tolist() == expected[:len(expected) - pad]
    assert batch.attention_mask[1].tolist() == [0] * pad + [1] * (len(expected) - pad)
    assert batch.position_ids[1, pad:].tolist() == list(range(len(expected) - pad))
    assert batch.inputs_embeds.shape == (2, len(expected), cap.hidden_size)
    assert batch.av_positions(0).tolist() == list(range(lp, lp + clip.n_visual + clip.n_audio))
    projected = cap.projector(clip.visual, VISUAL)
    assert torch.allclose(batch.inputs_embeds[0, lp:lp + clip.n_visual], projected)


def test_pruned_captioning(tiny):
    _, _, path, cache = tiny
    cap = FrozenCaptioner.load(path, device="cpu")
    clips = list(cache.split("test"))[:4]
    m = clips[0].n_visual + clips[0].n_audio
    full = cap.caption(clips)
    assert cap.caption(clips, keep=torch.ones(len(clips), m, dtype=torch.bool)) == full
    batch = cap.embed(clips)
    assert cap.caption(batch) == full
    assert cap.caption(batch, keep=batch.modality != PAD) == full  # [B, L] layout
    ragged = [torch.rand(m) < 0.3 for _ in clips]  # a list of per-clip masks
    keep = torch.stack(ragged)
    assert cap.caption(clips, keep=ragged) == cap.caption(clips, keep=keep)
    # keeping one token at its original position is not the same as keeping it elsewhere:
    # the result must match a hand-built sequence with the original position ids
    one = torch.zeros(1, m, dtype=torch.bool)
    one[0, m - 1] = True
    seq = cap.embed(clips[:1])
    idx = torch.nonzero((seq.modality[0] == TEXT) | (torch.arange(seq.modality.shape[1])
                                                        == seq.av_positions(0)[-1])).flatten()
    manual = AVBatch(seq.inputs_embeds[:, idx], seq.attention_mask[:, idx],
                     seq.modality[:, idx], seq.position_ids[:, idx], seq.clip_ids,
                     seq.av_counts)
    out = cap.model(inputs_embeds=manual.inputs_embeds, position_ids=manual.position_ids)
    first_word = cap.tokenizer.decode([int(out.logits[0, -1].argmax())])
    got = cap.caption(clips[:1], keep=one, max_new_tokens=1)[0]
    assert got == first_word.strip() or (got == "" and first_word.strip() in ("", "<|im_end|>"))


def test_caption_rejects_bad_keep(tiny):
    _, _, path, cache = tiny
    cap = FrozenCaptioner.load(path, device="cpu")
    clips = list(cache.split("test"))[:2]
    with pytest.raises(ValueError, match="keep has 3 rows but 2 clips were given"):
        cap.caption(clips, keep=torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="keep must be a bool tensor"):
        cap.caption(clips, keep=torch.ones(2, 40))
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 1, got 0"):
        cap.caption(clips, max_new_tokens=0)
    bad = dataclasses.replace(clips[0], visual=torch.zeros(4, 7))
    with pytest.raises(ValueError, match=r"clip 'test-00000': visual has shape \[4, 7\] but the "
                                         r"captioner takes features of dim"):
        cap.embed([bad])


def test_attention_and_its_cache(tiny, tmp_path):
    _, _, path, cache = tiny
    root = tmp_path  # its own cache: other modules' runs add attention files to the shared one
    cap = FrozenCaptioner.load(path, device="cpu")
    clips = list(cache.split("val"))
    att = cap.text_to_av_attention(clips)
    m = clips[0].n_visual + clips[0].n_audio
    assert len(att) == len(clips) and all(a.shape == (m,) for a in att)
    assert all(bool((a >= 0).all()) and float(a.sum()) <= 1.0 + 1e-5 for a in att)
    last = cap.text_to_av_attention(clips, query="last")
    assert not torch.allclose(att[0], last[0])
    assert cap.model.config._attn_implementation != "eager"  # restored after the pass
    stored = cap.cached_text_to_av_attention(cache, "val", cache_dir=root)
    files = list((root / "attention").glob("*.safetensors"))
    assert len(files) == 1
    assert all(torch.allclose(stored[c.clip_id], a, atol=1e-6) for c, a in zip(clips, att))
    stamp = files[0].stat().st_mtime_ns
    again = cap.cached_text_to_av_attention(cache, "val", cache_dir=root)
    assert files[0].stat().st_mtime_ns == stamp  # read back, not recomputed
    assert all(torch.equal(again[k], stored[k]) for k in stored)


def test_any_local_hf_causal_lm_loads(tmp_path, tiny):
    """A plain HF model directory (no avex files) captions LM-space features directly."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from avex.data.embedded import build_tokenizer

    _, _, _, cache = tiny
    tokenizer = build_tokenizer()
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=cache.meta.dim,
                         intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, max_position_embeddings=128,
                         eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    model_dir = tmp_path / "plain-lm"
    Qwen2ForCausalLM(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir / "tokenizer")
    cap = FrozenCaptioner.load(model_dir, device="cpu")
    assert cap.projector.kind == "identity" and cap.feature_dim == cache.meta.dim
    clips = list(cache.split("test"))[:2]
    assert len(cap.caption(clips, max_new_tokens=3)) == 2
    with pytest.raises(ValueError, match=r"feature_dim=99 but the captioner at .* takes "
                                         r"features of dim 32"):
        FrozenCaptioner.load(model_dir, device="cpu", feature_dim=99)
    with pytest.raises(FileNotFoundError, match="is not a Hugging Face model directory"):
        FrozenCaptioner.load(tmp_path, device="cpu")


def test_ensure_and_cli(tiny, capsys, monkeypatch):
    root, bench, path, _ = tiny
    monkeypatch.setenv("AVEX_CACHE", str(root))
    assert ensure_captioner("tiny", "tiny", cache_dir=root, progress=False) == path
    assert captioner_cli(["train", "--preset", "tiny", "--benchmark-preset", "tiny"]) == 0
    assert "already trained" in capsys.readouterr().out
    assert captioner_cli(["caption", "--captioner", str(path), "--data", str(bench), "-n", "2",
                          "--retention", "0.5"]) == 0
    assert capsys.readouterr().out.count("reference:") == 2
    with pytest.raises(FileNotFoundError, match=r"no embedded captioner at .*; train it with"):
        FrozenCaptioner.load(None)
    bad = dataclasses.replace(PRESETS["tiny"], hidden_size=30, num_heads=4)
    with pytest.raises(ValueError, match=r"hidden_size \(30\) must divide by num_heads"):
        train_captioner(bench, root / "bad", bad, progress=False)


def test_spearman_helper():
    from avex.evaluate.gates import rank_average, spearman

    assert rank_average([3.0, 1.0, 1.0, 2.0]).tolist() == [3.0, 0.5, 0.5, 2.0]
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 1], [1, 2, 3]) != spearman([1, 1, 1], [1, 2, 3])  # NaN: constant


@pytest.mark.slow
def test_gates_run_on_the_tiny_benchmark(tiny, tmp_path):
    from avex.evaluate.gates import run_gates
    from avex.evaluate.gates_report import write_report

    _, bench, path, cache = tiny
    report = run_gates(bench, path, seeds=1, retentions=(0.5, 0.1), counterfactual_clips=2,
                       base_sets=1, progress=False)
    assert set(report["random_sweep"]) == {"0.5", "0.1"}
    assert {"C_av", "C_v", "C_a", "BLEU-4", "METEOR"} <= set(report["full"])
    assert report["full"]["C_av"] > 0
    assert report["transfer_clips"] == len(cache.split("transfer"))
    assert report["gate_random_lowest_share"] == pytest.approx(
        report["random_sweep"]["0.1"]["C_av"] / report["full"]["C_av"])
    assert report["run"]["settings"]["counterfactual_clips"] == 2
    out = write_report(report, tmp_path / "gates.md", "python -m avex.evaluate gates")
    text = out.read_text()
    assert "## Random pruning (test split)" in text and "**Gate:**" in text
    from avex.metrics import cider_source   # the header names where this machine's CIDEr is from
    assert report["run"]["cider_source"] == cider_source()
    assert f"come from {cider_source()} (PTB tokenizer)" in text
    assert json.loads(out.with_suffix(".json").read_text())["test_clips"] == len(
        cache.split("test"))


def test_the_tiny_preset_captioner_captions_its_validation_clips(tiny_captioner):
    """The tiny captioner is built by its preset alone (tests/conftest.py, as python -m
    avex.train --captioner-preset tiny builds it), and it writes words its references share:
    the preset's 4 steps once gave CIDEr 0 and an RL run whose every reward was 0."""
    from avex.captioner.train import PRESETS

    record = json.loads((tiny_captioner / "avex_captioner.json").read_text())["training"]
    assert record["steps"] == PRESETS["tiny"].steps and record["lr"] == PRESETS["tiny"].lr
    assert record["val_cider"] > 5


def another_worlds_captioner(path, tmp_path, **config):
    """A copy of the captioner at ``path`` whose record says it was trained on the embedded
    benchmark made with ``config`` changed."""
    import shutil

    copy = tmp_path / "captioner"
    shutil.copytree(path, copy)
    info = json.loads((copy / "avex_captioner.json").read_text())
    info["benchmark"]["source"]["config"].update(config)
    (copy / "avex_captioner.json").write_text(json.dumps(info))
    return copy


def test_a_captioner_of_another_embedded_benchmark_is_refused(tiny, tmp_path, capsys):
    from avex.cache_and_captioner import check_captioner_benchmark, load_cache_and_captioner
    from avex.evaluate.__main__ import cli as evaluate_cli
    from avex.train import main as train_main

    root, bench, path, cache = tiny
    source = cache.meta.source
    check_captioner_benchmark(source, path, bench)            # its own benchmark
    seed = source["config"]["seed"]
    other = another_worlds_captioner(path, tmp_path, seed=seed + 1)
    match = (rf"captioner: {other} was trained on the embedded benchmark '{bench.name}', and "
             rf"the feature cache {bench} was generated with other settings \(seed {seed + 1} "
             rf"against {seed}: .*install --seed {seed}` for a shipped one\)")
    with pytest.raises(ValueError, match=match):
        check_captioner_benchmark(source, other, bench)
    with pytest.raises(ValueError, match=match):          # the Python API, before the model
        load_cache_and_captioner(bench, other)
    # the command lines: a usage error, before any folder is made
    for main, argv in ((evaluate_cli, ["sweep", "--methods", "random",
                                       "--out", str(tmp_path / "sweep")]),
                       (train_main, ["--run-dir", str(tmp_path / "run")])):
        with pytest.raises(SystemExit) as stop:
            main(argv + ["--data", str(bench), "--captioner", str(other)])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and re.search(match, err) and "Traceback" not in err, err
    assert not (tmp_path / "sweep").exists() and not (tmp_path / "run").exists()


def test_a_captioner_of_another_build_of_the_same_benchmark_passes(tiny, tmp_path):
    """The 200- and 1000-clip builds of one seed are one world: only the split sizes differ."""
    from avex.cache_and_captioner import check_captioner_benchmark

    root, bench, path, cache = tiny
    sizes = {k: cache.meta.source["config"][k] * 5 for k in ("test", "val")}
    check_captioner_benchmark(cache.meta.source, another_worlds_captioner(path, tmp_path, **sizes),
                              bench)
    # a captioner without the record (your own model) and an exported cache are not checked
    plain = tmp_path / "plain"
    plain.mkdir()
    check_captioner_benchmark(cache.meta.source, plain, bench)
    check_captioner_benchmark({"kind": "export"}, another_worlds_captioner(
        path, tmp_path / "x", seed=99), bench)


def _usage_error(argv, capsys, match):
    with pytest.raises(SystemExit) as stop:
        captioner_cli(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and re.search(match, err) and "Traceback" not in err, err


def test_captioner_train_never_deletes_a_folder_of_the_users(tiny, tmp_path, capsys,
                                                               monkeypatch):
    """Saving replaces the whole --out folder, so one holding other files (the current folder
    too) or a link is refused before training; the files are all still there."""
    root, bench, path, cache = tiny
    mine = tmp_path / "mine"
    (mine / "sub").mkdir(parents=True)
    (mine / "thesis.tex").write_text("important")
    (mine / "sub" / "data.csv").write_text("x")
    args = ["train", "--preset", "tiny", "--data", str(bench), "--no-progress"]
    for out in (str(mine), "."):
        monkeypatch.chdir(mine if out == "." else tmp_path)
        for extra in ([], ["--overwrite"]):
            _usage_error(args + ["--out", out, *extra], capsys,
                         "holds files that are not a captioner")
    (tmp_path / "link").symlink_to(path)
    _usage_error(args + ["--out", str(tmp_path / "link"), "--overwrite"], capsys,
                 "is a symbolic link")
    assert sorted(p.relative_to(mine).as_posix() for p in mine.rglob("*")) == [
        "sub", "sub/data.csv", "thesis.tex"]
    assert (tmp_path / "link").is_symlink() and (path / "avex_captioner.json").is_file()


def test_already_trained_is_said_only_of_the_same_training(tiny, tmp_path, capsys):
    """A captioner at --out trained on another benchmark, or with other settings, is not
    reported as already trained: refused, naming what differs."""
    root, bench, path, cache = tiny
    other = another_worlds_captioner(path, tmp_path, seed=cache.meta.source["config"]["seed"] + 1)
    base = ["train", "--preset", "tiny", "--data", str(bench), "--no-progress", "--out"]
    _usage_error(base + [str(other)], capsys, r"was trained otherwise: the benchmark")
    assert captioner_cli(base + [str(path)]) == 0
    assert "already trained" in capsys.readouterr().out
    _usage_error(base + [str(path), "--steps", "7"], capsys,
                 r"training settings steps=150 \(asked 7\)")


def test_caption_refuses_a_captioner_of_another_benchmark(tiny, tmp_path, capsys):
    root, bench, path, cache = tiny
    other = another_worlds_captioner(path, tmp_path, seed=cache.meta.source["config"]["seed"] + 1)
    _usage_error(["caption", "--captioner", str(other), "--data", str(bench), "-n", "1"], capsys,
                 "--captioner: .* was trained on the embedded benchmark")


def test_caption_names_a_captioner_folder_without_weights(tiny, tmp_path, capsys):
    root, bench, path, cache = tiny
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((path / "config.json").read_text())
    _usage_error(["caption", "--captioner", str(bare), "--data", str(bench), "-n", "1"], capsys,
                 r"--captioner: '.*bare' could not be loaded as a model \(OSError")


def test_captioner_train_with_no_progress_draws_no_bar(tiny, tmp_path, capfd):
    """transformers draws "Writing model shards" on save and "Loading weights" on load: with
    --no-progress neither appears."""
    root, bench, path, cache = tiny
    assert captioner_cli(["train", "--preset", "tiny", "--data", str(bench), "--steps", "3",
                          "--no-progress", "--out", str(tmp_path / "cap")]) == 0
    err = capfd.readouterr().err
    assert (tmp_path / "cap" / "avex_captioner.json").is_file()
    assert "Writing model shards" not in err and "Loading weights" not in err, err


def test_caption_without_captioner_uses_the_benchmarks_own(tiny, tmp_path, capsys, monkeypatch):
    """Without --captioner, caption takes the captioner built for --data's benchmark, not
    benchmark 0's default; where only another benchmark's default is built, it is refused by
    name instead of captioning this benchmark's clips with it."""
    import shutil

    root, bench, path, cache = tiny
    cache_root = tmp_path / "cache"
    monkeypatch.setenv("AVEX_CACHE", str(cache_root))
    shutil.copytree(path, cache_root / "captioners" / f"{bench.name}-tiny")
    args = ["caption", "--data", str(bench), "-n", "1"]
    assert captioner_cli(args) == 0
    assert "reference:" in capsys.readouterr().out
    shutil.rmtree(cache_root / "captioners" / f"{bench.name}-tiny")
    seed = cache.meta.source["config"]["seed"]
    other = another_worlds_captioner(path, tmp_path, seed=seed + 1)
    shutil.move(other, cache_root / "captioners" / "embedded-default-seed0-default")
    _usage_error(args, capsys, r"--captioner: .*embedded-default-seed0-default was trained on "
                               r"the embedded benchmark")
