"""The warmup teachers (issue #36 item 6; avex/training/warmup_teachers.py): caption attention
against a direct Hugging Face computation with output_attentions, fidelity gains against direct
R_fid differences, the base sets, the cache (read again, recomputed for another captioner or
decoding), and the --warmup-teacher setting: recorded in the run, kept on resume, bad values
refused."""
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from avex.captioner import FrozenCaptioner
from avex.data import FeatureCache
from avex.evaluate.__main__ import main as evaluate
from avex.evaluate.ablation import ABLATIONS, own_warmup
from avex.modality import AUDIO, PAD, VISUAL
from avex.selection import AVLayout, num_kept
from avex.train import main
from avex.training import warmup_teachers
from avex.training.config import PRESETS, TrainConfig
from avex.training.steps import warmup_targets
from avex.training.warmup_teachers import (caption_attention, fidelity_gains, gain_bases,
                                           teacher_scores)


@pytest.fixture(scope="module")
def tiny(tiny_cache_dir, tiny_benchmark, tiny_captioner):
    return tiny_cache_dir, FeatureCache(tiny_benchmark), FrozenCaptioner.load(tiny_captioner,
                                                                              device="cpu")


def clips_of(cache, count, split="train"):
    part = cache.split(split)
    return [part[i] for i in range(count)]


def y_full(captioner, batch):
    everything = AVLayout.of(batch.modality).modality >= 0
    return [row[0] for row in captioner.keep_set_tokens(
        batch.inputs_embeds, batch.modality, everything[:, None], max_new_tokens=24)]


def unpadded(batch, b, av_keep=None):
    """Row b's real tokens (its text and, with ``av_keep`` [M], the kept AV tokens), their
    positions in the full row, and whether each is an AV token."""
    mod = batch.modality[b]
    present = mod != PAD
    is_av = (mod == VISUAL) | (mod == AUDIO)
    kept = present.clone()
    if av_keep is not None:
        av_index = (torch.cumsum(is_av.long(), 0) - 1).clamp_min(0)
        kept &= ~is_av | av_keep[av_index]
    positions = torch.cumsum(present.long(), 0) - 1
    return batch.inputs_embeds[b][kept], positions[kept], is_av[kept]


def direct_fidelity(model, batch, b, av_keep, target) -> float:
    """R_fid = 100 x the mean log p(target | kept tokens), by one plain forward of the row."""
    embeds, positions, _ = unpadded(batch, b, av_keep)
    target = torch.tensor(target)
    last = int((batch.modality[b] != PAD).sum()) - 1
    embeds = torch.cat([embeds, model.get_input_embeddings()(target)])
    positions = torch.cat([positions, last + 1 + torch.arange(len(target))])
    with torch.no_grad():
        logits = model(inputs_embeds=embeds[None], position_ids=positions[None]).logits[0].double()
    steps = logits[len(embeds) - len(target) - 1:-1]
    return 100 * torch.log_softmax(steps, -1)[torch.arange(len(target)), target].mean().item()


def test_caption_attention_is_a_direct_output_attentions_average(tiny):
    """Per clip: the full tokens then y_full in one plain eager forward; the attention of the
    last prompt token and every y_full token but the last to each AV token, averaged over
    layers, heads and those queries."""
    _, cache, captioner = tiny
    batch = captioner.embed(clips_of(cache, 3))
    targets = y_full(captioner, batch)
    targets[1] = targets[1][:2]   # targets of several lengths
    got = caption_attention(captioner, batch, targets)
    model = captioner.model
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        for b, target in enumerate(targets):
            embeds, positions, is_av = unpadded(batch, b)
            target = torch.tensor(target)
            steps = len(target)
            with torch.no_grad():
                out = model(inputs_embeds=torch.cat(
                    [embeds, model.get_input_embeddings()(target)])[None],
                    position_ids=torch.cat([positions, positions[-1] + 1 +
                                            torch.arange(steps)])[None], output_attentions=True)
            maps = torch.stack([a[0].float() for a in out.attentions])          # [layers, H, L, L]
            rows = maps[:, :, len(embeds) - 1:len(embeds) - 1 + steps][..., :len(embeds)]
            expected = rows[..., is_av].mean((0, 1, 2))
            assert got[b].shape == (int(is_av.sum()),)
            torch.testing.assert_close(got[b], expected, atol=1e-6, rtol=1e-5)
    finally:
        model.set_attn_implementation(previous)
    assert not torch.allclose(got[0], captioner.text_to_av_attention(batch)[0], atol=1e-4)


