"""python -m avex.evaluate diagnose (issue #33): captions read back into content slots, the
role-oracle sets, exact reproductions, best-of-N by y_full's likelihood, the report on the tiny
benchmark, bad arguments."""
import copy
import json
import re

import numpy as np
import pytest
import torch

from avex.data import world
from avex.data.cache import FeatureCache
from avex.data.embedded import (AUDIO_ROLES, IN_DOMAIN, PRESETS, TRANSFER, VISUAL_ROLES,
                                Backbone, sample_clip, synthesize)
from avex.evaluate import diagnose, diagnose_report
from avex.evaluate.__main__ import main
from avex.evaluate.diagnose import (ORACLES, best_of, coloured_subject_token, colour_vectors,
                                    exact_share, role_tiers, tiered_keep)
from avex.evaluate.slots import Slots, changed_slots, parse_caption, slots_of_info
from avex.selection import num_kept
from badinput import exits_with_usage_error


def drawn_clip(index: int, stats=IN_DOMAIN, cfg=PRESETS["default"]):
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([11, index])))
    return sample_clip(rng, cfg, stats), rng


# -- slots ------------------------------------------------------------------------------------

@pytest.mark.parametrize("stats", [IN_DOMAIN, TRANSFER], ids=["in-domain", "transfer"])
def test_every_reference_parses_to_the_generators_slots(stats):
    for index in range(400):
        spec, rng = drawn_clip(index, stats)
        refs, _, _ = world.references(spec, rng)
        truth = slots_of_info(spec.summary())
        for ref in refs:
            assert parse_caption(ref) == truth, ref


def test_two_references_of_one_clip_are_paraphrases_and_a_drawn_change_is_content():
    seen = {"paraphrase": 0, "colour": 0, "action": 0, "place": 0}
    for index in range(200):
        spec, rng = drawn_clip(index)
        refs, _, _ = world.references(spec, rng)
        if refs[0] != refs[1]:
            assert changed_slots(parse_caption(refs[0]), parse_caption(refs[1])) == []
            seen["paraphrase"] += 1
        subject = world.SUBJECTS[spec.subject]
        for slot, field, options in (("colour", "color", subject.colors),
                                     ("action", "action", subject.actions),
                                     ("place", "scene", sorted(world.SCENES))):
            other = next(o for o in options if o != getattr(spec, field))
            changed = copy.deepcopy(spec)
            setattr(changed, field, other)
            caption = world.av_reference(changed, rng)
            assert changed_slots(parse_caption(caption), parse_caption(refs[0])) == [slot], \
                (caption, refs[0])
            seen[slot] += 1
    assert min(seen.values()) > 50


@pytest.mark.parametrize("first, second, slots", [
    ("a brown dog runs and barks in the park", "a brown puppy is running and barking in a park",
     []),
    ("a brown dog runs and barks in the park", "a brown dog runs in the park while a dog barks",
     ["event"]),
    ("a man in a red shirt dances on the stage while piano music plays",
     "a man wearing a red shirt dances on a stage to piano music", []),
    ("a man in a red shirt dances on the stage while piano music plays",
     "a man in a red shirt dances on the stage while guitar music plays", ["music"]),
    ("a white cat sits in the kitchen", "a white car parks in the kitchen", ["object", "action"]),
    ("a black dog sits in the yard", "a black dog sits", ["place"]),
])
def test_hand_written_pairs(first, second, slots):
    assert changed_slots(parse_caption(first), parse_caption(second)) == slots


def test_off_grammar_captions_leave_slots_empty():
    assert parse_caption("") == Slots(None, None, None, None, frozenset(), None)
    assert parse_caption("a dog runs in the park").colour is None
    assert parse_caption("a dog runs in the park").object == "dog"
    assert parse_caption("while a dog barks").events == frozenset({("bark", "background")})
    with pytest.raises(TypeError, match="text must be a str"):
        parse_caption(None)


# -- role oracles -----------------------------------------------------------------------------

