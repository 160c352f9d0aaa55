"""The profiling run behind ``python -m avex.profiling``: tables, JSON and chart (its settings:
:mod:`avex.profiling.settings`)."""
from __future__ import annotations

import copy
import datetime
import json
import os
import platform
import subprocess
import time
import types
from dataclasses import asdict

import torch

from avex.backbones import backbone_config
from avex.methods.fastv import DEFAULT_LAYER as FASTV_LAYER
from avex.policy import AVEXPolicy
from avex.progress import progress_bar
from avex.selection import num_kept
from avex.tables import markdown_table

from . import flops as F
from .latency import measure, ratio_text, stage_table
from .methods import NAMES as METHOD_NAMES
from .settings import DTYPES, ProfileSettings, token_layout

CPU_WIDTH, CPU_LAYERS = 512, 4


def scaled_config(config, width: int = CPU_WIDTH, layers: int = CPU_LAYERS):
    """The backbone scaled down for a CPU: width ``width`` (heads and the MLP scaled by the same
    factor, head size kept), ``layers`` decoder layers, the real vocabulary."""
    c = copy.deepcopy(config)
    factor = c.hidden_size / width
    heads = max(1, round(c.num_attention_heads / factor))
    kv = max(1, round(c.num_key_value_heads / factor))
    while heads % kv:
        kv -= 1
    c.head_dim = width // heads
    c.hidden_size = width
    c.num_attention_heads, c.num_key_value_heads = heads, kv
    c.intermediate_size = int(round(c.intermediate_size / factor / 64)) * 64
    c.num_hidden_layers = min(layers, c.num_hidden_layers)
    if getattr(c, "layer_types", None) is not None:
        c.layer_types = list(c.layer_types)[:c.num_hidden_layers]
    return c


def _policy(config, width: int, dtype=torch.float32, device="cpu", *, selection="topk",
            redundancy=0.0):

    llm = types.SimpleNamespace(config=config)
    with torch.device(device):
        policy = AVEXPolicy.from_llm(llm, hidden_size=width or None, init_from_llm=False,
                                     selection=selection, redundancy=redundancy)
    return policy.to(dtype).eval()


def latency_inputs(config, policy_width: int, modality: torch.Tensor, *,
                   dtype=torch.float32, device="cpu", selection="topk", redundancy=0.0):
    """``(model, policy, inputs_embeds, modality)`` for timing: the LLM of ``config`` and a
    policy of width ``policy_width`` (and ``selection`` rule) with random weights, and random
    embeddings for the ``modality`` layout [B, L] (seed 0)."""
    torch.manual_seed(0)
    model = F.build_model(config, dtype=dtype, device=device)
    policy = _policy(config, policy_width, device=device, selection=selection,
                     redundancy=redundancy)
    modality = modality.to(device)
    embeds = torch.randn(*modality.shape, config.hidden_size, device=device, dtype=dtype)
    return model, policy, embeds, modality


def _policy_width(settings, config, scale: float) -> int:
    if settings.policy_hidden_size == 0:
        return config.hidden_size
    return max(64, int(round(settings.policy_hidden_size / scale / 64)) * 64)


EXTRA_NAMES = {"full": "none", "avex": "policy + Top-K + compaction",
               "avex set-aware": "policy + set-aware picks + compaction",
               "fastv": f"{FASTV_LAYER} full-token layers (eager) + sort",
               "tome": "similarity matmuls + sorts",
               "fastav": "2 decoder passes (eager) + rollout + sorts",
               "attention": "full-token prefill (eager) + sorts"}


def _selection_flops(method, models, config, modality, retention, pol,
                     traced: bool) -> F.SelectionFlops:
    """A method's work before its pruned prefill: fvcore's count (None where not ``traced``)
    and the hand count."""
    if method == "full":
        return F.SelectionFlops(0, 0, {})
    if method == "avex":
        return F.SelectionFlops(pol["policy"] + pol["selection"] if traced else None,
                                pol["policy_analytic"] + pol["selection_analytic"],
                                dict(policy=pol["policy"], selection=pol["selection"],
                                     **({"set_aware": pol["set_aware"]}
                                        if "set_aware" in pol else {})))
    if method == "fastv":
        return F.fastv_flops(models, config, modality, retention, FASTV_LAYER, traced=traced)
    if method == "fastav":
        return F.fastav_flops(models, config, modality, retention, traced=traced)
    if method == "attention":
        return F.attention_flops(models, config, modality, retention, traced=traced)
    return F.tome_flops(config, modality, retention, traced=traced)


