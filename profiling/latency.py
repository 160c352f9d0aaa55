"""Prefill / end-to-end latency, selection overhead and peak memory, batch 1.

Every method runs the project's code (:mod:`avex.profiling.methods`): AVEX's policy and Top-K,
the selectors of :mod:`avex.methods`, then :func:`avex.prune_inputs` and
:func:`avex.generate`.

On CUDA the timings are CUDA events after warm-up, the median of many runs, and memory is
``torch.cuda.max_memory_allocated`` over one end-to-end run (everything allocated: weights,
activations, KV cache). On a CPU the timings are ``time.perf_counter`` medians, and memory is
the peak, during one end-to-end run, of the bytes of CPU tensors allocated in that run and not
yet freed (:func:`cpu_peak_bytes`, from the profiler's allocation events): activations, the KV
cache, logits and the selection's intermediates, **not** the weights or the inputs, which exist
before the run.

Every method decodes exactly ``decode_tokens`` tokens (greedy, ``min_new_tokens`` =
``max_new_tokens``), so end-to-end times compare the same amount of decoding.
"""
from __future__ import annotations

import contextlib
import gc
import os
import statistics
import time

import torch

from avex import _checks
from avex.pruning import generate

from .methods import selection


class Timer:
    def __init__(self, device: torch.device):
        if not isinstance(device, torch.device):
            raise TypeError(f"device must be a torch.device, got {type(device).__name__}: "
                            f"{device!r}")
        self.cuda = device.type == "cuda"

    def __call__(self, fn, runs: int, warmup: int, progress=None) -> float:
        """Median milliseconds of ``fn()`` over ``runs`` runs after ``warmup`` untimed ones."""
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        _checks.int_at_least("runs", runs, 1)  # a median of no runs is undefined
        _checks.int_at_least("warmup", warmup, 0)
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


@contextlib.contextmanager
def _quiet_stderr():
    """Silence file descriptor 2: the profiler's C++ side logs every start and stop there."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def cpu_peak_bytes(fn):
    """``(fn(), peak)``: the peak over the call of the bytes of CPU tensors allocated during it
    and still alive, from the profiler's allocation and free events in order. Tensors that
    exist before the call (weights, inputs) are not counted."""
    from torch.profiler import DeviceType, ProfilerActivity, profile

    gc.collect()
    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p:
        result = fn()
    events = [e for e in p.profiler.kineto_results.events()
              if e.name() == "[memory]" and e.device_type() == DeviceType.CPU]
    live = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        live += e.nbytes()   # negative for a free
        peak = max(peak, live)
    return result, peak


def _generate_kwargs(n: int) -> dict:
    return dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, num_beams=1)


def _peak_memory(e2e, device):
    """(tokens, bytes): CUDA, max allocated (weights included); CPU, :func:`cpu_peak_bytes`."""
    if device.type != "cuda":
        return cpu_peak_bytes(e2e)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    tokens = e2e()
    torch.cuda.synchronize()
    return tokens, torch.cuda.max_memory_allocated()


def measure(model, policy, inputs_embeds, modality, *, retention: float, decode_tokens: int,
            runs: int, warmup: int, methods=("full", "avex"), progress=None) -> dict:
    """Latency (ms) and peak memory per method; see the module docstring.

    Keys per method: ``prefill_ms`` (LLM prefill of the sequence the method feeds it),
    ``selection_ms`` (the method's scoring, selection and compaction; 0 for full), ``e2e_ms``
    (selection, prefill and ``decode_tokens`` greedy tokens), ``memory_bytes`` and
    ``memory_counts`` (what the peak includes), ``prefill_tokens``, ``generated_tokens``.
    """
    device = inputs_embeds.device
    timer = Timer(device)
    out = {}
    with torch.inference_mode():
        for method in methods:
            select = selection(method, model, policy, inputs_embeds, modality, retention)
            pruned = select()
            selection_ms = 0.0 if method == "full" else timer(select, runs, warmup, progress)

            def prefill(pruned=pruned):
                return model(inputs_embeds=pruned.inputs_embeds,
                             attention_mask=pruned.attention_mask,
                             position_ids=pruned.position_ids, use_cache=True, logits_to_keep=1)

            def e2e(select=select):
                return generate(model, select(), **_generate_kwargs(decode_tokens))

            prefill_ms = timer(prefill, runs, warmup, progress)
            e2e_ms = timer(e2e, runs, warmup, progress)
            tokens, memory = _peak_memory(e2e, device)
            generated = tokens.shape[-1]
            if generated != decode_tokens:
                raise RuntimeError(f"{method} generated {generated} tokens, expected the forced "
                                   f"{decode_tokens}")
            counts = ("all CUDA allocations (weights included)" if device.type == "cuda" else
                      "CPU tensors allocated during the run (weights and inputs excluded)")
            out[method] = dict(prefill_ms=prefill_ms, selection_ms=selection_ms, e2e_ms=e2e_ms,
                               memory_bytes=int(memory), memory_counts=counts,
                               prefill_tokens=int(pruned.inputs_embeds.shape[1]),
                               generated_tokens=generated)
    return out
