"""examples/train_once_prune_anywhere.py runs end to end on tiny models of three families by
the documented commands (media files -> python -m avex.data export, and the same export from
two processes under torchrun -> python -m avex.train -> avex.load_policy ->
adapt(...).prune(policy=) -> generate), and the keep-set it serves is the one python -m
avex.evaluate scores for the same clip and retention."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from avex.evaluate import sweep
from avex.evaluate.__main__ import main as evaluate_main
from avex.modality import AUDIO, VISUAL
from avex.selection import Selection
from file_module import load_file

pytest.importorskip("av", reason="the example writes and reads media with PyAV (the media "
                                 "extra)")
pytest.importorskip("soundfile", reason="the example writes WAV with soundfile (the media "
                                        "extra)")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_once_prune_anywhere.py"


def load_example():
    return load_file(EXAMPLE)


def torchrun_export(workdir: Path, out: Path, processes: int = 2):
    """python -m avex.data export of the example's media, from ``processes`` processes."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(processes), "-m", "avex.data", "export", "--media",
               str(workdir / "media"), "--captions", str(workdir / "media" / "captions.jsonl"),
               "--model", str(workdir / "model"), "--out", str(out), "--no-progress"]
    return subprocess.run(command, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def same_cache(one: Path, other: Path) -> None:
    from avex.data import FeatureCache

    a, b = FeatureCache(one), FeatureCache(other, verify="hash")
    assert a.clip_ids == b.clip_ids and [r["refs_av"] for r in a.rows] == \
        [r["refs_av"] for r in b.rows]
    for x, y in zip(a, b):
        for key in ("inputs_embeds", "modality", "position_ids"):
            assert (x.merged[key] is None and y.merged[key] is None) or \
                torch.equal(x.merged[key], y.merged[key]), (x.clip_id, key)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2_5_omni", "qwen2_5_vl", "qwen2_audio"])
def test_example_serves_the_keep_set_evaluate_scores(family, tmp_path, monkeypatch):
    example = load_example()
    out = example.run(family, tmp_path)
    layout = json.loads((out["run_dir"] / "policy.json").read_text())["trained_on"]["layout"]
    assert layout == {"qwen2_5_omni": "interleaved", "qwen2_5_vl": "visual",
                      "qwen2_audio": "audio"}[family]
    done = torchrun_export(tmp_path, tmp_path / "cache2")
    assert done.returncode == 0, done.stderr[-3000:]
    same_cache(out["cache"], tmp_path / "cache2")
    assert (out["run_dir"] / "policy" / "model.safetensors").is_file()
    assert out["tokens"].shape == (1, 4)

    # what evaluate scores: the keep-set its selector hands the captioner, per clip
    scored = {}
    real = sweep.make_selector

    def recording(name, **kwargs):
        select = real(name, **kwargs)

        def wrapped(batch, layout, retention):
            keep = select(batch, layout, retention)
            # a merging policy hands a Selection (its keep-set and the merged embeddings)
            mask = keep.keep if isinstance(keep, Selection) else keep
            for row, clip_id in enumerate(batch.clip_ids):
                scored[(clip_id, retention)] = mask[row, :int(layout.counts[row])].cpu()
            return keep
        return wrapped

    monkeypatch.setattr(sweep, "make_selector", recording)
    evaluate_main(["sweep", "--data", str(out["cache"]), "--captioner", str(out["model_dir"]),
                   "--avex-run", str(out["run_dir"]), "--methods", "avex", "--retentions",
                   str(example.RETENTION), "--transfer-split", "none", "--qualitative", "0",
                   "--device", "cpu", "--out", str(tmp_path / "eval"), "--no-progress"])
    codes = out["served_modality"]
    served = out["pruned"].keep[0, 0][(codes == VISUAL) | (codes == AUDIO)]
    assert torch.equal(served, scored[(out["clip_id"], example.RETENTION)])
    assert int(served.sum()) < served.numel()
