"""End-to-end latency by stage, measured in alternating rounds, and peak memory.

Every method runs the project's code (:mod:`avex.profiling.methods`): AVEX's policy and Top-K,
the selectors of :mod:`avex.methods`, then :func:`avex.prune_inputs` and
:func:`avex.generate`. Every method decodes exactly ``decode_tokens`` tokens (greedy,
``min_new_tokens`` = ``max_new_tokens``), so end-to-end times compare the same decoding.

**Alternating rounds.** On a shared machine the load drifts; timing all runs of one method and
then all of the other puts that drift into the comparison. :func:`alternate` runs every method
once per round, in turn, the order reversed every other round (A B, B A, ...), and a ratio is
taken within each round: the figures are the median of the per-round ratios and their
interquartile range (:func:`spread`).

**Stages.** One end-to-end run is timed with marks between its stages: the policy (AVEX), the
selection and compaction (``prune_inputs``), the prefill (until the forward that yields the
first new token returns, ``generate``'s set-up included: on the packed path, the packed pass
over all but the prompt's last column and then ``model.generate``'s forward of that column) and
the decode (the remaining forwards; per step: divided by their number). The compaction alone
(``prune_inputs`` with the chosen keep-set) is timed in the same round and split off the
selection. On CUDA the marks are CUDA events; on a CPU with one thread, the thread's CPU time
(:class:`Clock`; the wall-time ratio is reported beside it), else ``time.perf_counter``.

**Threads.** On a CPU the timing runs on ``OMP_NUM_THREADS`` threads when that is set, else on
one (:func:`timing_threads`): on a shared machine a parallel op waits for its slowest thread,
and one that is descheduled costs a time slice (measured on the 2-core project box under load:
an index_select of 344 x 256 float32 rows, 24 ms on 2 threads, 7 us on 1), which times the
load, not the work.

Memory: on CUDA ``torch.cuda.max_memory_allocated`` over one end-to-end run (everything
allocated: weights, activations, KV cache). On a CPU the peak, during one end-to-end run, of the
bytes of CPU tensors allocated in that run and not yet freed (:func:`cpu_peak_bytes`, from the
profiler's allocation events): activations, the KV cache, logits and the selection's
intermediates, **not** the weights or the inputs, which exist before the run.
"""
from __future__ import annotations

import contextlib
import gc
import os
import statistics
import time

import torch

from avex import _checks
from avex.pruning import generate, prune_inputs
from avex.tables import markdown_table

from .methods import selection

BASELINE = "full"


# ----------------------------------------------------------------------------------------------
# Timing: threads, clock, alternating rounds, spread
# ----------------------------------------------------------------------------------------------

def timing_threads() -> int:
    """CPU threads to time on: ``OMP_NUM_THREADS`` when set to a positive integer, else 1."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else 1


@contextlib.contextmanager
def timing_threads_set(device: torch.device, threads: int | None = None):
    """Run the block with ``threads`` (default :func:`timing_threads`) CPU threads; CUDA runs
    are left as they are. Yields the thread count in use."""
    if device.type == "cuda":
        yield torch.get_num_threads()
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(threads or timing_threads())
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(previous)


def clock_name(device: torch.device) -> str:
    """What :class:`Clock` measures with on ``device`` under the current thread setting."""
    if device.type == "cuda":
        return "CUDA events"
    if torch.get_num_threads() == 1:
        return "CPU time of the timing thread (time.thread_time)"
    return "wall time (time.perf_counter)"


class Clock:
    """Marks between the stages of one run; :meth:`stages` gives milliseconds per stage.

    CUDA: events. CPU on one thread: the thread's CPU time, which leaves out the time other
    processes hold the core (on one thread every op runs on the calling thread, so it counts
    all of the work); CPU on several threads: wall time."""

    def __init__(self, device: torch.device):
        if not isinstance(device, torch.device):
            raise TypeError(f"device must be a torch.device, got {type(device).__name__}: "
                            f"{device!r}")
        self.cuda = device.type == "cuda"
        self.now = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
        self.marks = []

    def _now(self):
        if not self.cuda:
            return self.now()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start(self):
        self.marks = [("start", self._now())]

    def mark(self, name: str):
        self.marks.append((name, self._now()))

    def stages(self) -> dict:
        if self.cuda:
            torch.cuda.synchronize()
        out = {}
        for (_, a), (name, b) in zip(self.marks, self.marks[1:]):
            out[name] = out.get(name, 0.0) + (a.elapsed_time(b) if self.cuda else (b - a) * 1e3)
        return out


def timed(fn, device: torch.device, repeat: int = 1):
    """``fn`` as a run for :func:`alternate`: ``{"ms": milliseconds per call}`` over ``repeat``
    back-to-back calls."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    _checks.int_at_least("repeat", repeat, 1)  # no call would be timed
    clock = Clock(device)

    def run():
        clock.start()
        for _ in range(repeat):
            fn()
        clock.mark("ms")
        return {"ms": clock.stages()["ms"] / repeat}
    return run