def flops_table(settings: ProfileSettings, config, policy_width: int, bar=None) -> dict:
    """FLOPs per method for ``config``: fvcore's count of the traced code, cross-checked against
    the hand count; where fvcore is not installed, the hand count alone (``counted_by``)."""
    by_hand_because = ("the hand count was asked for (flops='hand')" if settings.flops == "hand"
                       else F.fvcore_missing())
    traced = by_hand_because is None
    modality = token_layout(settings)
    n_av = settings.visual_tokens + settings.audio_tokens
    n_text = settings.text_before + settings.text_after
    k = int(num_kept(settings.retention, torch.tensor([n_av]))[0])
    models = tuple(F.build_model(config, n, dtype=torch.float32 if config.hidden_size <= 1024
                                 else torch.bfloat16, random_weights=False)
                   for n in (1, 2)) if traced else None
    if bar:
        bar.update(1)
    policy = _policy(config, policy_width, selection=settings.selection,
                     redundancy=settings.redundancy)
    pol = F.policy_flops(policy, config.hidden_size, modality, settings.retention, traced=traced)
    if bar:
        bar.update(1)
    rows, checks = {}, {}
    for method in settings.methods:
        tokens = n_text + n_av if method == "full" else n_text + k
        ref = F.analytic_llm_flops(config, tokens, settings.decode_tokens)
        llm = F.llm_flops(models, config, tokens, settings.decode_tokens) if traced else ref
        sel = _selection_flops(method, models, config, modality, settings.retention, pol,
                               traced)
        cost = sel.fvcore if traced else sel.analytic
        # "policy" holds any method's selection cost (AVEX's policy, the baselines' own work)
        extra = EXTRA_NAMES["avex set-aware" if method == "avex" and policy.set_aware
                            else method]
        rows[method] = dict(prefill_tokens=tokens, extra_name=extra,
                            llm_prefill=llm.prefill, policy=cost, decode=llm.decode,
                            prefill_plus_policy=llm.prefill + cost,
                            total=llm.prefill + cost + llm.decode,
                            selection_detail=sel.detail)
        if traced:
            fv = llm.prefill + llm.decode + sel.fvcore
            an = ref.prefill + ref.decode + sel.analytic
            checks[method] = dict(fvcore_total=fv, analytic_total=an,
                                  relative_difference=fv / an - 1,
                                  covers="LLM prefill + decode"
                                  + (" + selection" if method != "full" else ""))
        if bar:
            bar.update(1)
    full_prefill = rows["full"]["llm_prefill"] if "full" in rows else (
        F.llm_flops(models, config, n_text + n_av, 1) if traced
        else F.analytic_llm_flops(config, n_text + n_av, 1)).prefill
    for row in rows.values():
        row["vs_full_prefill"] = row["prefill_plus_policy"] / full_prefill
        row["policy_vs_full_prefill"] = row["policy"] / full_prefill
    for method, c in checks.items():
        if abs(c["relative_difference"]) > 0.02:
            raise RuntimeError(f"fvcore count for {method} differs from the analytic count by "
                               f"{c['relative_difference']:.2%} (> 2%): {c}")
    return dict(unit=F.UNIT, counted_by="fvcore" if traced else "hand",
                by_hand_because=by_hand_because,
                rows=rows, cross_check=checks, kept_av_tokens=k,
                policy_parameters=sum(p.numel() for p in policy.parameters()),
                policy_width=policy_width, policy_unsupported_ops=pol["policy_unsupported"],
                full_prefill=full_prefill)


def _device(settings) -> torch.device:
    if settings.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(settings.device)
    except RuntimeError as e:
        raise ValueError(f"device: cannot parse {settings.device!r}: {e}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device is {settings.device!r} but CUDA is not available")
    return device


