"""The ablation's runs: a derived variant (``--derive``, a variant with some training settings
changed, under a name of its own) trains with exactly its changes, and a run already in the
output folder is reused only when it was trained with the settings asked for; otherwise the
ablation is refused before any work (it once scored a stale run under the new settings' label)."""
import dataclasses
import json

import pytest

from avex.evaluate.__main__ import main as evaluate
from avex.evaluate.ablation import ABLATIONS, AblationSettings, run_ablation
from avex.training.config import TrainConfig
from avex.training.loop import variant_config
from avex.training.run_records import check_reusable

SMALL = TrainConfig(batch_size=8, micro_batch_size=4, warmup_epochs=0.5, epochs=0.5)


@pytest.fixture(scope="module")
def root(tiny_cache_dir, tiny_benchmark, tiny_captioner):
    return tiny_cache_dir


def settings(root, out, **kw) -> AblationSettings:
    kw.setdefault("train", SMALL)
    return AblationSettings(benchmark_preset="tiny", captioner_preset="tiny", cache_dir=str(root),
                            out=str(out), max_new_tokens=12, progress=False, retentions=[0.4],
                            max_clips=4, **kw)


def config_of(out, name) -> dict:
    return json.loads((out / "runs" / "seed0" / name / "config.json").read_text())


def files_under(path) -> set:
    return {p.relative_to(path) for p in path.rglob("*")}


def test_a_derived_variant_changes_only_what_it_names_and_is_labelled_so(root, tmp_path):
    out = tmp_path / "abl"
    result = evaluate(["ablation", "--benchmark-preset", "tiny", "--captioner-preset", "tiny",
                       "--cache-dir", str(root), "--out", str(out), "--no-progress",
                       "--max-new-tokens", "12", "--max-clips", "4", "--retentions", "0.4",
                       "--train-args", "--batch-size 8 --micro-batch-size 4 --warmup-epochs "
                       "0.5 --epochs 0.5", "--derive", "A@r2=A --selection set-aware "
                       "--redundancy 2"])
    # without --variants: the derived variant and the variant it derives from
    assert [r["variant"] for r in result["rows"]] == ["A", "A@r2"]
    base, derived = config_of(out, "A"), config_of(out, "A@r2")
    assert (base["selection"], base["redundancy"]) == ("topk", 0.0)
    assert (derived["selection"], derived["redundancy"]) == ("set-aware", 2.0)
    assert {k for k in base if base[k] != derived[k]} == {"selection", "redundancy", "run_dir"}
    # both start from the seed's one shared warmup
    assert base["warmup_from"] == derived["warmup_from"] == str(out / "runs" / "seed0" / "warmup")
    rows = {r["variant"]: r for r in result["rows"]}
    assert rows["A@r2"]["label"] == f"{ABLATIONS['A'][0]}; selection set-aware, redundancy 2.0"
    assert (rows["A@r2"]["selection"], rows["A@r2"]["redundancy"]) == ("set-aware", 2.0)
    assert rows["A@r2"]["label"] in (out / "ablation.md").read_text()
    assert json.loads((out / "ablation.json").read_text())["derived"] == {
        "A@r2": {"variant": "A", "changes": {"selection": "set-aware", "redundancy": 2.0}}}
    # the same ablation again reuses every run; with another setting it is refused, untouched
    again = evaluate(["ablation", "--benchmark-preset", "tiny", "--captioner-preset", "tiny",
                      "--cache-dir", str(root), "--out", str(out), "--no-progress",
                      "--max-new-tokens", "12", "--max-clips", "4", "--retentions", "0.4",
                      "--train-args", "--batch-size 8 --micro-batch-size 4 --warmup-epochs "
                      "0.5 --epochs 0.5", "--derive", "A@r2=A --selection set-aware "
                      "--redundancy 2"])
    assert "scoring only: every run was reused" in again["table"]
    before = files_under(out)
    with pytest.raises(ValueError, match=r"abl/runs/seed0/A@r2 already holds a run trained with "
                                         r"other settings than this one asks for: redundancy=3\.0 "
                                         r"\(the run has 2\.0\)"):
        run_ablation(settings(root, out, variants=["A"],
                              derived={"A@r2": ("A", {"selection": "set-aware",
                                                      "redundancy": 3.0})}))
    assert files_under(out) == before