def alternate(runs: dict, rounds: int, warmup: int = 1, progress=None,
              deadline: float | None = None) -> dict:
    """Call every run once per round, in turn, the order reversed every other round (A B, B A,
    ...), after ``warmup`` untimed rounds. Each run returns a dict of its own timings; the
    result maps each run's name to its ``rounds`` dicts, round by round. With ``deadline`` (a
    ``time.monotonic()`` value), no timed round starts after it (one always runs), so fewer
    than ``rounds`` may come back."""
    _checks.int_at_least("rounds", rounds, 1)  # a median of no rounds is undefined
    _checks.int_at_least("warmup", warmup, 0)
    names = list(runs)
    out = {name: [] for name in names}
    for r in range(warmup + rounds):
        if r > warmup and deadline is not None and time.monotonic() >= deadline:
            break
        for name in (names if r % 2 == 0 else names[::-1]):
            result = runs[name]()
            if r >= warmup:
                out[name].append(result)
            if progress is not None:
                progress.update(1)
    return out


def spread(values) -> dict:
    """Median and interquartile range of ``values``: ``{median, q1, q3, n}``."""
    values = list(values)
    if len(values) == 1:
        q1 = q3 = values[0]
    else:
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return dict(median=statistics.median(values), q1=q1, q3=q3, n=len(values))


def paired_ratio(numerator: list, denominator: list, key: str = "ms") -> dict:
    """:func:`spread` of ``numerator[i][key] / denominator[i][key]`` over the rounds i."""
    return spread(a[key] / b[key] for a, b in zip(numerator, denominator))


# ----------------------------------------------------------------------------------------------
# Memory
# ----------------------------------------------------------------------------------------------

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


def _peak_memory(e2e, device):
    """(tokens, bytes): CUDA, max allocated (weights included); CPU, :func:`cpu_peak_bytes`."""
    if device.type != "cuda":
        return cpu_peak_bytes(e2e)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    tokens = e2e()
    torch.cuda.synchronize()
    return tokens, torch.cuda.max_memory_allocated()


# ----------------------------------------------------------------------------------------------
# End to end
# ----------------------------------------------------------------------------------------------

def _generate_kwargs(n: int) -> dict:
    return dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, num_beams=1)


def _staged_run(model, select, inputs_embeds, modality, decode_tokens, device):
    """One end-to-end run of a method, timed by stage (see the module docstring)."""
    clock = Clock(device)
    forwards = []

    def after_forward(_module, _args, kwargs, _output):
        # The packed prefill's pass (it alone takes cu_seq_lens_q) yields no token: the prefill
        # ends with the first forward after it, which does.
        if "cu_seq_lens_q" in kwargs:
            return
        forwards.append(1)
        if len(forwards) == 1:
            clock.mark("prefill")

    def run():
        forwards.clear()
        wall = time.perf_counter()
        clock.start()
        pruned = select(clock.mark)
        clock.mark("selection")
        handle = model.register_forward_hook(after_forward, with_kwargs=True)
        try:
            tokens = generate(model, pruned, **_generate_kwargs(decode_tokens))
        finally:
            handle.remove()
        clock.mark("decode")
        if clock.cuda:
            torch.cuda.synchronize()
        wall = (time.perf_counter() - wall) * 1e3
        stages = clock.stages()
        stages["ms"] = sum(stages.values())
        stages["wall_ms"] = wall
        clock.start()   # the compaction alone, to split it off the selection
        prune_inputs(inputs_embeds, modality, keep=pruned.keep)
        clock.mark("compaction")
        stages["compaction"] = clock.stages()["compaction"]
        stages["selection"] -= stages["compaction"]
        stages["decode_steps"] = len(forwards) - 1
        stages["decode_step"] = stages["decode"] / max(1, len(forwards) - 1)
        stages["generated"] = tokens.shape[-1]
        return stages
    return run