def profile(settings: ProfileSettings | None = None, **overrides) -> dict:
    """Run the suite; write ``<out_dir>/profiling-<name>.{md,json,png}`` (``out_dir`` None:
    ``runs/profiling-<date-time>``); return the results."""
    settings = copy.deepcopy(settings) if settings else ProfileSettings()
    for key, value in overrides.items():
        if not hasattr(settings, key):
            raise TypeError(f"profile() got an unknown setting {key!r}")
        setattr(settings, key, value)
    if isinstance(settings.methods, str):   # "full,avex", as the command line takes it
        settings.methods = settings.methods.split(",")
    settings.methods = tuple(m.strip() for m in settings.methods)
    settings.validate()
    started = time.monotonic()
    config = backbone_config(settings.backbone)
    device = _device(settings)
    real_latency = (settings.full_size_latency if settings.full_size_latency is not None
                    else device.type == "cuda")
    dtype_name = settings.dtype if settings.dtype != "auto" else (
        "bfloat16" if device.type == "cuda" else "float32")
    runs = settings.runs if settings.runs is not None else (50 if device.type == "cuda" else 10)
    warmup = settings.warmup if settings.warmup is not None else (
        5 if device.type == "cuda" else 1)

    steps = 2 + len(settings.methods)
    small = config.hidden_size <= CPU_WIDTH
    latency_config = config if real_latency or small else scaled_config(config)
    scale = config.hidden_size / latency_config.hidden_size
    if settings.latency:
        steps += 2 + (runs + warmup + 1) * len(settings.methods)
        steps += 2 + len(settings.methods)
    bar = progress_bar(total=steps, desc="profiling", disable=not settings.progress)

    full_width = _policy_width(settings, config, 1.0)
    # out_dir as "." (the folder this file is in): a results file holds no machine's path
    recorded = {k: v for k, v in asdict(settings).items() if k != "extra"} | {"out_dir": "."}
    results = dict(settings=recorded,
                   measured=_provenance(),
                   backbone_config=_describe(config),
                   flops=flops_table(settings, config, full_width, bar))
    if settings.latency:

        label = ("real size" if real_latency or small else
                 f"scaled down for CPU: width {latency_config.hidden_size} "
                 f"(1/{scale:g}), {latency_config.num_hidden_layers} of "
                 f"{config.num_hidden_layers} layers, real vocabulary")
        pw = _policy_width(settings, config, scale)
        if latency_config is config and pw == full_width:  # timed at real size: counted
            lat_flops = results["flops"]
            bar.update(2 + len(settings.methods))
        else:
            lat_flops = flops_table(settings, latency_config, pw, bar)
        model, policy, embeds, modality = latency_inputs(
            latency_config, pw, token_layout(settings), dtype=DTYPES[dtype_name], device=device,
            selection=settings.selection, redundancy=settings.redundancy)
        bar.update(2)
        lat = measure(model, policy, embeds, modality, retention=settings.retention,
                      decode_tokens=settings.decode_tokens, runs=runs, warmup=warmup,
                      methods=settings.methods, progress=bar,
                      deadline=None if settings.max_seconds is None
                      else started + settings.max_seconds)
        rounds = next(iter(lat.values()))["rounds"]
        results["latency"] = dict(
            label=label, device=_device_name(device), dtype=dtype_name, runs=rounds,
            runs_asked=runs, max_seconds=settings.max_seconds, warmup=warmup, backbone_config=_describe(latency_config), policy_width=pw,
            weights_bytes=dict(model=_bytes(model), policy=_bytes(policy)),
            rows=lat, flops=lat_flops)
    bar.close()
    name = settings.name or _default_name(settings, device)
    out_dir = settings.out_dir or time.strftime("runs/profiling-%Y%m%d-%H%M%S")
    os.makedirs(out_dir, exist_ok=True)
    base = os.path.join(out_dir, f"profiling-{name}")
    results["markdown"] = markdown(results)
    with open(base + ".md", "w", encoding="utf-8") as f:
        f.write(results["markdown"])
    with open(base + ".json", "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2, default=str)
    chart(results, base + ".png")
    results["files"] = [base + ext for ext in (".md", ".json", ".png")]
    return results


def _provenance() -> dict:
    """When and at which commit the run started (``+dirty`` for uncommitted changes)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args):
        try:
            out = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True,
                                 timeout=30)
        except (OSError, subprocess.SubprocessError):
            return ""
        return out.stdout.strip() if out.returncode == 0 else ""

    # AVEX_COMMIT: the caller's word (bench/gpu.sh sets it): a device machine's copy of the
    # tree carries git metadata that need not match the files it runs
    commit = os.environ.get("AVEX_COMMIT", "")[:12]
    if not commit:
        commit = git("rev-parse", "--short=12", "HEAD") or "unknown (not a git checkout)"
        if git("status", "--porcelain", "--untracked-files=no"):
            commit += "+dirty"
    return dict(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                commit=commit)


def _default_name(settings, device) -> str:
    backbone = os.path.basename(os.path.normpath(settings.backbone)).replace(".json", "")
    return f"{backbone}-r{settings.retention:g}-{device.type}"


def _device_name(device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def _bytes(module) -> int:
    return sum(t.numel() * t.element_size()
               for t in (*module.parameters(), *module.buffers()))


def _describe(c) -> dict:
    keys = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "vocab_size")
    return {k: getattr(c, k, None) for k in keys}


def _t(x) -> str:
    return f"{x / 1e12:.3f}"


def _g(x) -> str:
    return f"{x / 1e9:.2f}"


def _gs(x) -> str:
    """G = 1e9, with 3 significant digits below 1 G (ToMe-AV's matching is ~0.1 G)."""
    g = x / 1e9
    return "0" if x == 0 else f"{g:,.1f}" if g >= 1 else f"{g:.3g}"


def _selection_notes(fl: dict) -> list[str]:
    """One line per method in the table: what its selection cost counts."""
    rows, full = fl["rows"], fl["full_prefill"]
    notes = {
        "avex": "AVEX-Prune: the policy pass, Top-K (`avex::topk_select`) and compaction.",
        "avex set-aware": "AVEX-Prune: the policy pass, the set-aware picks (by hand: K - 1 "
                          "matrix-vector products of the {tokens} AV tokens' unit hidden "
                          "states, width {width}, and their normalisation: {picks}) and "
                          "compaction.",
        "fastv": "FastV-AV: `avex.methods.fastv` on the LLM cut to its first K = {layers} "
                 "layers (the same selection: layer K-1's attention does not depend on later "
                 "layers), i.e. K layers over every token with eager attention (dense Q K^T and "
                 "A V), then a sort of the AV scores.",
        "tome": "ToMe-AV: `avex.methods.tome`'s bipartite matching on the input embeddings, "
                "per modality: the cosine-similarity matmul of each merge round ({rounds} "
                "rounds) and a sort of the matches; the size-weighted merge averages are "
                "elementwise, which fvcore does not count.",
        "fastav": "FastAV: `avex.methods.fastav` as it runs: stage 1, the whole decoder over "
                  "every token (eager), of which the rollout reads layers 0-{last_read}; the "
                  "rollout products of those maps; stage 2, the whole decoder over "
                  "the text + stage-1 survivors ({stage2_tokens} tokens) for the last layer's "
                  "attention; a sort per stage. Stage 1's unread layers are {unread} T "
                  "({unread_pct} of full prefill): the implementation's cost, not the method's.",
        "attention": "Attention-AV (balanced): `avex.methods.attention` through the frozen "
                     "captioner's `text_to_av_attention`: a full-token prefill of all {layers} "
                     "layers with eager attention (dense Q K^T and A V over {prefill_tokens} "
                     "tokens), its LM head at the last position only, then a sort within each "
                     "modality.",
    }
    lines = []
    for m in rows:
        if m not in notes:
            continue
        d = rows[m]["selection_detail"]
        extra = dict(d)
        key = m
        if m == "avex" and "set_aware" in d:
            key = "avex set-aware"
            extra.update(d["set_aware"], picks=f"{d['set_aware']['flops'] / 1e9:.3f} G")
        if m == "fastav":
            extra["last_read"] = d["rollout_layers"] - 1
            extra["unread"] = _t(d["stage1_unread_layers"])
            extra["unread_pct"] = f"{d['stage1_unread_layers'] / full:.1%}"
        lines.append("- " + notes[key].format(**extra))
    return lines


def markdown(results: dict) -> str:
    s = results["settings"]
    fl = results["flops"]
    cfg = results["backbone_config"]
    by_fvcore = fl.get("counted_by", "fvcore") == "fvcore"
    lines = [
        f"# Efficiency: {s['backbone']} at {s['retention'] * 100:g}% retention, batch 1",
        "",
        *([f"Measured {results['measured']['date']} at commit {results['measured']['commit']} "
           "by `python -m avex.profiling` (settings in the JSON file beside this one).", ""]
          if "measured" in results else []),
        f"Tokens: {s['visual_tokens']} visual + {s['audio_tokens']} audio + "
        f"{s['text_before'] + s['text_after']} text; every method keeps {fl['kept_av_tokens']} "
        f"AV tokens (ToMe-AV by merging); {s['decode_tokens']} decoded tokens (forced). Policy: "
        f"{fl['policy_parameters'] / 1e6:.1f}M parameters (width {fl['policy_width']}).",
        "",
        f"## FLOPs, {s['backbone']} at real size ({cfg['num_hidden_layers']} layers, width "
        f"{cfg['hidden_size']})",
        "",
        f"Unit: {fl['unit']}; T = 1e12, G = 1e9. " + (
            "Counted with fvcore by tracing the project's code (SDPA, sorts, Top-K selection "
            "and compaction through this suite's handles); decoder layers traced at depth 1 and "
            "2 and extrapolated exactly; LM head on the last prefill position and every decode "
            "step." if by_fvcore else
            f"**Counted by hand, not by fvcore**: {fl['by_hand_because']}. The hand count "
            "(matmul weights x tokens + attention pairs, the policy's layers, the baselines' "
            "matmuls and sorts; LM head on the last prefill position and every decode step) "
            "equals fvcore's count of the traced code exactly where fvcore runs "
            "(tests/test_profiling.py); this run has no cross-check."),
        "",
        markdown_table(["Method", "prefill tokens", "LLM prefill (T)", "selection cost (G)",
                        "prefill + selection (T)", "vs full prefill", "decode (T)", "total (T)"],
                       [[METHOD_NAMES[m], r["prefill_tokens"], _t(r["llm_prefill"]),
                         _gs(r["policy"]), _t(r["prefill_plus_policy"]),
                         f"{r['vs_full_prefill']:.1%}", _t(r["decode"]), _t(r["total"])]
                        for m, r in fl["rows"].items()]),
        "",
    ]
    if by_fvcore:
        checks = ", ".join(f"{METHOD_NAMES[m]} {c['relative_difference']:+.4%} ({c['covers']})"
                           for m, c in fl["cross_check"].items())
        lines.append(f"fvcore vs the analytic count (params x tokens + attention pairs; the "
                     f"policy's layers and the baselines' matmuls and sorts by hand): {checks}.")
    lines += ["", "Selection cost, the work before the pruned prefill:"] + _selection_notes(fl)
    if {"fastv", "fastav"} & set(fl["rows"]):
        lines.append("- FastV and FastAV prune inside the LLM in their papers; "
                     "`avex.methods` uses their passes only to choose the kept set, which "
                     "every layer then prefills, as for the other methods.")
    if "avex" in fl["rows"]:
        lines.append(f"\nPolicy + selection = {fl['rows']['avex']['policy_vs_full_prefill']:.2%} "
                     "of the full-token LLM prefill.")
    lat = results.get("latency")
    if lat:
        lines += _latency_markdown(lat)
    return "\n".join(lines) + "\n"


def _latency_markdown(lat: dict) -> list[str]:
    lc = lat["backbone_config"]
    cpu = lat["device"].startswith("CPU")
    weights = lat["weights_bytes"]
    mem_head = "Peak mem. (MB, run only)" if cpu else "Peak mem. (GB)"
    mem_note = (
        "the peak, during one end-to-end run, of the bytes of CPU tensors allocated in that run "
        "and alive at once (activations, KV cache, logits, the selection's intermediates), from "
        "the PyTorch profiler's allocation events; the weights and inputs are excluded (model "
        f"{weights['model'] / 2**20:.0f} MB + policy {weights['policy'] / 2**20:.1f} MB, "
        "resident for every method)" if cpu else
        "peak allocated over one end-to-end run, weights included "
        "(torch.cuda.max_memory_allocated); MB = 2^20 bytes, GB = 2^30 bytes")
    first = next(iter(lat["rows"].values()))
    lines = [
        "",
        f"## Latency and memory ({lat['label']})",
        "",
        f"Device: {lat['device']}, {first['threads']} timing thread(s), clock: "
        f"{first['clock']}; {lat['dtype']}, random weights; {lat['runs']} alternating rounds"
        + (f" (of {lat['runs_asked']} asked: the {lat['max_seconds']:g} s time budget ran out)"
           if lat.get("runs_asked", lat["runs"]) > lat["runs"] else "")
        + f" after {lat['warmup']} warm-up (each round "
        "runs every method once, the order reversed every other round); times are medians over "
        "the rounds, ratios to full tokens the median of the per-round ratios with their "
        f"interquartile range. Configuration: {lc['num_hidden_layers']} "
        f"layers, width {lc['hidden_size']}, {lc['num_attention_heads']} heads "
        f"({lc['num_key_value_heads']} KV), MLP {lc['intermediate_size']}, vocabulary "
        f"{lc['vocab_size']}; policy width {lat['policy_width']}. FLOPs below are for this "
        "configuration (prefill + selection, same unit).",
        "",
        f"| Method | FLOPs (T) | Prefill (ms) | Decode step (ms) | E2E (ms) | E2E / full "
        f"| {mem_head} | selection overhead (ms) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m, r in lat["rows"].items():
        f_ = lat["flops"]["rows"][m]["prefill_plus_policy"]
        mem = (f"{r['memory_bytes'] / 2**20:.1f}" if cpu
               else f"{r['memory_bytes'] / 2**30:.2f}")
        lines.append(f"| {METHOD_NAMES[m]} | {_t(f_)} ({_g(f_)} G) | "
                     f"{r['prefill_ms']:.1f} | {r['decode_step_ms']:.2f} | {r['e2e_ms']:.1f} | "
                     f"{ratio_text(r.get('vs_full', {}).get('e2e'))} | {mem} | "
                     f"{r['selection_ms']:.2f} |")
    lines += ["", "Prefill: from `generate`'s start until the model's first forward returns, "
              "over the sequence the method feeds it. Decode step: the remaining forwards of the "
              "forced decode, per step. E2E: the method's selection, compaction, prefill and "
              "decode in one run. Selection overhead: everything before `generate` (the "
              "method's scoring, selection and compaction; the baselines as `avex.methods` runs "
              f"them, see the FLOPs notes). Mem.: {mem_note}.",
              "", "Stages of the same runs (median ms, share of their sum) and ratios to full "
              "tokens:", "", stage_table(lat["rows"], METHOD_NAMES)]
    return lines


# Attention-AV reads the full prefill's attention: a privileged reference (avex.registry)
SHORT_NAMES = {"full": "Full", "avex": "AVEX", "fastv": "FastV-AV", "tome": "ToMe-AV",
               "fastav": "FastAV", "attention": "Attention-AV\n(privileged)"}
COLOURS = {"full": "#888888", "avex": "#1f77b4", "fastv": "#ff7f0e", "tome": "#2ca02c",
           "fastav": "#d62728", "attention": "#9467bd"}


def chart(results: dict, path: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fl = results["flops"]["rows"]
    # (title, value format, values per method)
    panels = [("prefill + selection FLOPs (T)", "{:.3f}",
               {m: r["prefill_plus_policy"] / 1e12 for m, r in fl.items()})]
    lat = results.get("latency")
    if lat:
        cpu = lat["device"].startswith("CPU")
        tag = "" if lat["label"] == "real size" else " [CPU-scaled]"
        rows = lat["rows"]
        panels.append((f"prefill (ms){tag}", "{:,.0f}",
                       {m: r["prefill_ms"] for m, r in rows.items()}))
        panels.append((f"end-to-end (ms){tag}", "{:,.0f}",
                       {m: r["e2e_ms"] for m, r in rows.items()}))
        panels.append(("peak run memory (MB, excl. weights)" + tag if cpu else
                       "peak memory (GB, incl. weights)", "{:.1f}" if cpu else "{:.2f}",
                       {m: r["memory_bytes"] / (2**20 if cpu else 2**30)
                        for m, r in rows.items()}))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.6))
    axes = [axes] if len(panels) == 1 else list(axes)
    for ax, (title, fmt, values) in zip(axes, panels):
        ax.bar([SHORT_NAMES[m] for m in values], list(values.values()),
               color=[COLOURS[m] for m in values])
        ax.set_title(title, fontsize=9)
        ax.tick_params(axis="x", labelsize=7, rotation=30)
        ax.tick_params(axis="y", labelsize=7)
        ax.margins(y=0.15)   # room for the value labels
        for i, v in enumerate(values.values()):
            ax.text(i, v, fmt.format(v), ha="center", va="bottom", fontsize=7)
    s = results["settings"]
    fig.suptitle(f"{s['backbone']}, {s['retention'] * 100:g}% retention, batch 1", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
