"""Refusals on the path from a user's model and media to a pruned generate (issue 24), one case
a line (tests/badinput.py): the export, the saved policy and what it is served with, the
captioner's tokenizer, an unfinished or mismatched run given to evaluate, a run that learns
nothing. Each names what is wrong before any work (or file) is done with it."""
import json
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import avex
from avex.adapters import AdaptedInputs
from avex.evaluate.__main__ import main as evaluate_main
from avex.modality import AUDIO, PAD, TEXT, VISUAL
from avex.policy import AVEXPolicy, PolicyConfig, TrainedOn, policy_record
from avex.pruning import prune_inputs
from avex.training.checkpoint import save_checkpoint
from badinput import case, exits_with_usage_error, raises, usage
from file_module import load_file

pytest.importorskip("av", reason="the export reads media with PyAV (the media extra)")
pytest.importorskip("soundfile", reason="the export reads audio with soundfile (the media "
                                        "extra)")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_once_prune_anywhere.py"
V, A, T = VISUAL, AUDIO, TEXT


def example():
    return load_file(EXAMPLE)


def qwen2(hidden=32):
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=hidden, intermediate_size=64,
                                        num_hidden_layers=1, num_attention_heads=4,
                                        num_key_value_heads=2)).eval()


def policy(layout="visual-then-audio", hidden=32):
    p = AVEXPolicy(PolicyConfig(input_size=hidden, hidden_size=16, num_heads=2)).eval()
    p.trained_on = TrainedOn("qwen2", hidden, layout, (0.1, 0.5))
    return p


def saved(tmp_path, **kwargs):
    return policy(**kwargs).save_pretrained(tmp_path / "policy")


def run_dir(tmp_path, phase="rl", step=3, **config):
    """A run directory whose latest checkpoint is at ``phase`` ``step``."""
    run = tmp_path / "run"
    run.mkdir()
    p = policy()
    (run / "config.json").write_text(json.dumps({"seed": 0, "num_beams": 1,
                                                 "max_new_tokens": 8, **config}))
    (run / "policy.json").write_text(json.dumps(policy_record(p.config, p.trained_on)))
    save_checkpoint(run, step, p, {"phase": phase, "step": step, "optimizer": {}, "rng": {},
                                   "config": {}})
    return run


def codes(*rows):
    width = max(map(len, rows))
    return torch.tensor([[PAD] * (width - len(r)) + list(r) for r in rows])