def test_a_stale_run_in_the_output_folder_is_refused_before_any_work(root, tmp_path):
    """--train-args changed between two ablations into one folder: the first's runs are not
    the second's, and scoring them under its settings would be silently wrong."""
    out = tmp_path / "abl"
    run_ablation(settings(root, out, variants=["warmup"]))
    before = files_under(out)
    longer = dataclasses.replace(SMALL, warmup_epochs=1.0)
    with pytest.raises(ValueError, match=r"seed0/warmup already holds a run trained with other "
                                         r"settings than this one asks for: warmup_epochs=1\.0 "
                                         r"\(the run has 0\.5\)"):
        run_ablation(settings(root, out, variants=["warmup", "A"], train=longer))
    assert files_under(out) == before


def test_reuse_ignores_what_does_not_shape_the_policy_and_resolves_paths(root, tmp_path,
                                                                        monkeypatch):
    out = tmp_path / "abl"
    run_ablation(settings(root, out, variants=["warmup"]))
    made = config_of(out, "warmup")
    cfg = TrainConfig(**made)
    check_reusable(cfg)   # the run's own settings
    check_reusable(dataclasses.replace(cfg, progress=True, eval_split="val", checkpoint_every=3,
                                       max_eval_clips=None, device="cpu"))
    monkeypatch.chdir(tmp_path)   # the same folder, spelled relative to the working directory
    check_reusable(dataclasses.replace(cfg, run_dir="abl/runs/seed0/warmup"))
    with pytest.raises(ValueError, match=r"seed=1 \(the run has 0\)"):
        check_reusable(dataclasses.replace(cfg, seed=1))
    with pytest.raises(ValueError, match=r"data='elsewhere'"):
        check_reusable(dataclasses.replace(cfg, data="elsewhere"))


@pytest.mark.parametrize("derived, match", [
    ({"A": ("A", {"epochs": 1.0})}, r"--derive A: 'A' already names a variant"),
    ({"x": ("bogus", {"epochs": 1.0})}, r"--derive x: variant must be one of .* got 'bogus'"),
    ({"x": ("A", {})}, r"--derive x: no training setting is changed; it would be 'A' again"),
    ({"x": ("A", {"epochs": 0.5})}, r"--derive x: 'A' already trains with epochs=0\.5"),
    ({"x": ("A", {"seed": 2})}, r"--derive x: seed=2 is set by the ablation for each run"),
    ({"x": ("A", {"nope": 2})}, r"--derive x: 'nope' is not a training setting"),
    ({"x": ("A", {"g": 4})}, r"--derive x: g = 4 has no effect without the exchange term"),
    ({"x": ("A", {"warmup_epochs": 2.0})}, r"--derive x: warmup_epochs would change the warmup, "
                                           r"but 'A' starts from the seed's shared warmup run"),
    ({"x": ("A", {"lr": -1.0})}, r"--derive x: lr must be"),
    ({" x": ("A", {"lr": 1.0})}, r"a derived variant's name must be a non-empty str"),
    ({"x": "A"}, r"--derive x: expected \(variant, \{setting: value\}\), got 'A'"),
])
def test_a_bad_derived_variant_is_refused_naming_it(root, tmp_path, derived, match):
    with pytest.raises((ValueError, TypeError), match=match):
        settings(root, tmp_path / "abl", variants=["A"], derived=derived).validate()
    assert not (tmp_path / "abl").exists()


def test_a_derived_variant_of_an_own_warmup_variant_may_change_its_warmup(root, tmp_path):
    s = settings(root, tmp_path / "abl", variants=["warmup"],
                 train=dataclasses.replace(SMALL, warmup_epochs=6.0),
                 derived={"warmup@e2": ("warmup", {"warmup_epochs": 2.0})}).validate()
    assert s.variants == ["warmup", "warmup@e2"]
    plan = s.planned_runs(tmp_path / "abl")
    assert list(plan) == [(0, "warmup"), (0, "warmup@e2")]
    run_dir, run = plan[(0, "warmup@e2")]
    cfg = variant_config(s.base_train_config(), run_dir, **run)
    assert (cfg.warmup_epochs, cfg.warmup_only, cfg.warmup_from) == (2.0, True, None)


