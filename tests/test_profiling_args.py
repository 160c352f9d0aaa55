"""``--backbone`` configs the profiling suite and the policy counter can't size, and prompts the
profiling suite can't lay out, are usage errors up front (no model is built)."""
import json

import pytest

from avex.backbones import backbone_config, check_decoder_config
from avex.policy.__main__ import main as policy_main
from avex.profiling import ProfileSettings
from avex.profiling.__main__ import main as profiling_main
from badinput import exits_with_usage_error

DECODER = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
               max_position_embeddings=256)


def _save(folder, config) -> str:
    config.save_pretrained(str(folder))
    return str(folder)


def _write(folder, fields: dict) -> str:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(fields), encoding="utf-8")
    return str(folder)


def _gpt2(path):
    from transformers import GPT2Config

    return _save(path, GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128))


def _bert(path):
    from transformers import BertConfig

    return _save(path, BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, vocab_size=128))


def _qwen2_5_vl(path):
    from transformers import Qwen2_5_VLConfig

    text = {k: v for k, v in DECODER.items() if k != "max_position_embeddings"}
    return _save(path, Qwen2_5_VLConfig(text_config=text))


def _qwen2_moe(path):
    from transformers import Qwen2MoeConfig

    return _save(path, Qwen2MoeConfig(**DECODER, num_experts=4, num_experts_per_tok=2,
                                      moe_intermediate_size=32))


def _mixtral(path):
    from transformers import MixtralConfig

    return _save(path, MixtralConfig(**DECODER, num_local_experts=8, num_experts_per_tok=2))


UNSUPPORTED = [
    (_gpt2, r"backbone '.*' \(--backbone\): GPT2Config has no intermediate_size"),
    (_bert, r"backbone '.*' \(--backbone\): BertConfig has no num_key_value_heads"),
    (_qwen2_5_vl, r"backbone '.*' \(--backbone\): a composite Qwen2_5_VLConfig .*text_config"),
    (lambda p: _write(p, dict(DECODER, model_type="qwen2", hidden_size=66)),
     r"\(--backbone\): hidden_size 66 is not divisible by num_attention_heads 4"),
    (lambda p: _write(p, dict(DECODER, model_type="llama", hidden_size=66)),
     r"\(--backbone\): transformers refuses .*config\.json: .*hidden size \(66\)"),
    (lambda p: _write(p, dict(DECODER, model_type="qwen2", num_key_value_heads=3)),
     r"\(--backbone\): num_attention_heads 4 is not divisible by num_key_value_heads 3"),
    (_qwen2_moe, r"\(--backbone\): Qwen2MoeConfig is a mixture of experts \(num_experts=4, "
                 r"moe_intermediate_size=32\); these tools size dense decoder layers"),
    (_mixtral, r"\(--backbone\): MixtralConfig is a mixture of experts \(num_local_experts=8\)"),
]
IDS = ["gpt2", "bert", "qwen2.5-vl", "qwen2 66/4", "llama 66/4", "qwen2 kv 3", "qwen2-moe",
       "mixtral"]


@pytest.mark.parametrize("make, match", UNSUPPORTED, ids=IDS)
@pytest.mark.parametrize("main", [profiling_main, policy_main], ids=["profiling", "policy"])
def test_unsupported_backbone_config_is_a_usage_error(main, make, match, tmp_path, capsys):
    path = make(tmp_path / "backbone")
    argv = ["--backbone", path]
    if main is profiling_main:
        argv += ["--out-dir", str(tmp_path / "out"), "--no-progress"]
    exits_with_usage_error(main, argv, match, capsys)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("make, match", UNSUPPORTED, ids=IDS)
def test_unsupported_backbone_config_is_refused_by_settings(make, match, tmp_path):
    path = make(tmp_path / "backbone")
    with pytest.raises(ValueError, match=match):
        ProfileSettings(backbone=path, out_dir=str(tmp_path / "out")).validate()


def test_a_decoder_config_passes(tmp_path, capsys):
    path = _write(tmp_path / "backbone", dict(DECODER, model_type="qwen2"))
    assert backbone_config(path).hidden_size == 64
    for name in ("qwen2-7b", "llama3-8b"):
        assert check_decoder_config(backbone_config(name)) is not None
    assert policy_main(["--backbone", path]) > 0


def test_no_text_tokens_is_refused_up_front(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"--text-before, --text-after\) must be >= 1"):
        ProfileSettings(text_before=0, text_after=0, out_dir=str(tmp_path)).validate()
    ProfileSettings(text_before=0, text_after=1, out_dir=str(tmp_path)).validate()
    exits_with_usage_error(profiling_main, ["--text-before", "0", "--text-after", "0",
                                            "--out-dir", str(tmp_path / "out")],
                           r"text_before \+ text_after \(--text-before, --text-after\) must be "
                           r">= 1.*got 0 \+ 0", capsys)


def test_a_prompt_past_the_backbone_positions_is_refused(tmp_path, capsys):
    exits_with_usage_error(
        profiling_main, ["--backbone", "llama3-8b", "--visual-tokens", "10000",
                         "--out-dir", str(tmp_path / "out"), "--no-progress"],
        r"prompt \(10088 tokens.*\+ decode_tokens 64 = 10152 positions, over the "
        r"max_position_embeddings 8192 of backbone 'llama3-8b'", capsys)
    assert not (tmp_path / "out").exists()
    path = _write(tmp_path / "backbone", dict(DECODER, model_type="qwen2"))
    fits = dict(backbone=path, visual_tokens=200, audio_tokens=8, text_before=2, text_after=4,
                out_dir=str(tmp_path))
    ProfileSettings(**fits, decode_tokens=42).validate()     # 256 positions: the limit
    with pytest.raises(ValueError, match="257 positions, over the max_position_embeddings 256"):
        ProfileSettings(**fits, decode_tokens=43).validate()