POLICY_CASES = [
    case("load_policy against another model type", lambda tmp: avex.load_policy(saved(tmp), model=LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4))), ValueError, r"trained with another model: LlamaForCausalLM has model type 'llama', the policy was trained with 'qwen2'"),
    case("load_policy against another hidden size", lambda tmp: avex.load_policy(saved(tmp), model=qwen2(hidden=64)), ValueError, r"has hidden size 64, the policy was trained with 32"),
    case("scoring another layout", lambda tmp: policy().score(torch.zeros(1, 6, 32), codes([T, V, A, V, A, T])), ValueError, r"modality row 0 is laid out as 'interleaved' .* the policy was trained on 'visual-then-audio'"),
    case("a visual policy given audio", lambda tmp: policy(layout="visual").score(torch.zeros(2, 4, 32), codes([T, V, T], [T, V, A, T])), ValueError, r"modality row 1 is laid out as 'visual-then-audio' .* trained on 'visual'"),
    case("scoring another width", lambda tmp: policy().score(torch.zeros(1, 3, 48), codes([T, V, T])), ValueError, r"inputs_embeds has width 48, the policy expects input_size=32"),
    case("from_pretrained of a folder without a policy", lambda tmp: AVEXPolicy.from_pretrained(tmp), FileNotFoundError, r"not a saved AVEX policy \(no config.json\)"),
    case("from_pretrained of another format", lambda tmp: (tmp.joinpath("config.json").write_text('{"format": "llama"}'), AVEXPolicy.from_pretrained(tmp)), ValueError, r"'format' must be 'avex-policy' \(a saved AVEX policy\), got 'llama'"),
    case("save_pretrained without a record", lambda tmp: AVEXPolicy(PolicyConfig(input_size=8, hidden_size=8, num_heads=2)).save_pretrained(tmp / "p"), ValueError, r"records nothing of what it was trained on"),
    case("load_policy of an unfinished run", lambda tmp: avex.load_policy(run_dir(tmp)), ValueError, r"did not finish training \(its latest checkpoint, step-00000003, is rl step 3\); resume it with python -m avex.train --resume"),
    case("load_policy of a saved policy at a checkpoint", lambda tmp: avex.load_policy(saved(tmp), checkpoint="step-00000001"), ValueError, r"names a checkpoint of a run directory, but .* is a saved policy"),
    case("prune_inputs with policy and scores", lambda tmp: prune_inputs(torch.zeros(1, 3, 32), codes([T, V, T]), policy=policy(), scores=torch.zeros(1, 3), retention=0.5), ValueError, r"pass policy or scores or keep, not several; got policy together with scores"),
    case("prune_inputs with policy, no retention", lambda tmp: prune_inputs(torch.zeros(1, 3, 32), codes([T, V, T]), policy=policy()), ValueError, r"retention is required with policy"),
    case("prune_inputs with a policy of another kind", lambda tmp: prune_inputs(torch.zeros(1, 3, 32), codes([T, V, T]), policy=qwen2(), retention=0.5), TypeError, r"policy must be an avex.policy.AVEXPolicy .* got Qwen2ForCausalLM"),
    case("AdaptedInputs of another model type", lambda tmp: AdaptedInputs(torch.zeros(1, 3, 32), codes([T, V, T]), None, {}, torch.ones(1, 3, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long), "qwen2_5_vl").prune(policy=policy(), retention=0.5), ValueError, r"these inputs come from model type 'qwen2_5_vl', the policy was trained with 'qwen2'"),
]


@pytest.mark.parametrize("call,error,match", POLICY_CASES)
def test_policy_refusals(tmp_path, call, error, match):
    raises(lambda: call(tmp_path), error, match)


