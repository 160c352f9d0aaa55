"""vLLM throughput with AVEX pruning at 40% retention against unpruned vLLM (the named
baseline), on the CPU, in one process: requests/s over a batch of video requests, and time to
first token (TTFT) of one request at a time.

    OMP_NUM_THREADS=2 .venv-vllm/bin/python bench/vllm_throughput.py --out bench/results/vllm_throughput.md

(``make test-vllm`` builds .venv-vllm.) The model is a random-weight Qwen2.5-VL scaled for a
CPU: Qwen2.5-VL-3B's widths (text 2048 wide, 16 heads, 2 KV heads, MLP 11008; vision 1280
wide, 16 heads, patch 14, merge 2) with 4 of its 36 decoder layers and 4 of its vision
tower's 32 blocks, and the tiny test tokenizer's 200-word vocabulary (tests/vllm_tiny.py). A
request is an 8-frame 224 x 224 video (256 visual tokens) with a short text prompt, 16
greedy tokens out. Pruning acts after the vision tower, so the tower's time is the same on
both sides and is included: this is end to end.

Both engines stay up; rounds alternate between them (unpruned, pruned, unpruned, ...), so a
change in the machine's load hits both, and the ratio is taken per round: the reported
figures are medians over rounds. The machine's load average is recorded before and after.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.pop("TRITON_INTERPRET", None)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

TEXT = dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=4,
            num_attention_heads=16, num_key_value_heads=2, initializer_range=0.02)
VISION = dict(depth=4, hidden_size=1280, intermediate_size=3420, num_heads=16, patch_size=14,
              spatial_merge_size=2, temporal_patch_size=2, window_size=112,
              fullatt_block_indexes=[3], tokens_per_second=2)
RETENTION = 0.4


def build(folder: Path):
    import vllm_tiny

    model = vllm_tiny.build_checkpoint(folder / "model", text=TEXT, vision=VISION)
    # the processor of the tiny checkpoint has patch size 2: give it the model's
    from transformers import AutoProcessor
    processor = AutoProcessor.from_pretrained(model)
    for part in (processor.image_processor, processor.video_processor):
        part.patch_size = VISION["patch_size"]
        part.size = {"shortest_edge": 56 * 56, "longest_edge": 448 * 448}
    processor.save_pretrained(model)
    policy = vllm_tiny.build_policy(folder / "policy", model)
    return model, policy


def requests(model, count, frames, size, seed):
    import numpy as np
    from transformers import AutoTokenizer

    import vllm_tiny

    tokenizer = AutoTokenizer.from_pretrained(model)
    ids = tokenizer(f"w3 w4 w5 {vllm_tiny.VIDEO} w6 w7 w8 w9")["input_ids"]
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):  # distinct videos: no encoder or prefix cache hits
        video = rng.integers(0, 255, (frames, size, size, 3), dtype=np.uint8)
        metadata = {"total_num_frames": frames, "fps": vllm_tiny.FPS,
                    "duration": frames / vllm_tiny.FPS, "video_backend": "opencv",
                    "frames_indices": list(range(frames)), "do_sample_frames": False}
        out.append({"prompt_token_ids": ids, "multi_modal_data": {"video": [(video, metadata)]}})
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4, help="requests per throughput round")
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    from vllm import LLM, SamplingParams

    from avex.integrations.vllm import hf_overrides

    work = Path(tempfile.mkdtemp(prefix="avex-vllm-bench-"))
    model, policy = build(work)
    common = dict(model=str(model), dtype="float32", enforce_eager=True, max_model_len=2048,
                  max_num_seqs=args.batch, limit_mm_per_prompt={"video": 1}, seed=0,
                  enable_prefix_caching=False)
    load_before = os.getloadavg()
    engines = {"unpruned vLLM": LLM(**common),
               f"AVEX {RETENTION:.0%}": LLM(**common, hf_overrides=hf_overrides(
                   model, policy=policy, retention=RETENTION))}
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True,
                            detokenize=False)
    first = SamplingParams(temperature=0.0, max_tokens=1, detokenize=False)
    per_round = {name: {"req/s": [], "ttft s": [], "prompt tokens": None} for name in engines}
    for name, llm in engines.items():  # warm-up: one request each
        llm.generate(requests(model, 1, args.frames, args.size, 99), first, use_tqdm=False)
    for r in range(args.rounds):
        for name, llm in engines.items():
            batch = requests(model, args.batch, args.frames, args.size, seed=r)
            start = time.perf_counter()
            outputs = llm.generate(batch, greedy, use_tqdm=False)
            per_round[name]["req/s"].append(len(batch) / (time.perf_counter() - start))
            per_round[name]["prompt tokens"] = len(outputs[0].prompt_token_ids)
            single = requests(model, 1, args.frames, args.size, seed=1000 + r)
            start = time.perf_counter()
            llm.generate(single, first, use_tqdm=False)
            per_round[name]["ttft s"].append(time.perf_counter() - start)
    load_after = os.getloadavg()
    base, pruned = list(engines)
    rows = []
    for metric in ("req/s", "ttft s"):
        ratios = [p / b for p, b in zip(per_round[pruned][metric], per_round[base][metric])]
        rows.append((metric, statistics.median(per_round[base][metric]),
                     statistics.median(per_round[pruned][metric]), statistics.median(ratios),
                     min(ratios), max(ratios)))
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    lines = [
        f"# vLLM throughput: AVEX at {RETENTION:.0%} against unpruned vLLM (CPU)",
        "",
        f"- when: {datetime.datetime.now().isoformat(timespec='minutes')}, commit {commit}, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}",
        f"- load average (1, 5, 15 min): before {tuple(round(x, 2) for x in load_before)}, "
        f"after {tuple(round(x, 2) for x in load_after)}",
        f"- model: random-weight Qwen2.5-VL, CPU-scaled 3B (text {TEXT}, vision {VISION})",
        f"- requests: a video of {args.frames} frames, {args.size}x{args.size}, + text, "
        f"{args.max_tokens} greedy tokens; throughput over batches of {args.batch}; TTFT: one "
        f"request at a time, max_tokens=1; {args.rounds} rounds alternating the engines",
        f"- prompt tokens per request: unpruned {per_round[base]['prompt tokens']}, "
        f"pruned {per_round[pruned]['prompt tokens']}",
        "- command: `OMP_NUM_THREADS=2 .venv-vllm/bin/python bench/vllm_throughput.py "
        "--out bench/results/vllm_throughput.md`",
        "",
        f"| metric | {base} | {pruned} | ratio (median per round) | ratio min..max |",
        "|---|---|---|---|---|",
    ]
    for metric, b, p, ratio, low, high in rows:
        lines.append(f"| {metric} | {b:.3f} | {p:.3f} | {ratio:.2f}x | {low:.2f}..{high:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    for llm in engines.values():
        llm.llm_engine.engine_core.shutdown()
    engines.clear()
    gc.collect()


if __name__ == "__main__":
    main()
