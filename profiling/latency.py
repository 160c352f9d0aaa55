"""Prefill / end-to-end latency, policy overhead and peak memory, batch 1.

On CUDA the timings are CUDA events after warm-up, the median of many runs, and memory is
``torch.cuda.max_memory_allocated`` over one end-to-end run. On a CPU the timings are
``time.perf_counter`` medians; there is no allocator statistic like CUDA's, so ``memory_gb``
is None and ``cpu_rss_growth_gb`` records how far the process's resident set size rises
during one end-to-end run (Linux: peak ``VmHWM``, reset through ``/proc/self/clear_refs``,
minus ``VmRSS`` before it). After warm-up that is ~0: the allocator reuses freed memory, so it
is not a peak-memory figure.

Every method decodes exactly ``decode_tokens`` tokens (greedy, ``min_new_tokens`` =
``max_new_tokens``), so end-to-end times compare the same amount of decoding.
"""
from __future__ import annotations

import statistics
import time

import torch

from avex.pruning import generate, prune_inputs


class Timer:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn, runs: int, warmup: int, progress=None) -> float:
        """Median milliseconds of ``fn()`` over ``runs`` runs after ``warmup`` untimed ones."""
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(runs):
            if self.cuda:
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                    enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
            if progress is not None:
                progress.update(1)
        return statistics.median(times)


def _reset_peak_rss() -> bool:
    """Reset this process's peak resident set size (Linux: ``/proc/self/clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _status_gb(field: str):
    """A ``/proc/self/status`` size field (``VmRSS:``, ``VmHWM:``) in GB; None if unavailable."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024 / 2**30
    except OSError:
        pass
    return None


def _generate_kwargs(n: int) -> dict:
    return dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, num_beams=1)


def measure(model, policy, inputs_embeds, modality, *, retention: float, decode_tokens: int,
            runs: int, warmup: int, methods=("full", "avex"), progress=None) -> dict:
    """Latency (ms) and peak memory (GB, CUDA only) per method; see the module docstring.

    Keys per method: ``prefill_ms`` (LLM prefill of the sequence the method feeds it),
    ``policy_ms`` (scoring + Top-K selection + compaction; 0 for full), ``e2e_ms`` (policy,
    selection, compaction, prefill and ``decode_tokens`` greedy tokens), ``memory_gb`` (CUDA
    peak allocated; None on CPU), ``cpu_rss_growth_gb``,
    ``prefill_tokens``, ``generated_tokens``.
    """
    device = inputs_embeds.device
    timer = Timer(device)
    out = {}
    full_keep = torch.ones_like(modality, dtype=torch.bool) & (modality >= 0)

    def select():
        scores = policy(inputs_embeds, modality)
        return prune_inputs(inputs_embeds, modality, scores=scores, retention=retention)

    with torch.inference_mode():
        for method in methods:
            if method == "full":
                pruned = prune_inputs(inputs_embeds, modality, keep=full_keep)
                policy_ms = 0.0

                def e2e(pruned=pruned):
                    return generate(model, pruned, **_generate_kwargs(decode_tokens))
            elif method == "avex":
                pruned = select()
                policy_ms = timer(select, runs, warmup, progress)

                def e2e():
                    return generate(model, select(), **_generate_kwargs(decode_tokens))
            else:
                raise ValueError(f"methods: latency is implemented for 'full' and 'avex', got "
                                 f"{method!r}")

            def prefill(pruned=pruned):
                return model(inputs_embeds=pruned.inputs_embeds,
                             attention_mask=pruned.attention_mask,
                             position_ids=pruned.position_ids, use_cache=True, logits_to_keep=1)

            prefill_ms = timer(prefill, runs, warmup, progress)
            e2e_ms = timer(e2e, runs, warmup, progress)
            memory = rss_growth = None
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                tokens = e2e()
                torch.cuda.synchronize()
                memory = torch.cuda.max_memory_allocated() / 2**30
            else:
                reset = _reset_peak_rss()
                before = _status_gb("VmRSS:")
                tokens = e2e()
                peak = _status_gb("VmHWM:")
                rss_growth = peak - before if reset and peak is not None else None
            generated = tokens.shape[-1]
            if generated != decode_tokens:
                raise RuntimeError(f"{method} generated {generated} tokens, expected the forced "
                                   f"{decode_tokens}")
            out[method] = dict(prefill_ms=prefill_ms, policy_ms=policy_ms, e2e_ms=e2e_ms,
                               memory_gb=memory, prefill_tokens=int(pruned.inputs_embeds.shape[1]),
                               generated_tokens=generated, cpu_rss_growth_gb=rss_growth)
    return out