def test_leave_one_out_gain_is_the_direct_fidelity_difference(tiny):
    """From the full tokens: gain_i = R_fid(full) - R_fid(full minus i); from a smaller base
    S: a member's gain is R_fid(S) - R_fid(S - i), an outsider's R_fid(S + i) - R_fid(S)."""
    _, cache, captioner = tiny
    clips = clips_of(cache, 2)
    batch = captioner.embed(clips)
    targets = y_full(captioner, batch)
    layout = AVLayout.of(batch.modality)
    ids = [c.clip_id for c in clips]
    full = gain_bases(ids, layout, 1.0, 1)
    gains = fidelity_gains(captioner, batch, targets, full)
    assert gains.shape == layout.modality.shape
    model = captioner.model
    for b in range(2):
        everything = full[b, 0]
        whole = direct_fidelity(model, batch, b, everything, targets[b])
        for i in (0, 5, int(layout.counts[b]) - 1):
            without = everything.clone()
            without[i] = False
            assert gains[b, i].item() == pytest.approx(
                whole - direct_fidelity(model, batch, b, without, targets[b]), abs=2e-3)
    base = gain_bases(ids, layout, 0.3, 1)
    gains = fidelity_gains(captioner, batch, targets, base)
    member = int(torch.nonzero(base[0, 0])[0])
    outsider = int(torch.nonzero(~base[0, 0])[0])
    at_base = direct_fidelity(model, batch, 0, base[0, 0], targets[0])
    without, with_it = base[0, 0].clone(), base[0, 0].clone()
    without[member], with_it[outsider] = False, True
    assert gains[0, member].item() == pytest.approx(
        at_base - direct_fidelity(model, batch, 0, without, targets[0]), abs=2e-3)
    assert gains[0, outsider].item() == pytest.approx(
        direct_fidelity(model, batch, 0, with_it, targets[0]) - at_base, abs=2e-3)
    assert gains.abs().sum() > 0


def test_gain_bases_draw_k_tokens_per_clip_whatever_the_batch(tiny):
    _, cache, captioner = tiny
    clips = clips_of(cache, 3)
    layout = AVLayout.of(captioner.embed(clips).modality)
    bases = gain_bases([c.clip_id for c in clips], layout, 0.2, 4)
    assert bases.shape == (3, 4, layout.modality.shape[1])
    assert bases.sum(-1).tolist() == [[int(num_kept(0.2, n))] * 4 for n in layout.counts.tolist()]
    assert not torch.equal(bases[0, 0], bases[0, 1])   # the sets of a clip differ
    alone = gain_bases([clips[2].clip_id], AVLayout.of(captioner.embed(clips[2:]).modality), 0.2, 4)
    assert torch.equal(alone[0], bases[2])
    assert gain_bases([c.clip_id for c in clips], layout, 1.0, 1)[:, 0].sum(1).tolist() == \
        layout.counts.tolist()
    with pytest.raises(ValueError, match="retention"):
        gain_bases(["a"], layout, 1.5, 1)