def measure(model, policy, inputs_embeds, modality, *, retention: float, decode_tokens: int,
            runs: int, warmup: int, methods=("full", "avex"), progress=None,
            memory: bool = True, threads: int | None = None,
            deadline: float | None = None) -> dict:
    """Latency (ms) by stage, ratios to full tokens, and peak memory, per method; see the module
    docstring. ``runs``: alternating rounds (each runs every method once); ``deadline``: no
    round starts after this ``time.monotonic()`` value (:func:`alternate`).

    Keys per method: ``e2e_ms`` (median end to end), ``prefill_ms``, ``decode_step_ms`` (median
    per decode step), ``selection_ms`` (everything before ``generate``: policy, selection and
    compaction), ``stages_ms`` and ``shares`` (median per stage, and its share of their sum:
    ``policy`` (AVEX), ``selection``, ``compaction``, ``prefill``, ``decode``), ``vs_full``
    (``e2e``, ``prefill``, ``decode_step``: :func:`spread` of the per-round ratio to full
    tokens; absent for full, or when full is not among ``methods``; ``e2e_wall``: the same by
    wall time), ``e2e_wall_ms``, ``memory_bytes`` and ``memory_counts`` (None without
    ``memory``), ``prefill_tokens``, ``generated_tokens``, ``rounds``, ``threads``, ``clock``
    (:func:`clock_name`).
    """
    device = inputs_embeds.device
    with torch.inference_mode(), timing_threads_set(device, threads) as used_threads:
        selects = {m: selection(m, model, policy, inputs_embeds, modality, retention)
                   for m in methods}
        tokens_in = {m: int(select().inputs_embeds.shape[1]) for m, select in selects.items()}
        rows = alternate({m: _staged_run(model, selects[m], inputs_embeds, modality,
                                         decode_tokens, device) for m in methods},
                         rounds=runs, warmup=warmup, progress=progress, deadline=deadline)
        out = {}
        for method in methods:
            done = rows[method]
            generated = {r["generated"] for r in done}
            if generated != {decode_tokens}:
                raise RuntimeError(f"{method} generated {sorted(generated)} tokens, expected "
                                   f"the forced {decode_tokens}")
            names = [n for n in ("policy", "selection", "compaction", "prefill", "decode")
                     if n in done[0]]
            stages = {n: statistics.median(r[n] for r in done) for n in names}
            if method == BASELINE:   # no selection: its pre-generate stage is the compaction
                stages.pop("selection")
            total = sum(stages.values())
            row = dict(e2e_ms=statistics.median(r["ms"] for r in done),
                       prefill_ms=stages["prefill"],
                       decode_step_ms=statistics.median(r["decode_step"] for r in done),
                       decode_steps=done[0]["decode_steps"],
                       selection_ms=statistics.median(
                           r["ms"] - r["prefill"] - r["decode"] for r in done),
                       stages_ms=stages, shares={n: v / total for n, v in stages.items()},
                       prefill_tokens=tokens_in[method], generated_tokens=decode_tokens,
                       e2e_wall_ms=statistics.median(r["wall_ms"] for r in done),
                       rounds=len(done), threads=used_threads, clock=clock_name(device),
                       memory_bytes=None, memory_counts=None)
            if method != BASELINE and BASELINE in rows:
                base = rows[BASELINE]
                row["vs_full"] = {key: paired_ratio(done, base, k) for key, k in (
                    ("e2e", "ms"), ("prefill", "prefill"), ("decode_step", "decode_step"),
                    ("e2e_wall", "wall_ms"))}
            out[method] = row
        if memory:
            for method in methods:
                select = selects[method]
                _, peak = _peak_memory(
                    lambda: generate(model, select(), **_generate_kwargs(decode_tokens)), device)
                out[method]["memory_bytes"] = int(peak)
                out[method]["memory_counts"] = (
                    "all CUDA allocations (weights included)" if device.type == "cuda" else
                    "CPU tensors allocated during the run (weights and inputs excluded)")
                if progress is not None:
                    progress.update(1)
    return out


# ----------------------------------------------------------------------------------------------
# Reporting
# ----------------------------------------------------------------------------------------------

STAGES = ("policy", "selection", "compaction", "prefill", "decode")


def ratio_text(s: dict | None) -> str:
    """A :func:`spread` as ``0.83 (IQR 0.80-0.86)``; ``-`` for none."""
    if not s:
        return "-"
    return f"{s['median']:.2f} (IQR {s['q1']:.2f}-{s['q3']:.2f})"


def stage_table(rows: dict, names: dict | None = None) -> str:
    """Markdown: per method, its stages' median ms and share of the run, the decode step, and
    the per-round ratios to full tokens (e2e, prefill, decode step)."""
    body = []
    for method, r in rows.items():
        cells = [f"{r['stages_ms'][n]:.1f} ({r['shares'][n]:.0%})" if n in r["stages_ms"]
                 else "-" for n in STAGES]
        vs = r.get("vs_full", {})
        body.append([(names or {}).get(method, method), r["prefill_tokens"], *cells,
                     f"{r['decode_step_ms']:.2f}", f"{r['e2e_ms']:.1f}",
                     ratio_text(vs.get("e2e")), ratio_text(vs.get("prefill")),
                     ratio_text(vs.get("decode_step")), ratio_text(vs.get("e2e_wall"))])
    return markdown_table(
        ["method", "prefill tokens", *(f"{n} ms (share)" for n in STAGES), "decode step ms",
         "end to end ms", "end to end / full", "prefill / full", "decode step / full",
         "end to end / full, wall time"], body)


def ratio_table(results: dict, baseline: str) -> str:
    """Markdown for :func:`alternate` results of :func:`timed` runs: each run's median ms and
    the per-round ratio to ``baseline`` (median and IQR)."""
    base = results[baseline]
    return markdown_table(
        ["implementation", "median ms", f"ratio to {baseline}"],
        [[name, f"{statistics.median(r['ms'] for r in rows):.4g}",
          "1" if name == baseline else ratio_text(paired_ratio(rows, base))]
         for name, rows in results.items()])