def test_the_coloured_subject_token_is_one_the_generator_coloured():
    """Synthesised twice from one random stream, once with every colour vector zero: the
    tokens that differ are exactly those the generator coloured."""
    cfg = PRESETS["default"]
    bb = Backbone(3, cfg.dim, cfg.grid, cfg.n_frames, cfg.n_audio)
    blank = copy.copy(bb)
    blank.color = {k: np.zeros_like(v) for k, v in bb.color.items()}
    checked = 0
    for index in range(60):
        spec, _ = drawn_clip(index)
        seq = np.random.SeedSequence([5, index])
        visual, _, role, _ = synthesize(np.random.Generator(np.random.PCG64(seq)), cfg,
                                        IN_DOMAIN, bb, spec)
        plain, _, _, _ = synthesize(np.random.Generator(np.random.PCG64(seq)), cfg, IN_DOMAIN,
                                    blank, spec)
        coloured = set(torch.nonzero((visual - plain).abs().amax(1) > 0).flatten().tolist())
        assert coloured <= set(torch.nonzero(role == VISUAL_ROLES["subject"]).flatten().tolist())
        token = coloured_subject_token(visual, role, torch.from_numpy(bb.color[spec.color]))
        if coloured:
            assert token in coloured
            checked += 1
    assert checked > 40


def test_tiered_keep_takes_tiers_in_order_then_fills_by_score():
    scores = torch.tensor([5.0, 1.0, 4.0, 3.0, 2.0, 9.0])
    valid = torch.tensor([True, True, True, True, True, False])
    keep = tiered_keep(scores, valid, [[1, 4], [3]], 4)
    assert keep.tolist() == [True, True, False, True, True, False]
    # a tier larger than the budget is cut by score
    assert tiered_keep(scores, valid, [[1, 3, 4]], 2).tolist() == \
        [False, False, False, True, True, False]
    # an invalid (padding) token is never kept, even when a tier names it
    assert not tiered_keep(scores, valid, [[5]], 5)[5]
    with pytest.raises(ValueError, match="k = 6 exceeds the row's 5 valid tokens"):
        tiered_keep(scores, valid, [], 6)


@pytest.mark.parametrize("retention", [0.4, 0.1])
def test_role_oracle_sets_have_k_tokens_and_hold_the_annotated_roles(tiny_benchmark, retention):
    cache = FeatureCache(tiny_benchmark)
    colours = colour_vectors(cache)
    split = cache.split("test")
    for i in range(len(split)):
        clip = split[i]
        m = clip.n_visual + clip.n_audio
        k = int(num_kept(retention, m))
        scores = torch.randn(m, generator=torch.Generator().manual_seed(i))
        valid = torch.ones(m, dtype=torch.bool)
        roles = set(role_tiers(clip, "every-role")[0])
        audio = clip.annotations["audio_role"]
        subject = set(torch.nonzero(clip.annotations["visual_role"] == VISUAL_ROLES["subject"])
                      .flatten().tolist())
        wanted = subject | {clip.n_visual + int(a) for a in torch.nonzero(
            (audio == AUDIO_ROLES["event"]) | (audio == AUDIO_ROLES["music"])).flatten()}
        assert roles == wanted
        keep = tiered_keep(scores, valid, role_tiers(clip, "every-role"), k)
        kept = set(torch.nonzero(keep).flatten().tolist())
        assert int(keep.sum()) == k
        assert kept >= roles if len(roles) <= k else kept <= roles
        first, music = role_tiers(clip, "one-per-role", colours[clip.info["color"]])
        keep = tiered_keep(scores, valid, [first, music], k)
        kept = set(torch.nonzero(keep).flatten().tolist())
        assert int(keep.sum()) == k
        onsets = {clip.n_visual + e["start"] for e in clip.info["events"]}
        assert onsets <= set(first) and len(first) == len(onsets) + bool(subject)
        assert set(first) <= subject | onsets
        assert set(first) <= kept if len(first) <= k else kept <= set(first)
        assert {clip.n_visual + int(a) for a in torch.nonzero(
            audio == AUDIO_ROLES["music"]).flatten()} == set(music)