def test_a_given_run_trained_otherwise_than_its_variant_says_so_in_its_label(root, tmp_path):
    out = tmp_path / "abl"
    run_ablation(settings(root, out, variants=["A"]))
    a_run = str(out / "runs" / "seed0" / "A")
    same = run_ablation(settings(root, tmp_path / "same", variants=["A"], runs={"A": a_run}))
    assert same["rows"][0]["label"] == ABLATIONS["A"][0]
    assert "given_run_differs" not in same["rows"][0]
    other = run_ablation(settings(root, tmp_path / "other", variants=["C"], runs={"C": a_run}))
    row = other["rows"][0]
    assert row["given_run_differs"] == {"rl_estimator": "rloo"}
    assert row["label"] == f"{ABLATIONS['C'][0]} (the given run: rl estimator rloo)"
    assert row["label"] in (tmp_path / "other" / "ablation.md").read_text()


def test_a_given_run_trained_on_other_data_is_labelled_a_transfer(root, tmp_path):
    import shutil

    out = tmp_path / "abl"
    run_ablation(settings(root, out, variants=["A"]))
    moved = tmp_path / "elsewhere"
    shutil.copytree(out / "runs" / "seed0" / "A", moved)
    config = json.loads((moved / "config.json").read_text())
    config.update(data="/data/benchmarks/embedded-tiny-seed7", captioner="/models/my-captioner")
    (moved / "config.json").write_text(json.dumps(config))
    row = run_ablation(settings(root, tmp_path / "t", variants=["A"],
                                runs={"A": str(moved)}))["rows"][0]
    assert row["label"] == (f"{ABLATIONS['A'][0]} (the given run: trained on "
                            "`embedded-tiny-seed7` with captioner `my-captioner`, scored on "
                            "`embedded-tiny-seed0` with `embedded-tiny-seed0-tiny`)")
    assert row["label"] in (tmp_path / "t" / "ablation.md").read_text()


def test_trained_elsewhere_compares_the_benchmark_and_captioner_by_name(tmp_path):
    from avex.evaluate.common import trained_elsewhere
    from avex.evaluate.sweep import transfer_notes

    here = ("/cache/benchmarks/embedded-default-seed0",
            "/cache/captioners/embedded-default-seed0-default")
    # the embedded benchmark and captioner of the run's presets, or paths: where they moved
    # (another cache root) is no transfer
    assert trained_elsewhere({"data": "embedded", "captioner": "embedded"}, *here) is None
    assert trained_elsewhere({"data": "/other/embedded-default-seed0",
                              "captioner": "/x/embedded-default-seed0-default"}, *here) is None
    assert trained_elsewhere({"data": "embedded", "benchmark_preset": "tiny",
                              "captioner": "embedded", "captioner_preset": "tiny"}, *here) == (
        "trained on `embedded-tiny-seed0` with captioner `embedded-tiny-seed0-tiny`, scored "
        "on `embedded-default-seed0` with `embedded-default-seed0-default`")
    assert "with captioner `c2`" in trained_elsewhere(
        {"data": here[0], "captioner": "/m/c2"}, *here)
    # the sweep: one note per run, however many seeds share it
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"data": "/d/embedded-default-seed3",
                                                 "captioner": here[1]}))
    notes = transfer_notes({"avex": {0: (None, run, 0), 1: (None, run, 0)}},
                           {"avex": "AVEX-Prune"}, *here, tmp_path)
    assert notes == ["AVEX-Prune: run was trained on `embedded-default-seed3` with captioner "
                     "`embedded-default-seed0-default`, scored on `embedded-default-seed0` with "
                     "`embedded-default-seed0-default`."]


def test_a_changed_flag_reads_as_words_in_a_label():
    from avex.evaluate.ablation import changes_text
    assert changes_text({"retention_input": True, "rl": False, "redundancy": 2.0,
                         "train_retentions": [0.5, 0.1]}) == \
        "retention input, no rl, redundancy 2.0, train retentions 0.5,0.1"
