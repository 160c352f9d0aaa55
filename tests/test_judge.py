"""The judge is fixed: benchmark and captioner hashes, the shipped reference captioners (installed
instead of trained, verified on load), results that name their judge, and the warning when the
judge differs from the committed one."""
import json
import shutil
import warnings

import pytest

from avex import judge_identity as judge
from avex.captioner import reference
from avex.captioner.frozen import CAPTIONER_FILE, FrozenCaptioner
from avex.data import ensure_benchmark
from avex.data.embedded import PRESETS, build_benchmark
from avex.judge_identity import (benchmark_sha256, captioner_sha256, judge_line, judge_record,
                        judge_warnings)


def test_benchmark_hash_is_the_same_for_two_builds_and_sees_a_changed_byte(tmp_path):
    cfg = PRESETS["tiny"]
    first = build_benchmark(tmp_path / "a", cfg, progress=False)
    second = build_benchmark(tmp_path / "b", cfg, progress=False)
    assert benchmark_sha256(first) == benchmark_sha256(second)
    shard = sorted((second / "shards").glob("*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    assert benchmark_sha256(first) != benchmark_sha256(second)


def test_every_shipped_reference_verifies_against_its_manifest():
    shipped = reference.references()
    assert "embedded-default-seed0-default" in shipped
    for name, record in shipped.items():
        folder = judge.REFERENCE_DIR / name
        reference.verify_reference(folder, name)
        assert captioner_sha256(folder) == record["captioner_sha256"]
        assert json.loads((folder / CAPTIONER_FILE).read_text())["reference"] == name
        assert reference.committed_judge(record["benchmark"]) == {
            "benchmark_sha256": record["benchmark_sha256"],
            "earlier_benchmark_sha256": [e["sha256"] for e in
                                         record.get("earlier_benchmarks", [])],
            "captioner_sha256": record["captioner_sha256"]}


@pytest.fixture
def shipped_tiny(tiny_cache_dir, tiny_benchmark, tiny_captioner, tmp_path, monkeypatch):
    """The session's tiny captioner shipped as a reference (in a temporary reference folder)."""
    monkeypatch.setattr(judge, "REFERENCE_DIR", tmp_path / "reference")
    monkeypatch.setattr(judge, "MANIFEST", tmp_path / "reference" / "references.json")
    (tmp_path / "reference").mkdir()
    reference.write_reference(tiny_captioner, tiny_benchmark)
    return tiny_captioner.name


def test_ensure_captioner_installs_the_shipped_reference_instead_of_training(
        shipped_tiny, tmp_path, monkeypatch):
    from avex.captioner import train as captioner_train

    def no_training(*args, **kwargs):
        raise AssertionError("a shipped reference must not be retrained")
    monkeypatch.setattr(captioner_train, "train_captioner", no_training)
    cache = tmp_path / "fresh-cache"
    path = captioner_train.ensure_captioner("tiny", "tiny", cache_dir=cache, progress=False)
    assert path.name == shipped_tiny
    assert captioner_sha256(path) == reference.references()[shipped_tiny]["captioner_sha256"]
    loaded = FrozenCaptioner.load(path, device="cpu")
    assert loaded.info["reference"] == shipped_tiny
    # the same weights, so the same judge as the committed one
    record = judge_record(ensure_benchmark("tiny", cache_dir=cache, progress=False), path)
    assert record["matches_committed"] is True and judge_warnings(record) == []
    assert "the committed judge" in judge_line(record)


def test_a_modified_reference_is_refused_on_load(shipped_tiny, tmp_path):
    copy = tmp_path / "copy"
    reference.install_reference(shipped_tiny, copy)
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"model\.safetensors: sha256 .* differs from the "
                                         r"shipped reference captioner .*modified or corrupt"):
        FrozenCaptioner.load(copy, device="cpu")
    reference.install_reference(shipped_tiny, copy)   # a fresh copy, then a missing file
    shutil.rmtree(copy / "tokenizer")
    with pytest.raises(ValueError, match="lacks tokenizer/"):
        reference.verify_reference(copy, shipped_tiny)


def test_a_reference_this_version_does_not_ship_is_refused(shipped_tiny, tmp_path):
    copy = reference.install_reference(shipped_tiny, tmp_path / "copy")
    info = json.loads((copy / CAPTIONER_FILE).read_text())
    (copy / CAPTIONER_FILE).write_text(json.dumps({**info, "reference": "nope-default"}))
    with pytest.raises(ValueError, match="names the reference captioner 'nope-default', which "
                                         "this version of avex does not ship"):
        FrozenCaptioner.load(copy, device="cpu")


def test_a_different_judge_is_named_in_the_warnings(shipped_tiny, tiny_benchmark, tmp_path):
    copy = reference.install_reference(shipped_tiny, tmp_path / "cache" / shipped_tiny)
    weights = copy / "avex_projector.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    record = judge_record(tiny_benchmark, copy, cache_dir=tmp_path / "cache")
    assert record["matches_committed"] is False
    (problem,) = judge_warnings(record)
    assert problem.startswith(f"the captioner at {shipped_tiny} has sha256 ")  # cache-relative
    assert "figures will not match docs/results.md" in problem
    assert "NOT the committed judge" in judge_line(record)


def test_install_warns_when_the_benchmark_is_not_the_one_it_was_trained_on(
        shipped_tiny, tmp_path):
    other = build_benchmark(tmp_path / "other", PRESETS["tiny"].__class__(
        **{**PRESETS["tiny"].__dict__, "seed": 5}), progress=False)
    with pytest.warns(UserWarning, match="not the .* the reference captioner 'embedded-tiny-"
                                         "seed0-tiny' was trained on"):
        reference.install_reference(shipped_tiny, tmp_path / "copy", benchmark_path=other)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reference.install_reference(shipped_tiny, tmp_path / "copy2")


def test_captioner_without_weight_files_has_no_hash(tmp_path):
    assert captioner_sha256(tmp_path) is None


def test_captioner_install_command_copies_the_shipped_reference(shipped_tiny, tmp_path, capsys):
    """python -m avex.captioner install: the shipped reference into the cache, verified."""
    from avex.captioner.__main__ import main as captioner_main

    cache = tmp_path / "fresh-cache"
    assert captioner_main(["install", "--preset", "tiny", "--benchmark-preset", "tiny",
                           "--cache-dir", str(cache), "--no-progress"]) == 0
    installed = next(cache.rglob("avex_captioner.json")).parent
    assert installed.name == shipped_tiny
    assert captioner_sha256(installed) == reference.references()[shipped_tiny]["captioner_sha256"]
    assert "(verified)" in capsys.readouterr().out


def test_captioner_install_replaces_a_captioner_trained_in_the_cache(shipped_tiny,
                                                                     tiny_captioner, tmp_path,
                                                                     capsys):
    """A captioner trained where the reference goes (no reference marker, other weights) is
    replaced by the shipped reference, and the command says so."""
    from avex.captioner.__main__ import main as captioner_main

    cache = tmp_path / "cache"
    args = ["install", "--preset", "tiny", "--benchmark-preset", "tiny", "--cache-dir",
            str(cache), "--no-progress"]
    assert captioner_main(args) == 0
    installed = next(cache.rglob("avex_captioner.json")).parent
    info = json.loads((installed / CAPTIONER_FILE).read_text())
    info.pop("reference")
    (installed / CAPTIONER_FILE).write_text(json.dumps(info))
    (installed / "model.safetensors").write_bytes(b"trained here")
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:   # never without --overwrite: it would be lost
        captioner_main(args)
    assert stop.value.code == 2 and "pass --overwrite" in capsys.readouterr().err
    assert (installed / "model.safetensors").read_bytes() == b"trained here"
    assert captioner_main(args + ["--overwrite"]) == 0
    assert "in place of the captioner trained there" in capsys.readouterr().out
    reference.verify_reference(installed, shipped_tiny)
    assert captioner_main(args) == 0            # already the reference: left as it is
    assert "in place of" not in capsys.readouterr().out


def test_the_benchmark_as_an_earlier_version_built_it_is_committed_too(
        shipped_tiny, tiny_benchmark, tmp_path):
    """A reference whose benchmark grew (more scored clips, the same train split) records the
    benchmark as it was in earlier_benchmarks: results on either are the committed judge, and
    installing the captioner beside either warns of nothing; a third benchmark still warns."""
    grown = build_benchmark(tmp_path / "grown" / tiny_benchmark.name, PRESETS["tiny"].__class__(
        **{**PRESETS["tiny"].__dict__, "test": 12}), progress=False)
    data = json.loads(judge.MANIFEST.read_text())
    record = data["captioners"][shipped_tiny]
    record["earlier_benchmarks"] = [{"sha256": record["benchmark_sha256"],
                                     "splits": {"test": 8}, "note": "before the test grew"}]
    record["benchmark_sha256"] = benchmark_sha256(grown)
    judge.MANIFEST.write_text(json.dumps(data))
    installed = reference.install_reference(shipped_tiny, tmp_path / "cache" / shipped_tiny)
    for bench, version in ((grown, "current"), (tiny_benchmark, "earlier")):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            reference.install_reference(shipped_tiny, tmp_path / "copy", benchmark_path=bench)
        record = judge_record(bench, installed)
        assert (record["matches_committed"], record["committed_benchmark"]) == (True, version)
        assert judge_warnings(record) == []
    assert "on the benchmark as an earlier version built it" in judge_line(record)
    other = build_benchmark(tmp_path / "other" / tiny_benchmark.name, PRESETS["tiny"].__class__(
        **{**PRESETS["tiny"].__dict__, "noise": 0.07}), progress=False)
    record = judge_record(other, installed)
    assert (record["matches_committed"], record["committed_benchmark"]) == (False, None)
    (problem,) = judge_warnings(record)
    assert f"(or the earlier {benchmark_sha256(tiny_benchmark)[:16]}...)" in problem


def test_every_shipped_default_reference_knows_both_benchmark_builds():
    """The default benchmarks grew to 1000 val and test clips (issue #33): each shipped record
    holds the new build's hash and the 200-clip build's, which the committed results before it
    were scored on (docs/results.md, "The judge"); one shipped after (seed 4) has only its own."""
    before = {"embedded-default-seed0": "64ae795e829a2075", "embedded-default-seed1":
              "8b2ce5ef7843a11f", "embedded-default-seed2": "83cc7bbd1f653ae4",
              "embedded-default-seed3": "bdb77d5cbc3a2f03"}
    for name, record in reference.references().items():
        if record["benchmark"] not in before:   # built after the growth (the deciding seed 4)
            assert not record.get("earlier_benchmarks"), name
            continue
        (earlier,) = record["earlier_benchmarks"]
        assert earlier["sha256"].startswith(before[record["benchmark"]])
        assert earlier["splits"] == {"train": 1661, "val": 200, "test": 200, "transfer": 200}
        assert record["benchmark_sha256"] != earlier["sha256"]


@pytest.mark.slow
def test_a_fresh_default_benchmark_is_the_committed_one(tmp_path):
    """What a fresh clone builds (the 1000-clip default, seed 0) has the recorded hash, and its
    shipped captioner installs beside it without a warning."""
    from avex.captioner.train import ensure_captioner

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        path = ensure_captioner("default", "default", cache_dir=tmp_path, progress=False)
    bench = ensure_benchmark("default", cache_dir=tmp_path, progress=False)
    record = judge_record(bench, path, cache_dir=tmp_path)
    assert (record["matches_committed"], record["committed_benchmark"]) == (True, "current")
    assert record["benchmark"]["path"] == "benchmarks/embedded-default-seed0"
    assert record["captioner"]["path"] == "captioners/embedded-default-seed0-default"
