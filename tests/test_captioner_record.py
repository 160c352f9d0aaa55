"""A run records the captioner it trained with (``<run>/captioner.json``: its path and the
SHA-256 of its weights); resuming the run, starting another from its warmup, or scoring its
policy with a captioner whose weights differ is refused, naming the run and both hashes."""
import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from avex.captioner import FrozenCaptioner
from avex.evaluate.__main__ import cli as evaluate_cli
from avex.judge_identity import captioner_sha256
from avex.policy import load_policy
from avex.run_files import CAPTIONER_RECORD_FILE, check_captioner
from avex.train import main
from badinput import exits_with_usage_error


@pytest.fixture(scope="module")
def trained(tiny_captioner, tiny_benchmark, tmp_path_factory):
    """A finished tiny run trained with a copy of the tiny captioner (same folder name)."""
    root = tmp_path_factory.mktemp("record")
    captioner = root / "copy" / tiny_captioner.name
    shutil.copytree(tiny_captioner, captioner)
    run = root / "run"
    main(["--data", str(tiny_benchmark), "--captioner", str(captioner), "--run-dir", str(run),
          "--batch-size", "8", "--micro-batch-size", "4", "--epochs", "0.5",
          "--warmup-epochs", "0.5", "--anchors", "2", "--no-evaluate", "--no-progress"])
    return run, captioner


def replace_weights(captioner) -> None:
    """The captioner's LM weights nudged: another captioner at the same path."""
    file = captioner / "model.safetensors"
    weights = load_file(str(file))
    name = sorted(weights)[0]
    weights[name] = weights[name] + 1e-3
    save_file(weights, str(file), metadata={"format": "pt"})


def test_a_run_records_its_captioner_and_refuses_another_at_that_path(trained, tiny_benchmark,
                                                                      tmp_path, capsys):
    run, captioner = trained
    record = json.loads((run / CAPTIONER_RECORD_FILE).read_text())
    assert record == {"path": str(captioner), "sha256": captioner_sha256(captioner)}
    load_policy(run, FrozenCaptioner.load(captioner, progress=False))   # the same: passes
    check_captioner(tmp_path, captioner, name="path")   # a run without a record: passes

    changed = tmp_path / "copy" / captioner.name
    shutil.copytree(captioner, changed)
    replace_weights(changed)
    new = captioner_sha256(changed)
    assert new != record["sha256"]
    refused = (rf"{{}}: {run} was trained with the captioner at {captioner} whose weights hash "
               rf"to {record['sha256'][:16]}, but the captioner at {changed} hashes to "
               rf"{new[:16]} \(replaced since")
    with pytest.raises(ValueError, match=refused.format("path")):
        load_policy(run, FrozenCaptioner.load(changed, progress=False))
    common = ["--data", str(tiny_benchmark), "--captioner", str(changed), "--batch-size", "8",
              "--micro-batch-size", "4", "--epochs", "0.5", "--no-evaluate", "--no-progress",
              "--anchors", "2"]
    # python -m avex.train refuses both before any file is written: usage errors
    exits_with_usage_error(main, [*common, "--run-dir", str(tmp_path / "next"), "--warmup-from",
                                  str(run)], refused.format("warmup_from"), capsys)
    assert not (tmp_path / "next").exists()
    # an experiment scoring the run with the other captioner: refused up front, no folder
    out = tmp_path / "ablation"
    exits_with_usage_error(evaluate_cli, [
        "ablation", "--data", str(tiny_benchmark), "--captioner", str(changed), "--variants",
        "Dc-fid", "--run", f"Dc-fid={run}", "--seeds", "0", "--retentions", "0.4", "--out",
        str(out), "--no-progress"], refused.format("--run Dc-fid"), capsys)
    assert not out.exists()
    # the run's own captioner replaced in place (as captioner install does): --resume refused
    # before a checkpoint or the record is touched
    replace_weights(captioner)
    before = {p: p.stat().st_mtime_ns for p in (run / "checkpoints").rglob("*")}
    exits_with_usage_error(main, ["--run-dir", str(run), "--resume", "--no-progress"],
                           rf"--resume: {run} was trained with the captioner at {captioner} "
                           rf"whose weights hash to {record['sha256'][:16]}, but the captioner "
                           rf"at {captioner} hashes to ", capsys)
    assert {p: p.stat().st_mtime_ns for p in (run / "checkpoints").rglob("*")} == before
    assert json.loads((run / CAPTIONER_RECORD_FILE).read_text()) == record


def test_a_corrupt_captioner_record_is_refused_naming_the_file(tiny_captioner, tmp_path):
    (tmp_path / CAPTIONER_RECORD_FILE).write_text("{not json")
    with pytest.raises(ValueError, match=rf"{tmp_path / CAPTIONER_RECORD_FILE}: corrupt or "
                                         "truncated captioner record"):
        check_captioner(tmp_path, tiny_captioner, name="path")