@pytest.mark.parametrize("teacher", ["caption-attention", "fidelity-gain"])
def test_teacher_scores_are_cached_per_captioner_and_decoding(tiny, tiny_captioner, tmp_path,
                                                              monkeypatch, teacher):
    _, cache, captioner = tiny
    root = tmp_path / "cache"
    scores = teacher_scores(teacher, captioner, cache, "train", cache_dir=root)
    clips = list(cache.split("train"))
    assert set(scores) == {c.clip_id for c in clips}
    assert all(scores[c.clip_id].shape == (c.n_visual + c.n_audio,) for c in clips)
    assert all(torch.isfinite(s).all() for s in scores.values())
    files = list((root / "warmup_teachers").glob("*.safetensors"))
    assert len(files) == 1

    def no_compute(*args, **kwargs):
        raise AssertionError("the teacher's scores were computed again")
    monkeypatch.setattr(warmup_teachers, "_compute", no_compute)
    again = teacher_scores(teacher, captioner, cache, "train", cache_dir=root)
    assert all(torch.equal(again[k], scores[k]) for k in scores)
    monkeypatch.undo()
    # another decoding of y_full, then another captioner (other weights): computed anew
    teacher_scores(teacher, captioner, cache, "train", cache_dir=root, max_new_tokens=3)
    other_dir = tmp_path / "other-captioner"
    shutil.copytree(tiny_captioner, other_dir)
    for weights in other_dir.glob("*.safetensors"):
        tensors = load_file(str(weights))
        save_file({k: v * 1.01 if v.is_floating_point() else v for k, v in tensors.items()},
                  str(weights))
    other = FrozenCaptioner.load(other_dir, device="cpu")
    changed = teacher_scores(teacher, other, cache, "train", cache_dir=root)
    assert len(list((root / "warmup_teachers").glob("*.safetensors"))) == 3
    assert any(not torch.equal(changed[k], scores[k]) for k in scores)
    targets = warmup_targets(scores, clips, [0.5, 0.2])
    assert all(t.shape == scores[c.clip_id].shape and t.min() >= 0 and t.max() <= 1
               for t, c in zip(targets, clips))


def test_prompt_attention_is_todays_cached_attention(tiny, tmp_path):
    _, cache, captioner = tiny
    got = teacher_scores("prompt-attention", captioner, cache, "train", cache_dir=tmp_path)
    expected = captioner.cached_text_to_av_attention(cache, "train", cache_dir=tmp_path)
    assert set(got) == set(expected) and all(torch.equal(got[k], expected[k]) for k in got)
    assert not (tmp_path / "warmup_teachers").exists()


def tiny_args(root, run_dir, *extra):
    return ["--benchmark-preset", "tiny", "--captioner-preset", "tiny", "--cache-dir", str(root),
            "--run-dir", str(run_dir), "--batch-size", "8", "--micro-batch-size", "4",
            "--warmup-epochs", "0.5", "--warmup-only", "--no-evaluate", "--no-progress",
            "--seed", "3", *extra]


def test_the_setting_is_recorded_kept_on_resume_and_checked(tiny, tmp_path, capsys):
    root, _, _ = tiny
    run = tmp_path / "run"
    main(tiny_args(root, run, "--warmup-teacher", "caption-attention"))
    assert json.loads((run / "config.json").read_text())["warmup_teacher"] == "caption-attention"
    assert list((root / "warmup_teachers").glob("*.safetensors"))
    assert (run / "warmup_policy.safetensors").is_file()
    with pytest.raises(SystemExit) as stop:   # a run's teacher is its own
        main(tiny_args(root, run, "--resume", "--warmup-teacher", "fidelity-gain"))
    assert stop.value.code == 2
    assert "warmup_teacher='fidelity-gain' (the run has 'caption-attention')" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(tiny_args(root, tmp_path / "bad", "--warmup-teacher", "oracle"))
    assert stop.value.code == 2
    assert "warmup_teacher must be one of ['caption-attention', 'fidelity-gain', " \
           "'prompt-attention'], got 'oracle'" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
    with pytest.raises(SystemExit):
        main(["--benchmark-preset", "tiny", "--captioner-preset", "tiny", "--cache-dir",
              str(root), "--run-dir", str(tmp_path / "rl"), "--warmup-from", str(run),
              "--warmup-teacher", "fidelity-gain"])
    assert "warmup_teacher = 'fidelity-gain' has no effect with warmup_from" in \
        capsys.readouterr().err


