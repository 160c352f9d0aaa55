"""examples/train_once_prune_anywhere.py runs end to end on both tiny models (media files ->
export -> python -m avex.train -> avex.load_policy -> adapt(...).prune(policy=) -> generate),
and the keep-set it serves is the one python -m avex.evaluate scores for the same clip and
retention."""
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from avex.evaluate import sweep
from avex.evaluate.__main__ import main as evaluate_main
from avex.modality import AUDIO, VISUAL

pytest.importorskip("av", reason="the example writes and reads media with PyAV (the media "
                                 "extra)")
pytest.importorskip("soundfile", reason="the example writes WAV with soundfile (the media "
                                        "extra)")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_once_prune_anywhere.py"


def load_example():
    spec = importlib.util.spec_from_file_location("train_once_prune_anywhere", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2_5_omni", "qwen2_5_vl"])
def test_example_serves_the_keep_set_evaluate_scores(family, tmp_path, monkeypatch):
    example = load_example()
    out = example.run(family, tmp_path)
    layout = json.loads((out["run_dir"] / "policy.json").read_text())["trained_on"]["layout"]
    assert layout == ("interleaved" if family == "qwen2_5_omni" else "visual")
    assert (out["run_dir"] / "policy" / "model.safetensors").is_file()
    assert out["tokens"].shape == (1, 4)

    # what evaluate scores: the keep-set its selector hands the captioner, per clip
    scored = {}
    real = sweep.make_selector

    def recording(name, **kwargs):
        select = real(name, **kwargs)

        def wrapped(batch, layout, retention):
            keep = select(batch, layout, retention)
            for row, clip_id in enumerate(batch.clip_ids):
                scored[(clip_id, retention)] = keep[row, :int(layout.counts[row])].cpu()
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
