"""python -m avex.data export on what users hand it: each bad input is refused with a usage
error naming the flag and the value, before the model loads and before anything is written
(a linked --out, a folder that isn't a cache, corrupt weights, a missing --processor, a file
name that isn't UTF-8, a captions file that isn't UTF-8, a file in two splits, a label-free
--split nothing could use); what a label-free export passes over is named; a resume doesn't
depend on how --model is spelt; tiny images and long audio are taken as they are, while audio
too short for one audio token and images or video frames more elongated than the Qwen resize
takes are refused from their headers. Media and models are the example's tiny ones
(examples/train_once_prune_anywhere.py)."""
import json
import os
from pathlib import Path

import numpy as np
import pytest

from avex.data import FeatureCache
from avex.data.captions import ExportError, read_captions
from avex.data.export import export_cache
from file_module import load_file

pytest.importorskip("av", reason="the export reads media with PyAV (the media extra)")
pytest.importorskip("soundfile", reason="the export reads audio with soundfile (the media "
                                        "extra)")

EX = load_file(Path(__file__).resolve().parents[1] / "examples" / "train_once_prune_anywhere.py")


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The example's media (videos with audio, a WAV, a PNG), and per family the tiny model
    saved with its processor, built once."""
    root = tmp_path_factory.mktemp("user-input")
    EX.write_media(root / "media", "qwen2_5_omni")
    models = {}

    def model(family):
        if family not in models:
            built = EX.build_model(family)
            models[family] = (built, EX.save_model(built, EX.build_processor(family),
                                                   root / family))
        return models[family]
    return root / "media", model


@pytest.fixture
def no_model_load(monkeypatch):
    """The CLI's model load fails the test: what is checked must be checked before it."""
    from avex.data import __main__ as cli

    def load_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the inputs were checked")
    monkeypatch.setattr(cli, "load_model", load_model)


def cli(*argv):
    from avex.data.__main__ import main as data_main
    return data_main(["export", *argv, "--no-progress", "--device", "cpu"])


