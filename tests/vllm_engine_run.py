"""Run vLLM engines on the tiny Qwen2.5-VL of tests/vllm_tiny.py, one after another in this one
process, and save what they generate: ``python tests/vllm_engine_run.py SPEC OUT``.

SPEC (JSON): ``model``, ``max_tokens``, ``engines`` (name -> LLM keyword arguments, e.g.
``hf_overrides`` and ``max_num_batched_tokens``, and optionally ``request_retentions``: one
rho per prompt, sent as the request's ``mm_processor_kwargs``) and ``refusals`` (name ->
{"model": ..., LLM keyword arguments}: engines that must fail to start; their error is recorded). OUT (a
torch file): for each engine, per prompt, the greedy tokens and the log-probabilities of the
whole vocabulary at each step; for each refusal, the exception's type and message.

A separate process: vLLM's engine is a process tree of its own, and its start belongs under
``if __name__ == "__main__"``."""
import gc
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# The engine core in this process: every request is in before the first step, so the chunked
# prefill's chunks fall the same way each run (with the core in its own process they follow
# the requests' arrival). They put the end of prompt 1's image and the start of its video in
# one chunk, which vLLM's own position rewrite got wrong (tests/test_vllm_plugin.py).
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))


def engine_kwargs(model, **overrides):
    return dict(dict(model=model, dtype="float32", enforce_eager=True, max_model_len=1024,
                     max_num_seqs=4, limit_mm_per_prompt={"image": 2, "video": 1},
                     max_logprobs=-1, seed=0), **overrides)


def requests(model):
    from transformers import AutoTokenizer

    import vllm_tiny

    tokenizer = AutoTokenizer.from_pretrained(model)
    out = []
    for text, data in vllm_tiny.prompts(vllm_tiny.media()):
        out.append({"prompt_token_ids": tokenizer(text)["input_ids"], "multi_modal_data": data})
    return out


def main(spec_path, out_path):
    import torch
    from vllm import LLM, SamplingParams

    spec = json.loads(Path(spec_path).read_text())
    prompts = requests(spec["model"])
    vocab = spec["vocab"]
    params = SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"], logprobs=vocab,
                            ignore_eos=True, detokenize=False)
    results = {"engines": {}, "refusals": {}}
    for name, kwargs in spec.get("refusals", {}).items():
        try:
            llm = LLM(**engine_kwargs(**kwargs))
        except Exception as err:  # what the user sees: the type and the message
            results["refusals"][name] = (type(err).__name__, str(err))
        else:
            results["refusals"][name] = ("started", "")
            del llm
            gc.collect()
    for name, kwargs in spec["engines"].items():
        rates = kwargs.pop("request_retentions", None)
        llm = LLM(**engine_kwargs(spec["model"], **kwargs))
        asked = prompts if rates is None else [
            prompt if rho is None else dict(prompt, mm_processor_kwargs={"avex_retention": rho})
            for prompt, rho in zip(prompts, rates)]
        outputs = llm.generate(asked, params, use_tqdm=False)
        per_prompt = []
        for output in outputs:
            sample = output.outputs[0]
            steps = torch.full((len(sample.token_ids), vocab), float("nan"), dtype=torch.float64)
            for step, logprobs in enumerate(sample.logprobs):
                for token, entry in logprobs.items():
                    steps[step, token] = entry.logprob
            per_prompt.append({"tokens": list(sample.token_ids), "logprobs": steps,
                               "prompt_length": len(output.prompt_token_ids)})
        results["engines"][name] = per_prompt
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
    torch.save(results, out_path)


if __name__ == "__main__":
    main(*sys.argv[1:])