# -- exact reproduction and best-of-N ---------------------------------------------------------

def test_exact_share_is_a_count():
    assert exact_share(["a b", "c", "d", "e"], ["a b", "x", "d", "e f"]) == 0.5
    with pytest.raises(ValueError, match="same clips"):
        exact_share(["a"], ["a", "b"])


def test_best_of_n_picks_the_argmax_of_the_log_likelihood(monkeypatch):
    """retention_rows with a stand-in scorer (each caption's length): the best-fidelity row
    holds, per clip, the sample whose y_full log-likelihood is largest, and the best-cider row
    the sample with the highest score."""
    monkeypatch.setattr(diagnose, "per_clip_cider",
                        lambda captions, clips: np.array([len(c) for c in captions], float))
    rng = np.random.default_rng(0)
    clips, n = 6, 5
    samples = [[" ".join(["w"] * int(rng.integers(1, 9))) for _ in range(n)]
               for _ in range(clips)]
    log_prob = rng.normal(size=(clips, n))
    got = {"captions": {name: ["w"] * clips for name in ("policy", *ORACLES)},
           "log_prob": {name: [0.0] * clips for name in ("policy", *ORACLES)}, "k": 3}
    got["captions"]["samples"], got["log_prob"]["samples"] = samples, log_prob
    full = ["w w"] * clips
    rows = diagnose.retention_rows(got, [None] * clips, full, np.full(clips, 3.0), False)
    pick = log_prob.argmax(1)
    assert rows["best-fidelity"]["captions"] == [samples[c][pick[c]] for c in range(clips)]
    assert rows["best-fidelity"]["log_prob"] == pytest.approx(log_prob.max(1).mean())
    lengths = np.array([[len(s) for s in row] for row in samples], float)
    assert rows["best-cider"]["C_av"] == pytest.approx(lengths.max(1).mean())
    assert rows["sample-mean"]["C_av"] == pytest.approx(lengths.mean())
    assert rows["policy"]["exact"] == 0.0
    assert list(best_of(np.array([[1.0, 3.0, 3.0]]))) == [1]   # ties to the first


# -- the report on the tiny benchmark ---------------------------------------------------------

def tiny(cache_dir, out, *extra):
    return ["diagnose", "--benchmark-preset", "tiny", "--captioner-preset", "tiny",
            "--cache-dir", str(cache_dir), "--out", str(out), "--no-progress",
            "--max-new-tokens", "12", *extra]


@pytest.fixture(scope="module")
def diagnosed(tiny_cache_dir, tmp_path_factory):
    from avex.training.config import TrainConfig
    from avex.train import train

    run = tmp_path_factory.mktemp("diag-run") / "run"
    train(TrainConfig(benchmark_preset="tiny", captioner_preset="tiny",
                      cache_dir=str(tiny_cache_dir), run_dir=str(run), batch_size=8,
                      micro_batch_size=4, epochs=0.5, warmup_epochs=0.5, anchors=4,
                      progress=False, evaluate=False))
    out = tmp_path_factory.mktemp("diag-out")
    result = main(tiny(tiny_cache_dir, out, "--run", str(run), "--samples", "3",
                       "--name", "b"))
    return out, run, result