def usage_error(capsys, *argv) -> str:
    """The CLI's usage error (status 2) for ``argv``: its message, checked free of a
    traceback."""
    with pytest.raises(SystemExit) as stopped:
        cli(*argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def clips_folder(tmp_path, media, *names) -> Path:
    folder = tmp_path / "clips"
    folder.mkdir()
    for name in names:
        (folder / name).symlink_to(media / name)
    return folder


def rows_file(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# --- the output ------------------------------------------------------------------------------

def test_a_linked_out_is_refused_before_the_model_loads_and_the_link_kept(made, tmp_path,
                                                                         capsys, no_model_load):
    media, model = made
    _, folder = model("qwen2_5_vl")
    clips = clips_folder(tmp_path, media, "clip0.mp4")
    target = tmp_path / "real"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    for extra in ([], ["--overwrite"]):
        err = usage_error(capsys, "--media", str(clips), "--model", str(folder), "--out",
                          str(tmp_path / "link"), *extra)
        assert f"--out: '{tmp_path / 'link'}' is a symbolic link (to '{target}')" in err
        assert f"pass the folder it points to ({target}) instead" in err
    assert (tmp_path / "link").is_symlink() and list(target.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clips", "link", "real"]

    built, _ = model("qwen2_5_vl")
    from avex.data.processor import load_processor
    with pytest.raises(ExportError, match=r"^out: '.*link' is a symbolic link"):
        export_cache(clips, None, tmp_path / "link", model=built,
                     processor=load_processor(folder, built), progress=False, overwrite=True)
    assert (tmp_path / "link").is_symlink()


def test_the_output_and_headers_are_checked_before_the_model_loads(made, tmp_path, capsys,
                                                                    no_model_load):
    media, model = made
    _, folder = model("qwen2_5_vl")
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "plan.txt").write_text("mine")
    clips = clips_folder(tmp_path, media, "clip0.mp4")
    err = usage_error(capsys, "--media", str(clips), "--model", str(folder), "--out", str(notes))
    assert f"--out: '{notes}' exists and is not a feature cache" in err
    err = usage_error(capsys, "--media", str(clips), "--model", str(folder), "--out",
                      str(folder.parent))
    assert "--out: " in err and "holds the model" in err

    (clips / "broken.mp4").write_bytes(b"not a video at all" * 10)
    err = usage_error(capsys, "--media", str(clips), "--model", str(folder), "--out",
                      str(tmp_path / "cache"))
    assert "broken.mp4: unreadable video" in err
    (clips / "broken.mp4").unlink()
    (clips / "sound.wav").symlink_to(media / "sound.wav")
    err = usage_error(capsys, "--media", str(clips), "--model", str(folder), "--out",
                      str(tmp_path / "cache"))
    assert "sound.wav (media file sound.wav): qwen2_5_vl takes no audio" in err

    (clips / "sound.wav").unlink()
    err = usage_error(capsys, "--media", str(clips), "--model", str(folder), "--processor",
                      "/nonexistent", "--out", str(tmp_path / "cache"))
    assert "--processor: no folder at '/nonexistent'" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clips", "notes"]
    assert [p.name for p in notes.iterdir()] == ["plan.txt"]


def test_an_existing_cache_names_the_overwrite_flag(made, tmp_path, capsys):
    media, model = made
    _, folder = model("qwen2_5_vl")
    clips = clips_folder(tmp_path, media, "still.png")
    argv = ["--media", str(clips), "--model", str(folder), "--out", str(tmp_path / "cache")]
    assert cli(*argv) == 0
    capsys.readouterr()
    err = usage_error(capsys, *argv)
    assert "--out: cache directory" in err and "pass --overwrite to replace it" in err
    assert "overwrite=True" not in err


def test_corrupt_weights_are_a_usage_error_naming_the_model(made, tmp_path, capsys):
    media, model = made
    _, folder = model("qwen2_5_vl")
    broken = tmp_path / "broken-model"
    broken.mkdir()
    for file in folder.iterdir():
        if file.is_file():
            (broken / file.name).write_bytes(file.read_bytes())
    whole = (folder / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(whole[:len(whole) // 3])
    clips = clips_folder(tmp_path, media, "still.png")
    err = usage_error(capsys, "--media", str(clips), "--model", str(broken), "--out",
                      str(tmp_path / "cache"))
    assert f"--model: can't load the model in '{broken}' (SafetensorError: " in err
    assert not (tmp_path / "cache").exists()


# --- the clips -------------------------------------------------------------------------------

def test_a_file_name_that_is_not_utf8_is_refused_before_anything_is_written(made, tmp_path,
                                                                            capsys,
                                                                            no_model_load):
    media, model = made
    _, folder = model("qwen2_5_vl")
    clips = clips_folder(tmp_path, media, "clip0.mp4")
    (clips / os.fsdecode(b"caf\xe9.mp4")).symlink_to(media / "clip1.mp4")
    err = usage_error(capsys, "--media", str(clips), "--model", str(folder), "--out",
                      str(tmp_path / "cache"))
    assert r"b'caf\xe9.mp4'" in err and "not valid UTF-8" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clips"]


def test_a_label_free_export_names_what_it_passes_over(made, tmp_path, capsys):
    from avex.data.export import read_rows

    media, _ = made
    clips = clips_folder(tmp_path, media, "clip0.mp4")
    (clips / "old.mpg").write_bytes(b"mpeg")
    (clips / "broadcast.ts").write_bytes(b"ts")
    (clips / "notes.txt").write_text("mine")
    (clips / "meta.json").write_text("{}")
    (clips / ".hidden.mp4").write_bytes(b"")
    more = tmp_path / "more"
    more.mkdir()
    (more / "clip1.mp4").symlink_to(media / "clip1.mp4")
    (clips / "linked").symlink_to(more)
    rows = read_rows(clips, None)
    assert [r.name for r in rows] == ["clip0.mp4"]
    err = capsys.readouterr().err
    assert "note: 3 entries under" in err
    for shown in ("old.mpg (type '.mpg' is not read)", "broadcast.ts (type '.ts' is not read)",
                  "linked/ (a linked folder, not followed)"):
        assert shown in err
    assert "notes.txt" not in err and "meta.json" not in err and "hidden" not in err

    (clips / "gone.mp4").symlink_to(tmp_path / "nowhere.mp4")
    with pytest.raises(ExportError, match=rf"media: 1 link\(s\) under .* point to nothing: "
                                          rf"gone.mp4 -> {tmp_path / 'nowhere.mp4'}"):
        read_rows(clips, None)


def test_a_label_free_split_nothing_could_use_is_refused_naming_split(made, tmp_path, capsys,
                                                                     no_model_load):
    media, model = made
    _, folder = model("qwen2_5_vl")
    clips = clips_folder(tmp_path, media, "clip0.mp4")
    err = usage_error(capsys, "--media", str(clips), "--model", str(folder), "--out",
                      str(tmp_path / "cache"), "--split", "test")
    assert "--split: a label-free export (no captions file) makes 'train' clips, got 'test'" \
        in err
    assert "list them in a captions file" in err
    rows = rows_file(tmp_path / "rows.jsonl", [{"file": "clip0.mp4", "split": "train"}])
    err = usage_error(capsys, "--media", str(clips), "--captions", str(rows), "--model",
                      str(folder), "--out", str(tmp_path / "cache"), "--split", "test")
    assert "--split: 'test' is for a label-free export (no --captions)" in err


def test_a_file_in_two_splits_is_refused_naming_both_lines(made, tmp_path):
    media, _ = made
    clips = clips_folder(tmp_path, media, "clip0.mp4", "clip1.mp4")
    (clips / "alias.mp4").symlink_to(clips / "clip0.mp4")
    train = {"file": "clip0.mp4", "captions": ["a dog barks"], "split": "train"}
    for other in ({"file": "./clip0.mp4", "split": "test"},
                  {"file": "clip0.mp4", "id": "again", "split": "val"},
                  {"file": "alias.mp4", "split": "test"}):
        with pytest.raises(ExportError, match=r"line 2 \(.*\) and line 1 \('clip0.mp4', split "
                                              r"'train'\) are the same media file .*clip0.mp4"):
            read_captions(rows_file(tmp_path / "rows.jsonl", [train, other]), clips)
    same_split = [train, {"file": "alias.mp4", "split": "train"}]   # a copy in one split: kept
    assert len(read_captions(rows_file(tmp_path / "rows.jsonl", same_split), clips)) == 2


def test_a_captions_file_that_is_not_utf8_names_the_line(made, tmp_path, capsys,
                                                         no_model_load):
    media, model = made
    _, folder = model("qwen2_5_vl")
    clips = clips_folder(tmp_path, media, "clip0.mp4", "clip1.mp4")
    rows = tmp_path / "rows.jsonl"
    rows.write_bytes(b'{"file": "clip0.mp4", "split": "train"}\n'
                     b'{"file": "clip1.mp4", "captions": ["un caf\xe9"], "split": "test"}\n')
    err = usage_error(capsys, "--media", str(clips), "--captions", str(rows), "--model",
                      str(folder), "--out", str(tmp_path / "cache"))
    assert f"--captions: {rows} line 2 is not UTF-8 text (byte 0xe9 at column" in err

    text = '{"file": "clip0.mp4", "captions": ["un café"], "split": "train"}\n'
    rows.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))   # a byte order mark: accepted
    assert read_captions(rows, clips)[0].captions == ["un café"]


def test_null_captions_are_named_as_null(made, tmp_path):
    media, _ = made
    clips = clips_folder(tmp_path, media, "clip0.mp4")
    rows = rows_file(tmp_path / "rows.jsonl",
                     [{"file": "clip0.mp4", "captions": None, "split": "train"}])
    with pytest.raises(ExportError, match=r"line 1: 'captions' is null; leave the field out"):
        read_captions(rows, clips)


# --- resuming, and what the processor is handed ------------------------------------------------

def test_a_resume_does_not_depend_on_how_the_model_is_spelt(made, tmp_path, capsys,
                                                           monkeypatch):
    from avex.data import export as export_module

    media, model = made
    _, folder = model("qwen2_5_vl")
    clips = clips_folder(tmp_path, media, "clip0.mp4", "still.png")
    real = export_module._export_clip

    def stop_after_one(*args):
        os.kill(os.getpid(), __import__("signal").SIGINT)
        return real(*args)

    monkeypatch.setattr(export_module, "_export_clip", stop_after_one)
    out = ["--out", str(tmp_path / "cache")]
    assert cli("--media", str(clips), "--model", f"{folder}/", *out) == 130
    monkeypatch.undo()
    monkeypatch.chdir(folder.parent)
    assert cli("--media", str(clips), "--model", folder.name, *out) == 0
    assert "1 of 2 clips done" in capsys.readouterr().out
    assert len(FeatureCache(tmp_path / "cache", verify="hash")) == 2


def test_an_image_a_pixel_tall_is_read_as_rows_of_pixels(made, tmp_path):
    from PIL import Image

    from avex.data.processor import load_processor

    _, model = made
    built, folder = model("qwen2_5_vl")
    processor = load_processor(folder, built)
    clips = tmp_path / "clips"
    clips.mkdir()
    pixels = np.random.default_rng(0).integers(0, 255, (1, 40, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(clips / "strip.png")
    grid = processor.image_processor(images=[pixels], input_data_format="channels_last",
                                     return_tensors="pt")["image_grid_thw"][0]
    assert grid.tolist()[1] < grid.tolist()[2]   # wider than tall, as the image is
    out = export_cache(clips, None, tmp_path / "cache", model=built, processor=processor,
                       progress=False)
    merge = processor.image_processor.merge_size
    assert FeatureCache(out).rows[0]["n_visual"] == int(grid.prod()) // merge ** 2


def test_audio_longer_than_the_window_is_named(made, tmp_path, capsys):
    import soundfile

    from avex.data.processor import load_processor

    _, model = made
    built, folder = model("qwen2_audio")
    clips = tmp_path / "clips"
    clips.mkdir()
    noise = np.random.default_rng(0).standard_normal
    soundfile.write(str(clips / "long.wav"), (0.2 * noise(16000 * 8)).astype(np.float32), 16000)
    soundfile.write(str(clips / "short.wav"), (0.2 * noise(16000 * 2)).astype(np.float32),
                    16000)
    export_cache(clips, None, tmp_path / "cache", model=built,
                 processor=load_processor(folder, built), progress=False)
    err = capsys.readouterr().err
    assert "note: 1 file(s) hold more audio than the feature extractor's 6 s window " \
           "(WhisperFeatureExtractor); the model hears the first 6 s of each: long.wav (8.0 s)" \
        in err
    assert "short.wav" not in err


def test_a_file_whose_header_states_no_length_is_named(made, tmp_path, capsys, monkeypatch):
    """A header without a length (streamed WebM, say) can't show a cut file: the export names
    such files, and exports them as they decode."""
    import soundfile

    from avex.data import captions
    from avex.data.processor import load_processor

    _, model = made
    built, folder = model("qwen2_audio")
    clips = tmp_path / "clips"
    clips.mkdir()
    noise = np.random.default_rng(0).standard_normal
    for name in ("plain.wav", "streamed.wav"):
        soundfile.write(str(clips / name), (0.2 * noise(16000 * 2)).astype(np.float32), 16000)
    real = captions.probe

    def probe(path):   # the header of "streamed.wav" says nothing of its length
        header = real(path)
        return {**header, "audio_seconds": 0.0} if Path(path).name == "streamed.wav" else header

    monkeypatch.setattr(captions, "probe", probe)
    out = export_cache(clips, None, tmp_path / "cache", model=built,
                       processor=load_processor(folder, built), progress=False)
    err = capsys.readouterr().err
    assert "note: 1 file(s) state no length in their header, so a file cut short can't be told " \
           "from a whole one there; each is exported as far as it decodes: streamed.wav (audio)" \
        in err
    assert "plain.wav" not in err and len(FeatureCache(out).rows) == 2


# --- what the processor makes no tokens of: refused from the header ----------------------------

def write_wav(path: Path, samples: int, rate: int = 16000) -> Path:
    import soundfile

    noise = np.random.default_rng(0).standard_normal(samples)
    soundfile.write(str(path), (0.2 * noise).astype(np.float32), rate)
    return path


def write_mov(path: Path, width: int, height: int, audio_samples: int | None = None) -> Path:
    """A second of MPEG-4 video (8 frames of noise), with a PCM audio track of
    ``audio_samples`` at 16 kHz where given (a MOV's header states each track's length)."""
    import av

    rng = np.random.default_rng(0)
    with av.open(str(path), "w") as out:
        video = out.add_stream("mpeg4", rate=8)
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        sound = None if audio_samples is None else out.add_stream("pcm_s16le", rate=16000)
        if sound is not None:
            sound.layout = "mono"
        for _ in range(8):
            frame = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
            for packet in video.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                out.mux(packet)
        for packet in video.encode():
            out.mux(packet)
        if sound is None:
            return path
        wave = np.full((1, audio_samples), 0.3, dtype=np.float32)
        frame = av.AudioFrame.from_ndarray(wave, format="flt", layout="mono")
        frame.sample_rate, frame.pts = 16000, 0
        for packet in [*sound.encode(frame), *sound.encode()]:
            out.mux(packet)
    return path


@pytest.mark.parametrize("family", ["qwen2_audio", "qwen2_5_omni"])
def test_the_shortest_audio_is_where_the_processor_makes_its_first_token(family):
    from avex.adapters import FAMILIES
    from avex.adapters._export import shortest_audio

    processor = EX.build_processor(family)
    least = shortest_audio(FAMILIES[family], processor.feature_extractor)
    audio = processor.tokenizer.convert_tokens_to_ids(processor.audio_token)
    for samples, tokens in ((least - 1, 0), (least, 1)):
        ids = processor(text=[processor.audio_token], audio=[np.zeros(samples, np.float32)],
                        sampling_rate=16000, return_tensors="pt")["input_ids"]
        assert int((ids == audio).sum()) == tokens, samples
    assert least == 321   # hop length 160: 3 mel frames, 2 after the convolution, 1 pooled


@pytest.mark.parametrize("family", ["qwen2_audio", "qwen2_5_omni"])
def test_audio_too_short_for_one_token_is_refused_before_the_model_loads(made, tmp_path, capsys,
                                                                         no_model_load, family):
    media, model = made
    _, folder = model(family)
    clips = clips_folder(tmp_path, media, "sound.wav")
    argv = ["--media", str(clips), "--model", str(folder), "--out", str(tmp_path / "cache")]
    for name, samples, rate in (("tick.wav", 160, 16000), ("tick.wav", 441, 22050)):
        write_wav(clips / name, samples, rate)
        err = usage_error(capsys, *argv)
        assert f"{clips / name} (media file {name}): its audio lasts " in err
        assert "under the 20.06 ms (321 samples) from which " \
               f"{model(family)[0].config.model_type}'s processor makes one audio token " \
               "(WhisperFeatureExtractor, hop length 160)" in err
    assert "lasts 20.0 ms as its header says (320 samples at 16000 Hz)" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clips"]
    (clips / "tick.wav").unlink()
    write_mov(clips / "quiet.mov", 16, 16, audio_samples=160)   # its track: 10 ms
    err = usage_error(capsys, *argv)
    omni = family == "qwen2_5_omni"
    track = "its audio track (heard with the video)" if omni else "its audio track"
    assert f"{clips / 'quiet.mov'} (media file quiet.mov): {track} lasts 10.0 ms as its " \
           "header says (160 samples at 16000 Hz)" in err
    assert ("or export without use_audio_in_video" in err) == omni
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clips"]
    if omni:
        with pytest.raises(AssertionError, match="the model was loaded"):   # the track unheard
            cli(*argv, "--no-use-audio-in-video")


def test_audio_too_short_for_one_token_is_refused_before_export_cache_writes(made, tmp_path):
    from avex.data.processor import load_processor

    media, model = made
    built, folder = model("qwen2_audio")
    clips = clips_folder(tmp_path, media, "sound.wav")
    write_wav(clips / "tiny.wav", 160)
    with pytest.raises(ExportError, match=r"tiny.wav \(media file tiny.wav\): its audio lasts "
                                          r"10.0 ms .* under the 20.06 ms \(321 samples\)"):
        export_cache(clips, None, tmp_path / "cache", model=built,
                     processor=load_processor(folder, built), progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clips"]


def test_the_aspect_ratio_limit_is_the_qwen_resizes():
    from avex.adapters import FAMILIES
    from avex.data.video import QwenVLFramesProcessor

    processor = EX.build_processor("qwen2_5_vl")
    assert FAMILIES["qwen2_5_vl"].MAX_ASPECT_RATIO == FAMILIES["qwen2_5_omni"].MAX_ASPECT_RATIO
    limit = FAMILIES["qwen2_5_vl"].MAX_ASPECT_RATIO
    frames = QwenVLFramesProcessor(patch_size=2, temporal_patch_size=2, merge_size=2)
    for width, fails in ((2 * limit, False), (2 * limit + 2, True)):
        pixels = np.zeros((2, width, 3), dtype=np.uint8)
        for process in (lambda: processor.image_processor(images=[pixels],
                                                          input_data_format="channels_last"),
                        lambda: frames(videos=[[pixels, pixels]])):
            if fails:
                with pytest.raises(ValueError, match="aspect ratio"):
                    process()
            else:
                process()


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen2_5_omni"])
def test_an_image_or_video_too_elongated_is_refused_before_the_model_loads(made, tmp_path,
                                                                          capsys, no_model_load,
                                                                          family):
    from PIL import Image

    media, model = made
    _, folder = model(family)
    clips = clips_folder(tmp_path, media, "still.png")
    argv = ["--media", str(clips), "--model", str(folder), "--out", str(tmp_path / "cache")]
    Image.fromarray(np.zeros((500, 2, 3), dtype=np.uint8)).save(clips / "strip.png")
    err = usage_error(capsys, *argv)
    name = model(family)[0].config.model_type
    assert f"{clips / 'strip.png'} (media file strip.png): the image is 2x500 pixels (width x " \
           f"height), the longer side 250 times the shorter; {name}'s processor takes at most " \
           "200 times" in err
    (clips / "strip.png").unlink()
    write_mov(clips / "band.mov", 500, 2)
    err = usage_error(capsys, *argv)
    assert f"{clips / 'band.mov'} (media file band.mov): its video frames are 500x2 pixels" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clips"]


def test_an_image_too_elongated_is_refused_before_export_cache_writes(made, tmp_path):
    from PIL import Image

    from avex.data.processor import load_processor

    media, model = made
    built, folder = model("qwen2_5_vl")
    clips = clips_folder(tmp_path, media, "still.png")
    Image.fromarray(np.zeros((2, 500, 3), dtype=np.uint8)).save(clips / "wide.png")
    with pytest.raises(ExportError, match=r"wide.png \(media file wide.png\): the image is "
                                          r"500x2 pixels .* at most 200 times"):
        export_cache(clips, None, tmp_path / "cache", model=built,
                     processor=load_processor(folder, built), progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clips"]


def test_unmeasured_streams_are_named_only_where_the_export_decodes_them(capsys):
    """A video stream without frames or seconds in its header counts for a family that sees;
    an audio stream without seconds only where the audio is read."""
    import types

    from avex.data.captions import CaptionRow, note_unmeasured

    header = {"kind": "video", "video_frames": 0, "video_seconds": 0.0, "audio": True,
              "audio_seconds": 0.0}
    rows = [CaptionRow("a", Path("a.webm"), "test", header=header),
            CaptionRow("b", Path("b.mp4"), "test", header={**header, "video_frames": 40,
                                                           "audio_seconds": 2.0})]
    sees = types.SimpleNamespace(SEES=True)
    note_unmeasured(rows, sees, hears=True)
    assert "note: 1 file(s) state no length in their header" in capsys.readouterr().err
    note_unmeasured(rows[:1], sees, hears=False)
    assert capsys.readouterr().err.endswith(": a.webm (video)\n")
    note_unmeasured(rows[:1], types.SimpleNamespace(SEES=False), hears=True)
    assert capsys.readouterr().err.endswith(": a.webm (audio)\n")
    note_unmeasured(rows[1:], sees, hears=True)
    assert capsys.readouterr().err == ""