def test_the_default_teacher_is_caption_attention_and_the_paper_preset_keeps_the_papers():
    """Round 3 of the matched-budget comparison chose caption attention (results/round3-stage2.md);
    the paper preset keeps section 3.4's warmup, the prompt's attention, as it keeps its reward
    and selection."""
    assert TrainConfig().warmup_teacher == "caption-attention"
    assert PRESETS["paper"]["warmup_teacher"] == "prompt-attention"
    assert TrainConfig(**PRESETS["paper"]).validate().warmup_teacher == "prompt-attention"


def test_every_ablation_arm_names_its_warmup_teacher_whatever_the_default():
    """An arm's warmup is part of its definition: the committed figures were trained with the
    prompt's attention unless an arm says otherwise, so a change of TrainConfig's default
    changes no arm, and an arm trains a warmup of its own exactly when its teacher is not the
    seed's shared warmup's."""
    teachers = {name: settings["warmup_teacher"] for name, (_, _, settings) in ABLATIONS.items()}
    assert {name for name, t in teachers.items() if t != "prompt-attention"} == \
        {"Dc", "Dc-fid", "Cc", "Cc-fid", "Dcm", "Dcm-fid", "warmup-capattn", "warmup-fidgain"}
    assert {name for name in ABLATIONS if own_warmup(name)} == \
        {"warmup", "Dc", "Dc-fid", "Cc", "Cc-fid", "Dcm", "Dcm-fid", "warmup-capattn",
         "warmup-fidgain"}


def tiny_ablation(root, out, variants: str, retentions: str) -> dict:
    """``python -m avex.evaluate ablation`` of ``variants`` on the tiny benchmark, seed 0."""
    return evaluate(["ablation", "--benchmark-preset", "tiny", "--captioner-preset", "tiny",
                     "--cache-dir", str(root), "--out", str(out), "--no-progress",
                     "--max-new-tokens", "12", "--variants", variants,
                     "--retentions", retentions, "--train-args",
                     "--batch-size 8 --micro-batch-size 4 --warmup-epochs 0.5"])


def test_the_ablation_scores_each_teachers_own_warmup(tiny, tmp_path):
    """warmup-capattn and warmup-fidgain train warmups of their own (not from the seed's
    "warmup" run) and are scored at their warmup checkpoints, beside the default's."""
    for name, teacher in (("warmup", "prompt-attention"), ("warmup-capattn", "caption-attention"),
                          ("warmup-fidgain", "fidelity-gain")):
        assert ABLATIONS[name][2]["warmup_only"] is True
        assert ABLATIONS[name][2].get("warmup_teacher", "prompt-attention") == teacher
    root, _, _ = tiny
    out = tmp_path / "abl"
    result = tiny_ablation(root, out, "warmup,warmup-capattn", "0.4,0.2")
    assert [(r["variant"], r["retention"]) for r in result["rows"]] == \
        [("warmup", 0.4), ("warmup", 0.2), ("warmup-capattn", 0.4), ("warmup-capattn", 0.2)]
    config = json.loads((out / "runs" / "seed0" / "warmup-capattn" / "config.json").read_text())
    assert (config["warmup_teacher"], config["warmup_from"], config["warmup_only"]) == \
        ("caption-attention", None, True)
    assert json.loads((out / "runs" / "seed0" / "warmup" / "config.json").read_text())[
        "warmup_teacher"] == "prompt-attention"


def test_an_ablation_of_own_warmup_variants_trains_no_shared_warmup(tiny, tmp_path):
    """The seed's shared warmup is trained only for a variant that starts from it: a variant
    with a warmup of its own (another teacher, or warmup-only) doesn't pay for it."""
    root, _, _ = tiny
    out = tmp_path / "abl"
    result = tiny_ablation(root, out, "warmup-capattn", "0.4")
    assert sorted(p.name for p in (out / "runs" / "seed0").iterdir()) == ["warmup-capattn"]
    assert "training of 1 run(s) included" in result["table"]
    assert [(r["variant"], r["retention"]) for r in result["rows"]] == [("warmup-capattn", 0.4)]