# --- export ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def media(tmp_path_factory):
    """A media folder (two videos, a WAV, a PNG, a garbage .mp4), the tiny Qwen2.5-VL and its
    offline processor."""
    ex = example()
    root = tmp_path_factory.mktemp("media")
    ex.write_media(root, "qwen2_5_omni")
    (root / "broken.mp4").write_bytes(b"not a video at all" * 10)
    # cut in half: the index at the front still promises every frame, the data ends early
    ex.write_video(root / "fast.mp4", 7, faststart=True)
    whole = (root / "fast.mp4").read_bytes()
    (root / "cut.mp4").write_bytes(whole[:len(whole) // 2])
    wav = (root / "sound.wav").read_bytes()
    (root / "cut.wav").write_bytes(wav[:len(wav) // 3])
    return root, ex


def export(media_dir, rows, out, *, family="qwen2_5_vl", processor=None, model=None, ex=None):
    from avex.data.export import export_cache

    captions = media_dir.parent / f"{out.name}.jsonl"
    captions.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n"
                                for r in rows))
    model = model or ex.build_model(family)
    return export_cache(media_dir, captions, out, model=model,
                        processor=processor or ex.build_processor(family), progress=False)


TRAIN = {"file": "clip0.mp4", "captions": ["a dog barks"], "split": "train"}


def gemma3n_stub():
    from types import SimpleNamespace
    return SimpleNamespace(config=SimpleNamespace(model_type="gemma3n"))


def wrong_patch_processor(ex):
    processor = ex.build_processor("qwen2_5_vl")
    processor.image_processor.patch_size = 14
    return processor


EXPORT_CASES = [
    case("captions naming missing media", dict(rows=[TRAIN, {**TRAIN, "file": "gone.mp4"}, {**TRAIN, "file": "gone2.wav"}]), ValueError, r"names 2 file\(s\) missing from .*: line 2: gone.mp4; line 3: gone2.wav"),
    case("an unreadable media file", dict(rows=[TRAIN, {**TRAIN, "file": "broken.mp4"}]), ValueError, r"broken.mp4: unreadable video .* \(captions line 2\)"),
    case("a caption line that is not JSON", dict(rows=[TRAIN, "{oops"]), ValueError, r"line 2: not valid JSON"),
    case("an unknown split", dict(rows=[{**TRAIN, "split": "dev"}]), ValueError, r"line 1: 'split' must be one of \['train', 'val', 'test', 'transfer'\], got 'dev'"),
    case("empty captions", dict(rows=[{**TRAIN, "captions": []}]), ValueError, r"line 1: 'captions' is an empty list; leave the field out for a clip without references"),
    case("a caption that is empty", dict(rows=[{**TRAIN, "captions": [" "]}]), ValueError, r"line 1: 'captions' must be a list of non-empty strings \(or left out\), got \[' '\]"),
    case("a video cut short", dict(rows=[TRAIN, {**TRAIN, "file": "cut.mp4"}]), ValueError, r"cut.mp4: decodes short: its header says 32 frames of video, only \d+ frames decode .* \(captions line 2\)"),
    case("a WAV cut short", dict(rows=[TRAIN, {**TRAIN, "file": "cut.wav"}], family="qwen2_5_omni"), ValueError, r"cut.wav: decodes short: its header says 1.09 s of audio, only 0.36 s decode .* \(captions line 2\)"),
    case("Gemma 3n, whose per-layer inputs a cache can't hold", dict(rows=[TRAIN], model=lambda ex: gemma3n_stub()), ValueError, r"model type 'gemma3n' is refused by export: Gemma 3n's decoder reads per-layer token embeddings"),
    case("images for a model that sees nothing", dict(rows=[TRAIN, {**TRAIN, "file": "still.png"}], family="qwen2_audio"), ValueError, r"still.png \(captions line 2\): qwen2_audio takes no images"),
    case("no train split", dict(rows=[{**TRAIN, "split": "test"}]), ValueError, r"no row has split 'train'"),
    case("a file outside the media folder", dict(rows=[{**TRAIN, "file": "../x.mp4"}]), ValueError, r"'file' must be a path inside the media folder, got '../x.mp4'"),
    case("an unknown media type", dict(rows=[{**TRAIN, "file": "notes.txt"}]), ValueError, r"unknown media type '.txt'"),
    case("audio for a model that hears nothing", dict(rows=[TRAIN, {**TRAIN, "file": "sound.wav"}]), ValueError, r"sound.wav \(captions line 2\): qwen2_5_vl takes no audio"),
    case("a processor that does not match the model", dict(rows=[TRAIN], processor=wrong_patch_processor), ValueError, r"the processor does not match the model .*image_processor.patch_size is 14, the model's vision_config.patch_size is 2"),
    case("a model export can't prompt", dict(rows=[TRAIN], model=lambda ex: qwen2()), ValueError, r"export knows the processor inputs of \['qwen2_5_omni_thinker', 'qwen2_5_vl', 'llava_onevision', 'qwen2_audio'\], not model type 'qwen2'"),
]


@pytest.mark.parametrize("call,error,match", EXPORT_CASES)
def test_export_refusals_write_nothing(media, tmp_path, call, error, match):
    media_dir, ex = media
    kwargs = dict(call)
    for key in ("processor", "model"):
        if key in kwargs:
            kwargs[key] = kwargs[key](ex)
    out = tmp_path / "cache"
    raises(lambda: export(media_dir, kwargs.pop("rows"), out, ex=ex, **kwargs), error, match)
    assert list(tmp_path.iterdir()) == []   # no cache, no partial export, no lock folder


def test_export_refuses_a_clip_without_av_tokens(media, tmp_path):
    """A processor that expands no placeholder (here: one that drops the media) gives a clip
    with text only: refused naming the file, before it is written."""
    media_dir, ex = media
    processor = ex.build_processor("qwen2_5_vl")

    class TextOnly:
        def __init__(self, inner):
            self.__dict__.update(inner.__dict__)
            self.inner = inner

        def __call__(self, text, return_tensors, **media_inputs):
            return self.inner.tokenizer(["a dog barks"], return_tensors=return_tensors)

    with pytest.raises(ValueError, match=r"clip0.mp4 \(captions line 1\): the processed clip "
                                         r"has no audio or visual token"):
        export(media_dir, [TRAIN], tmp_path / "cache", processor=TextOnly(processor), ex=ex)
    assert not (tmp_path / "cache").exists()
    assert not list((tmp_path / ".cache.export" / "clips").glob("*.safetensors"))


def test_export_resumes_and_verifies(media, tmp_path, monkeypatch):
    """An export stopped after its first clip resumes without redoing it; the cache it writes
    passes python -m avex.data verify; an existing cache is not overwritten."""
    from avex.data import export as export_module
    from avex.data.__main__ import main as data_main

    media_dir, ex = media
    rows = [TRAIN, {**TRAIN, "file": "clip1.mp4", "split": "test"},
            {**TRAIN, "file": "still.png"}]
    real, calls = export_module._export_clip, []

    def stop_after_one(*args):
        if calls:
            raise KeyboardInterrupt
        calls.append(args[2].clip_id)
        return real(*args)

    monkeypatch.setattr(export_module, "_export_clip", stop_after_one)
    with pytest.raises(KeyboardInterrupt):
        export(media_dir, rows, tmp_path / "cache", ex=ex)
    done = [p.name for p in (tmp_path / ".cache.export" / "clips").glob("*.safetensors")]
    assert done == ["clip0.mp4.safetensors"] and not (tmp_path / "cache").exists()

    redone = []
    monkeypatch.setattr(export_module, "_export_clip",
                        lambda *args: redone.append(args[2].clip_id) or real(*args))
    export(media_dir, rows, tmp_path / "cache", ex=ex)
    assert redone == ["clip1.mp4", "still.png"]
    assert data_main(["verify", str(tmp_path / "cache")]) == 0
    assert not (tmp_path / ".cache.export").exists()
    with pytest.raises(ValueError, match=r"already exists \(a feature cache\); pass overwrite"):
        export(media_dir, rows, tmp_path / "cache", ex=ex)


# --- the captioner's tokenizer, evaluate, training --------------------------------------------

def test_captioner_with_a_tokenizer_that_cannot_write_the_references(tmp_path):
    """A word-level tokenizer saved beside a qwen2 config.json is loaded as Qwen2Tokenizer,
    which glues the words (the issue's all-zero run): refused naming the class and the
    tokenizer/ rule. In tokenizer/ it loads as saved, and references with a word it lacks are
    still refused."""
    from avex.captioner import FrozenCaptioner

    ex = example()
    qwen2().save_pretrained(str(tmp_path))
    ex.build_tokenizer("qwen2_5_vl").save_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match=r"its tokenizer \(Qwen2Tokenizer, loaded from .*\) does "
                                         r"not round-trip the cache's reference captions: 'a dog "
                                         r"barks' encodes and decodes to 'aa'.*tokenizer/ "
                                         r"sub-folder"):
        FrozenCaptioner.load(tmp_path, device="cpu", references=["a dog barks"])
    ex.build_tokenizer("qwen2_5_vl").save_pretrained(str(tmp_path / "tokenizer"))
    FrozenCaptioner.load(tmp_path, device="cpu", references=["a dog barks", "a cat meows."])
    with pytest.raises(ValueError, match=r"'a zebra gallops' encodes and decodes to 'a'"):
        FrozenCaptioner.load(tmp_path, device="cpu", references=["a dog barks",
                                                                 "a zebra gallops"])


EVALUATE_CASES = [
    usage("evaluate --avex-run unfinished", evaluate_main, ["--avex-run", "{run}"], r"--avex-run: .* did not finish training \(its latest checkpoint, step-00000003, is rl step 3\).*--allow-unfinished"),
    usage("evaluate runs that decode differently", evaluate_main, ["--avex-run", "{done}", "--cacovid-run", "{other}"], r"the runs decode differently \(--avex-run has max_new_tokens=8, --cacovid-run has max_new_tokens=16\); pass --max-new-tokens"),
]


def data_main(argv):
    from avex.data.__main__ import main
    return main(argv)


EXPORT_CLI_CASES = [
    usage("export --model without a config.json", data_main, ["export", "--media", "{media}", "--captions", "{captions}", "--model", "{tmp}", "--out", "{tmp}/cache"], r"--model: '.*' is not a Hugging Face model directory \(no config.json\)"),
    usage("export --captions naming missing media", data_main, ["export", "--media", "{media}", "--captions", "{missing}", "--model", "{tmp}", "--out", "{tmp}/cache"], r"names 1 file\(s\) missing from .*: line 1: gone.mp4"),
    usage("export --fps 0", data_main, ["export", "--media", "{media}", "--captions", "{captions}", "--model", "{tmp}", "--out", "{tmp}/cache", "--fps", "0"], r"fps must be .*got 0"),
]


@pytest.mark.parametrize("main,argv,match", EXPORT_CLI_CASES)
def test_export_cli_refusals(media, tmp_path, capsys, main, argv, match):
    """Bad export flags and inputs: status 2 and a message before the model is loaded."""
    media_dir, _ = media
    (tmp_path / "captions.jsonl").write_text(json.dumps(TRAIN) + "\n")
    (tmp_path / "missing.jsonl").write_text(json.dumps({**TRAIN, "file": "gone.mp4"}) + "\n")
    paths = {"media": str(media_dir), "captions": str(tmp_path / "captions.jsonl"),
             "missing": str(tmp_path / "missing.jsonl"), "tmp": str(tmp_path)}
    exits_with_usage_error(main, [a.format(**paths) for a in argv], match, capsys)
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("main,argv,match", EVALUATE_CASES)
def test_evaluate_refusals(tmp_path, capsys, monkeypatch, main, argv, match):
    # an empty cache: a default captioner built on this machine would be checked against the
    # fake runs' width first, and the refusal under test would not be reached
    monkeypatch.setenv("AVEX_CACHE", str(tmp_path / "cache"))
    for name, phase, config in (("run", "rl", {}), ("done", "done", {}),
                                ("other", "done", {"max_new_tokens": 16})):
        (tmp_path / name).mkdir()
        run_dir(tmp_path / name, phase=phase, **config)
    paths = {k: str(tmp_path / k / "run") for k in ("run", "done", "other")}
    exits_with_usage_error(main, [a.format(**paths) for a in argv], match, capsys)


@pytest.mark.slow
def test_training_stops_when_every_reward_is_zero(tiny_cache_dir, tmp_path, monkeypatch):
    import numpy as np

    from avex.reward import CiderD
    from avex.train import main

    monkeypatch.setattr(CiderD, "score", lambda self, c, r: np.zeros(len(c)))
    with pytest.raises(RuntimeError, match=r"every reward of the first 3 RL step\(s\) was 0 .*"
                                           r"max-new-tokens.*tokenizer/ sub-folder"):
        main(["--benchmark-preset", "tiny", "--captioner-preset", "tiny", "--cache-dir",
              str(tiny_cache_dir), "--run-dir", str(tmp_path / "run"), "--batch-size", "8",
              "--micro-batch-size", "8", "--epochs", "1", "--warmup-epochs", "0.2",
              "--no-evaluate", "--no-progress", "--reward", "cider"])   # CIDEr can be 0


def test_zero_rewards_from_an_undertrained_captioner_blame_the_training():
    """A captioner whose record says it captions its own validation clips at CIDEr 0 (the tiny
    preset's 4 steps did that) is named as undertrained, and the tokenizer is not blamed."""
    from types import SimpleNamespace

    from avex.training.stopping import zero_reward_error

    under = SimpleNamespace(path=Path("caps/tiny"), info={"training": {"steps": 4, "lr": 0.002,
                                                                       "val_cider": 0.0}})
    message = str(zero_reward_error(3, 24, under))
    assert "captioner at caps/tiny is undertrained: it was trained 4 steps at lr 0.002 and " \
           "captions its own validation clips at CIDEr 0" in message
    assert "tokenizer" not in message
    trained = SimpleNamespace(path=None, info={"training": {"steps": 150, "val_cider": 18.9}})
    for captioner in (trained, None):
        assert "tokenizer/ sub-folder" in str(zero_reward_error(3, 24, captioner))