@pytest.mark.slow
def test_the_report_counts_what_its_captions_show(diagnosed):
    out, run, _ = diagnosed
    data = json.loads((out / "b.json").read_text())
    assert (out / "b.md").is_file() and (out / "b-ties.png").is_file()
    full = data["full"]["captions"]
    assert data["settings"]["run"] == "../" + run.parent.name + "/run"   # relative to out
    assert data["settings"]["judge"]["benchmark"]["path"] == "benchmarks/embedded-tiny-seed0"
    assert data["settings"]["samples"] == 3 and data["settings"]["tau"] == 0.5
    for key, block in data["retentions"].items():
        rows = block["rows"]
        policy = rows["policy"]["captions"]
        assert rows["policy"]["exact"] == sum(p == f for p, f in zip(policy, full)) / len(full)
        assert set(rows) == set(diagnose_report.ROWS)
        for row in rows.values():
            assert row["C_av"] == pytest.approx(np.mean(row["per_clip"]), abs=0.01)
        # the kinds partition the clips, and their carried loss adds up to the loss
        kinds = block["by_difference"]
        assert sum(kinds[k]["clips"] for k in ("exact", "paraphrase", "content")) == len(full)
        assert sum(kinds[k]["carried"] for k in ("exact", "paraphrase", "content")) == \
            pytest.approx(rows["policy"]["loss"], abs=1e-6)
        assert kinds["exact"]["clips"] == sum(p == f for p, f in zip(policy, full))
        for attribute in block["by_clip"].values():
            assert sum(v["clips"] for v in attribute.values()) == len(full)
            assert sum(v["carried"] for v in attribute.values()) == \
                pytest.approx(rows["policy"]["loss"], abs=1e-6)
    # every table row has as many cells as its header (a "|" inside a cell is escaped)
    table = []
    for line in (out / "b.md").read_text().splitlines() + [""]:
        if line.startswith("|"):
            table.append(len(re.findall(r"(?<!\\)\|", line)))
        elif table:
            assert len(set(table)) == 1, table
            table = []
    # ties: read from the run's metrics.jsonl, one entry per retention trained at
    logged = [m for line in (run / "metrics.jsonl").read_text().splitlines()
              for m in (json.loads(line).get("reward_diagnostics") or [])]
    assert data["ties"]["all"]["micro_batches"] == len(logged)
    assert data["ties"]["all"]["tied"] == pytest.approx(np.mean([m["tied"] for m in logged]))


@pytest.mark.parametrize("flags, match", [
    (["--samples", "1"], "samples must be"),
    (["--retentions", "0.4,1.5"], "retentions must be in"),
    (["--tau", "0"], "tau must be a finite number > 0"),
    (["--name", "a/b"], "name must be a file name stem"),
    (["--seed", "-1"], "seed must be"),
    (["--split", "nope"], "split must be one of"),
])
def test_bad_arguments(tiny_cache_dir, tmp_path, flags, match, capsys):
    exits_with_usage_error(main, tiny(tiny_cache_dir, tmp_path / "out", "--run",
                                      str(tmp_path), *flags), match, capsys)
    assert not (tmp_path / "out").exists()


def test_a_missing_run_or_metrics_is_named(tiny_cache_dir, tmp_path, capsys):
    exits_with_usage_error(main, tiny(tiny_cache_dir, tmp_path / "out", "--run",
                                      str(tmp_path / "none")), "run: no run directory", capsys)
    exits_with_usage_error(main, tiny(tiny_cache_dir, tmp_path / "out", "--run",
                                      str(tmp_path)), "run: no metrics.jsonl", capsys)
    exits_with_usage_error(main, ["diagnose", "--out", str(tmp_path)], "--run", capsys)


def test_a_cache_without_annotations_is_refused(tiny_benchmark, tiny_captioner, tmp_path,
                                                capsys):
    """A copy of the tiny benchmark whose meta.json no longer says it is embedded."""
    import shutil
    data = tmp_path / "cache"
    shutil.copytree(tiny_benchmark, data)
    meta = json.loads((data / "meta.json").read_text())
    meta["source"] = {"kind": "exported"}
    (data / "meta.json").write_text(json.dumps(meta))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("")
    exits_with_usage_error(main, ["diagnose", "--data", str(data), "--captioner",
                                  str(tiny_captioner), "--run", str(tmp_path / "run"), "--out",
                                  str(tmp_path / "out")], "data: .* is not an embedded "
                           "benchmark with token roles", capsys)
