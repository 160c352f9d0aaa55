"""python -m avex.data export that a user can trust (issue 34): nothing lost (overwrite,
the lock, temporary folders), nothing silently wrong (the resume identity holds the weights,
the cache records its tokenizer and training checks it), Ctrl-C at a clip boundary, clips
without references, and every family the adapters cover exported or refused with the reason.
Media and models are the example's tiny ones (examples/train_once_prune_anywhere.py)."""
import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from avex.data import FeatureCache
from avex.data.export import ExportError, ExportInterrupted, export_cache
from avex.data.parts import ExportLock, partial_dir
from file_module import load_file

pytest.importorskip("av", reason="the export reads media with PyAV (the media extra)")
pytest.importorskip("soundfile", reason="the export reads audio with soundfile (the media "
                                        "extra)")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_once_prune_anywhere.py"


def example():
    return load_file(EXAMPLE)


EX = example()


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Media (videos with audio, a WAV, a PNG, captions.jsonl), and per family the tiny
    model saved with its processor, built once."""
    root = tmp_path_factory.mktemp("export")
    captions = EX.write_media(root / "media", "qwen2_5_omni")
    models = {}

    def model(family):
        if family not in models:
            built = EX.build_model(family)
            models[family] = (built, EX.save_model(built, EX.build_processor(family),
                                                   root / family))
        return models[family]
    return root / "media", captions, model


def rows_file(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


VL_ROWS = [{"file": "clip0.mp4", "captions": ["a dog barks"], "split": "train"},
           {"file": "clip1.mp4", "captions": ["a cat meows"], "split": "test"},
           {"file": "still.png", "captions": ["a man speaks"], "split": "train"}]


def export_vl(made, tmp_path, out, **kwargs):
    media, _, model = made
    built, folder = model("qwen2_5_vl")
    from avex.data.processor import load_processor
    return export_cache(media, rows_file(tmp_path / "rows.jsonl", VL_ROWS), out, model=built,
                        processor=load_processor(folder, built), progress=False, **kwargs)


# --- nothing lost ------------------------------------------------------------------------------

def test_overwrite_replaces_a_cache_and_nothing_else(made, tmp_path, monkeypatch):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "plan.txt").write_text("mine")
    with pytest.raises(ExportError, match=r"out: '.*notes' exists and is not a feature cache"):
        export_vl(made, tmp_path, notes, overwrite=True)
    monkeypatch.chdir(notes)
    with pytest.raises(ExportError, match=r"out: cache directory '\.' is the working directory"):
        export_vl(made, tmp_path, Path("."), overwrite=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(notes))
    with pytest.raises(ExportError, match=r"is the home directory or holds it"):
        export_vl(made, tmp_path, notes, overwrite=True)
    media = made[0]
    with pytest.raises(ExportError, match=r"out: '.*' holds the media folder"):
        export_vl(made, tmp_path, media.parent, overwrite=True)
    assert [p.name for p in notes.iterdir()] == ["plan.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "rows.jsonl"]

    export_vl(made, tmp_path, tmp_path / "cache")
    first = FeatureCache(tmp_path / "cache").meta.shards
    export_vl(made, tmp_path, tmp_path / "cache", overwrite=True)   # a cache is replaced
    assert FeatureCache(tmp_path / "cache", verify="hash").meta.shards == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "notes", "rows.jsonl"]


def test_a_second_export_into_the_same_out_is_refused_at_once(made, tmp_path):
    held = ExportLock(partial_dir(tmp_path / "cache"))
    assert held.acquire()
    try:
        started = time.perf_counter()
        with pytest.raises(ExportError, match=r"another export is writing .*cache \(it holds "
                                              r"the lock on .*\.cache\.export\)"):
            export_vl(made, tmp_path, tmp_path / "cache")
        assert time.perf_counter() - started < 5
        assert not list((partial_dir(tmp_path / "cache")).iterdir())   # it wrote nothing
    finally:
        held.release()


def interrupt_after(monkeypatch, clips):
    """Ctrl-C (SIGINT to this process) while the ``clips``-th clip is being exported."""
    from avex.data import export as export_module

    real, seen = export_module._export_clip, []

    def export_clip(*args):
        seen.append(args[2].clip_id)
        if len(seen) == clips:
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args)

    monkeypatch.setattr(export_module, "_export_clip", export_clip)
    return seen


def test_resume_refuses_other_weights_and_cleans_what_dead_runs_left(made, tmp_path,
                                                                     monkeypatch):
    """Ctrl-C stops at the clip boundary (the clip under way is finished and kept); a resume
    with changed weights is refused naming weights_sha256 (the clips of two models never
    mix); temporary folders of runs that died are removed by the next run."""
    out = tmp_path / "cache"
    seen = interrupt_after(monkeypatch, 1)
    with pytest.raises(ExportInterrupted, match=r"stopped after 1 of 3 clips \(kept\); resume "
                                                r"with: call export_cache again"):
        export_vl(made, tmp_path, out)
    monkeypatch.undo()
    assert seen == ["clip0.mp4"]
    assert [p.name for p in (partial_dir(out) / "clips").iterdir()] == ["clip0.mp4.safetensors"]

    built, folder = made[2]("qwen2_5_vl")
    kept = built.lm_head.weight[5, 0].item()
    with torch.no_grad():
        built.lm_head.weight[5, 0] += 1.0
    try:
        with pytest.raises(ExportError, match=r"unfinished export with another model or other "
                                              r"settings \(they differ in \['weights_sha256'\]"):
            export_vl(made, tmp_path, out)
    finally:
        with torch.no_grad():
            built.lm_head.weight[5, 0] = kept

    (tmp_path / ".cache.tmp-999999" / "shards").mkdir(parents=True)      # a killed merge
    (partial_dir(out) / "clips" / ".clip1.mp4.safetensors.tmp-999999").write_bytes(b"half")
    (partial_dir(out) / "parts" / "rank-3").mkdir(parents=True)
    export_vl(made, tmp_path, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "rows.jsonl"]
    assert FeatureCache(out).clip_ids == ["clip0.mp4", "still.png", "clip1.mp4"]


def test_the_cli_stops_at_a_clip_boundary_with_130_and_the_resume_command(made, tmp_path,
                                                                           monkeypatch, capsys):
    from avex.data.__main__ import main as data_main

    media, captions, model = made
    _, folder = model("qwen2_5_vl")
    rows = rows_file(tmp_path / "rows.jsonl", VL_ROWS)
    argv = ["export", "--media", str(media), "--captions", str(rows), "--model", str(folder),
            "--out", str(tmp_path / "cache"), "--no-progress", "--device", "cpu"]
    interrupt_after(monkeypatch, 2)
    assert data_main(argv) == 130
    err = capsys.readouterr().err
    assert "export stopped after 2 of 3 clips; the clips done are kept in " in err
    assert f"resume with: python -m avex.data export --media {media}" in err
    assert err.count("resume with:") == 1   # the command once, not the exception's copy too
    assert "Loading weights" not in err   # --no-progress: transformers' bar too
    monkeypatch.undo()
    assert data_main(argv) == 0
    out = capsys.readouterr().out
    assert "resuming the export" in out and "2 of 3 clips done" in out
    assert len(FeatureCache(tmp_path / "cache", verify="hash")) == 3


# --- the tokenizer the cache records, checked against the captioner ---------------------------

def test_training_refuses_a_captioner_whose_tokenizer_differs_from_the_caches(made, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from avex.cache_and_captioner import load_cache_and_captioner

    out = export_vl(made, tmp_path, tmp_path / "cache")
    recorded = FeatureCache(out).meta.source["tokenizer"]
    built, folder = made[2]("qwen2_5_vl")
    load_cache_and_captioner(out, folder, device="cpu")   # the model's own: accepted

    # the same words at other ids: the references round-trip, the ids are wrong
    vocab = dict(EX.build_tokenizer("qwen2_5_vl").get_vocab())
    words = [w for w in EX.WORDS if w in vocab]
    ids = [vocab[w] for w in words]
    vocab.update(zip(words, reversed(ids)))
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    other = tmp_path / "other"
    other.mkdir()
    for name in ("config.json", "model.safetensors"):
        (other / name).symlink_to(folder / name)
    PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>",
                            eos_token="<eos>").save_pretrained(str(other / "tokenizer"))
    with pytest.raises(ValueError, match=rf"the cache .* records {recorded['class']} sha256 "
                                         rf"{recorded['sha256'][:16]}\.\.\. .* the captioner "
                                         rf"{other} has (PreTrainedTokenizerFast|"
                                         rf"TokenizersBackend) sha256"):
        load_cache_and_captioner(out, other, device="cpu")


# --- label-free clips --------------------------------------------------------------------------

def test_a_media_folder_without_captions_exports_clips_without_references(made, tmp_path,
                                                                          capsys):
    from avex.data.__main__ import main as data_main

    media, _, model = made
    _, folder = model("qwen2_5_vl")
    only = tmp_path / "media"
    only.mkdir()
    for name in ("clip0.mp4", "still.png"):
        (only / name).symlink_to(media / name)
    assert data_main(["export", "--media", str(only), "--model", str(folder), "--out",
                      str(tmp_path / "cache"), "--no-progress", "--device", "cpu"]) == 0
    assert "0 with reference captions" in capsys.readouterr().out
    cache = FeatureCache(tmp_path / "cache")
    assert cache.clip_ids == ["clip0.mp4", "still.png"]
    assert all(r["refs_av"] == [] and r["split"] == "train" for r in cache.rows)

    rows = [{"file": "clip0.mp4", "split": "train"},
            {"file": "still.png", "captions": ["a man speaks"], "split": "test"}]
    built, _ = model("qwen2_5_vl")
    from avex.data.processor import load_processor
    out = export_cache(only, rows_file(tmp_path / "rows.jsonl", rows), tmp_path / "mixed",
                       model=built, processor=load_processor(folder, built), progress=False)
    assert [r["refs_av"] for r in FeatureCache(out).rows] == [[], ["a man speaks"]]


# --- every family ------------------------------------------------------------------------------

@pytest.mark.parametrize("family,files,tokens", [
    # (family, media files, (visual, audio) tokens per clip)
    ("qwen2_audio", ["clip0.mp4", "sound.wav"], [(0, 101), (0, 27)]),
    ("llava_onevision", ["clip0.mp4", "still.png"], [(32, 0), (64, 0)]),
    ("qwen2_5_omni", ["silent.mp4", "sound.wav"], [(64, 0), (0, 27)]),
])
def test_each_family_exports_its_media(made, tmp_path, family, files, tokens):
    """Qwen2-Audio takes audio files and the audio track of a video; LLaVA-OneVision video
    frames and images; the Omni thinker a video without an audio track as video alone."""
    from avex.data.processor import load_processor

    media, _, model = made
    if "silent.mp4" in files and not (media / "silent.mp4").exists():
        EX.write_video(media / "silent.mp4", 3, audio=False)
    built, folder = model(family)
    rows = [{"file": f, "captions": ["a dog barks"], "split": "train"} for f in files]
    out = export_cache(media, rows_file(tmp_path / "rows.jsonl", rows), tmp_path / "cache",
                       model=built, processor=load_processor(folder, built), progress=False)
    cache = FeatureCache(out, verify="hash")
    assert [(r["n_visual"], r["n_audio"]) for r in cache.rows] == tokens
    assert cache.meta.source["model_type"] == built.config.model_type
