"""The profiling run behind ``python -m avex.profiling``: settings, tables, JSON and chart."""
from __future__ import annotations

import copy
import json
import math
import os
import platform
import types
from dataclasses import asdict, dataclass, field

import torch

from avex.backbones import backbone_config
from avex.pruning import AUDIO, TEXT, VISUAL, num_kept

from . import flops as F

METHODS = ("full", "avex")
FLOPS_ONLY_METHODS = ("fastv",)
METHOD_NAMES = {"full": "Full tokens", "avex": "AVEX-Prune", "fastv": "FastV-AV (K=2)"}
FASTV_LAYER = 2   # avex.baselines.fastv's default K
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
PAPER_POLICY_WIDTH = 768
CPU_WIDTH, CPU_LAYERS = 512, 4


@dataclass
class ProfileSettings:
    backbone: str = "qwen2-7b"
    retention: float = 0.4
    methods: tuple = METHODS + FLOPS_ONLY_METHODS
    visual_tokens: int = 256
    audio_tokens: int = 64
    # "<|im_start|>system ... user" before the AV tokens, the instruction and the assistant
    # header after them: 24 text tokens, as a Qwen2 chat prompt around "Describe the audio and
    # visual content of the video in detail." tokenizes to
    text_before: int = 6
    text_after: int = 18
    decode_tokens: int = 64
    device: str = "auto"
    dtype: str = "auto"
    policy_hidden_size: int = PAPER_POLICY_WIDTH
    runs: int | None = None
    warmup: int | None = None
    latency: bool = True
    full_size_latency: bool | None = None   # None: real size on CUDA, scaled on CPU
    out_dir: str = os.path.join("bench", "results")
    name: str | None = None
    progress: bool = True
    extra: dict = field(default_factory=dict)

    def validate(self):
        r = self.retention
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r) \
                or not 0 < r <= 1:
            raise ValueError(f"retention must be in (0, 1], got {r!r}")
        for m in self.methods:
            if m not in METHODS + FLOPS_ONLY_METHODS:
                raise ValueError(f"methods: unknown method {m!r}; available: "
                                 f"{list(METHODS + FLOPS_ONLY_METHODS)} (fastv: FLOPs only; "
                                 "ToMe / FastAV rows are not implemented yet)")
        for name in ("visual_tokens", "audio_tokens", "text_before", "text_after"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.visual_tokens + self.audio_tokens == 0:
            raise ValueError("visual_tokens + audio_tokens must be > 0, got 0")
        if self.decode_tokens < 1:
            raise ValueError(f"decode_tokens must be >= 1, got {self.decode_tokens}")
        if self.dtype not in ("auto", *DTYPES):
            raise ValueError(f"dtype must be one of {['auto', *DTYPES]}, got {self.dtype!r}")
        if self.policy_hidden_size < 0:
            raise ValueError(f"policy_hidden_size must be >= 0 (0: as wide as the LLM), got "
                             f"{self.policy_hidden_size}")
        backbone_config(self.backbone)   # raises ValueError naming the backbone


def token_layout(s: ProfileSettings) -> torch.Tensor:
    """modality [1, L]: text, Nv visual, Na audio, text (batch 1)."""
    codes = ([TEXT] * s.text_before + [VISUAL] * s.visual_tokens + [AUDIO] * s.audio_tokens
             + [TEXT] * s.text_after)
    return torch.tensor([codes])


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


def _policy(config, width: int, dtype=torch.float32, device="cpu"):
    from avex.policy import AVEXPolicy

    llm = types.SimpleNamespace(config=config)
    with torch.device(device):
        policy = AVEXPolicy.from_llm(llm, hidden_size=width or None, init_from_llm=False)
    return policy.to(dtype).eval()


def _policy_width(settings, config, scale: float) -> int:
    if settings.policy_hidden_size == 0:
        return config.hidden_size
    return max(64, int(round(settings.policy_hidden_size / scale / 64)) * 64)


def flops_table(settings: ProfileSettings, config, policy_width: int, bar=None) -> dict:
    """FLOPs per method for ``config`` (fvcore, cross-checked against the analytic count)."""
    modality = token_layout(settings)
    n_av = settings.visual_tokens + settings.audio_tokens
    n_text = settings.text_before + settings.text_after
    k = int(num_kept(settings.retention, torch.tensor([n_av]))[0])
    models = tuple(F.build_model(config, n, dtype=torch.float32 if config.hidden_size <= 1024
                                 else torch.bfloat16, random_weights=False) for n in (1, 2))
    if bar:
        bar.update(1)
    policy = _policy(config, policy_width)
    pol = F.policy_flops(policy, config.hidden_size, modality, settings.retention)
    if bar:
        bar.update(1)
    rows, checks = {}, {}
    full_prefill = None
    for method in settings.methods:
        tokens = n_text + n_av if method == "full" else n_text + k
        llm = F.llm_flops(models, config, tokens, settings.decode_tokens)
        ref = F.analytic_llm_flops(config, tokens, settings.decode_tokens)
        extra = pol["policy"] + pol["selection"] if method == "avex" else 0
        if method == "fastv":
            # avex.baselines.fastv: the first K layers on every token (attention weights of
            # layer K-1, the same QK^T + AV products), a Top-K, then the pruned prefill
            layers = min(FASTV_LAYER, config.num_hidden_layers)
            extra = layers * F.layer_prefill_flops(models, n_text + n_av) \
                + F.selection_flops(n_av)
        if method == "full":
            full_prefill = llm.prefill
        extra_name = {"avex": "policy + selection",
                      "fastv": f"{FASTV_LAYER} full-token layers + selection"}.get(method, "none")
        # "policy" holds the selection cost of any method (AVEX's policy, FastV's layers)
        rows[method] = dict(prefill_tokens=tokens, extra_name=extra_name,
                            llm_prefill=llm.prefill, policy=extra,
                            decode=llm.decode, prefill_plus_policy=llm.prefill + extra,
                            total=llm.prefill + extra + llm.decode)
        checks[method] = dict(fvcore_total=llm.prefill + llm.decode,
                              analytic_total=ref.prefill + ref.decode,
                              relative_difference=(llm.prefill + llm.decode)
                              / (ref.prefill + ref.decode) - 1)
        if bar:
            bar.update(1)
    if full_prefill is None:
        full_prefill = F.llm_flops(models, config, n_text + n_av, 1).prefill
    for row in rows.values():
        row["vs_full_prefill"] = row["prefill_plus_policy"] / full_prefill
        row["policy_vs_full_prefill"] = row["policy"] / full_prefill
    for method, c in checks.items():
        if abs(c["relative_difference"]) > 0.02:
            raise RuntimeError(f"fvcore count for {method} differs from the analytic count by "
                               f"{c['relative_difference']:.2%} (> 2%): {c}")
    return dict(unit=F.UNIT, rows=rows, cross_check=checks, kept_av_tokens=k,
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
    """Run the suite; write ``<out_dir>/profiling-<name>.{md,json,png}``; return the results."""
    from tqdm.auto import tqdm

    settings = copy.deepcopy(settings) if settings else ProfileSettings()
    for key, value in overrides.items():
        if not hasattr(settings, key):
            raise TypeError(f"profile() got an unknown setting {key!r}")
        setattr(settings, key, value)
    settings.methods = tuple(settings.methods)
    settings.validate()
    config = backbone_config(settings.backbone)
    device = _device(settings)
    real_latency = (settings.full_size_latency if settings.full_size_latency is not None
                    else device.type == "cuda")
    dtype_name = settings.dtype if settings.dtype != "auto" else (
        "bfloat16" if device.type == "cuda" else "float32")
    runs = settings.runs or (50 if device.type == "cuda" else 5)
    warmup = settings.warmup if settings.warmup is not None else (
        5 if device.type == "cuda" else 1)

    steps = 2 + len(settings.methods)
    small = config.hidden_size <= CPU_WIDTH
    latency_config = config if real_latency or small else scaled_config(config)
    scale = config.hidden_size / latency_config.hidden_size
    if settings.latency:
        timed = [m for m in settings.methods if m in METHODS]
        steps += 2 + sum((3 if m == "avex" else 2) * runs for m in timed)
        steps += 2 + len(settings.methods)
    bar = tqdm(total=steps, desc="profiling", disable=not settings.progress)

    results = dict(settings={k: v for k, v in asdict(settings).items() if k != "extra"},
                   backbone_config=_describe(config),
                   flops=flops_table(settings, config, _policy_width(settings, config, 1.0),
                                     bar))
    if settings.latency:
        from .latency import measure

        label = ("real size" if real_latency or small else
                 f"scaled down for CPU: width {latency_config.hidden_size} "
                 f"(1/{scale:g}), {latency_config.num_hidden_layers} of "
                 f"{config.num_hidden_layers} layers, real vocabulary")
        pw = _policy_width(settings, config, scale)
        lat_flops = flops_table(settings, latency_config, pw, bar)
        torch.manual_seed(0)
        model = F.build_model(latency_config, dtype=DTYPES[dtype_name], device=device)
        policy = _policy(latency_config, pw, device=device)
        bar.update(1)
        modality = token_layout(settings).to(device)
        embeds = torch.randn(1, modality.shape[1], latency_config.hidden_size, device=device,
                             dtype=DTYPES[dtype_name])
        bar.update(1)
        lat = measure(model, policy, embeds, modality, retention=settings.retention,
                      decode_tokens=settings.decode_tokens, runs=runs, warmup=warmup,
                      methods=[m for m in settings.methods if m in METHODS], progress=bar)
        results["latency"] = dict(
            label=label, device=_device_name(device), dtype=dtype_name, runs=runs,
            warmup=warmup, backbone_config=_describe(latency_config), policy_width=pw,
            rows=lat, flops=lat_flops)
    bar.close()
    name = settings.name or _default_name(settings, device)
    os.makedirs(settings.out_dir, exist_ok=True)
    base = os.path.join(settings.out_dir, f"profiling-{name}")
    results["markdown"] = markdown(results)
    with open(base + ".md", "w", encoding="utf-8") as f:
        f.write(results["markdown"])
    with open(base + ".json", "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2, default=str)
    chart(results, base + ".png")
    results["files"] = [base + ext for ext in (".md", ".json", ".png")]
    return results


def _default_name(settings, device) -> str:
    backbone = os.path.basename(os.path.normpath(settings.backbone)).replace(".json", "")
    return f"{backbone}-r{settings.retention:g}-{device.type}"


def _device_name(device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def _describe(c) -> dict:
    keys = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "vocab_size")
    return {k: getattr(c, k, None) for k in keys}


def _t(x) -> str:
    return f"{x / 1e12:.3f}"


def _g(x) -> str:
    return f"{x / 1e9:.2f}"


def markdown(results: dict) -> str:
    s = results["settings"]
    fl = results["flops"]
    cfg = results["backbone_config"]
    lines = [
        f"# Efficiency: {s['backbone']} at {s['retention']:.0%} retention, batch 1",
        "",
        f"Tokens: {s['visual_tokens']} visual + {s['audio_tokens']} audio + "
        f"{s['text_before'] + s['text_after']} text; AVEX keeps {fl['kept_av_tokens']} AV "
        f"tokens; {s['decode_tokens']} decoded tokens (forced). Policy: "
        f"{fl['policy_parameters'] / 1e6:.1f}M parameters (width {fl['policy_width']}).",
        "",
        f"## FLOPs, {s['backbone']} at real size ({cfg['num_hidden_layers']} layers, width "
        f"{cfg['hidden_size']})",
        "",
        f"Unit: {fl['unit']}; T = 1e12. Counted with fvcore (SDPA, Top-K selection and "
        "compaction through this suite's handles); decoder layers traced at depth 1 and 2 and "
        "extrapolated exactly; LM head on the last prefill position and every decode step.",
        "",
        "| Method | prefill tokens | LLM prefill (T) | selection cost (T) | prefill + selection "
        "(T) | vs full prefill | decode (T) | total (T) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m, r in fl["rows"].items():
        lines.append(f"| {METHOD_NAMES[m]} | {r['prefill_tokens']} | {_t(r['llm_prefill'])} | "
                     f"{_t(r['policy'])} | {_t(r['prefill_plus_policy'])} | "
                     f"{r['vs_full_prefill']:.1%} | {_t(r['decode'])} | {_t(r['total'])} |")
    lines.append("")
    checks = ", ".join(f"{METHOD_NAMES[m]} {c['relative_difference']:+.4%}"
                       for m, c in fl["cross_check"].items())
    lines.append(f"fvcore vs analytic (params x tokens + causal attention), prefill + decode: "
                 f"{checks}.")
    lines.append("Selection cost: AVEX, the policy pass + Top-K + compaction; FastV-AV (as "
                 "`avex.baselines.fastv` runs it), the first 2 decoder layers on all tokens + "
                 "Top-K, before the pruned prefill.")
    if "avex" in fl["rows"]:
        lines.append(f"Policy + selection = {fl['rows']['avex']['policy_vs_full_prefill']:.2%} "
                     "of the full-token LLM prefill.")
    lat = results.get("latency")
    if lat:
        lc = lat["backbone_config"]
        lines += [
            "",
            f"## Latency and memory ({lat['label']})",
            "",
            f"Device: {lat['device']}, {lat['dtype']}, random weights; median of {lat['runs']} "
            f"runs after {lat['warmup']} warm-up. Configuration: {lc['num_hidden_layers']} "
            f"layers, width {lc['hidden_size']}, {lc['num_attention_heads']} heads "
            f"({lc['num_key_value_heads']} KV), MLP {lc['intermediate_size']}, vocabulary "
            f"{lc['vocab_size']}; policy width {lat['policy_width']}. FLOPs below are for this "
            "configuration (prefill + policy, same unit).",
            "",
            "| Method | FLOPs (T) | Prefill (ms) | E2E (ms) | Mem. (GB) | policy overhead (ms) |",
            "|---|---|---|---|---|---|",
        ]
        mem_note = ("not measured on a CPU (no allocator peak statistic; the process's "
                    "RSS growth after warm-up, in the JSON, is ~0 because freed memory is reused)"
                    if lat["device"].startswith("CPU") else
                    "peak allocated (torch.cuda.max_memory_allocated)")
        for m, r in lat["rows"].items():
            f_ = lat["flops"]["rows"][m]["prefill_plus_policy"]
            mem = "n/a (CPU)" if r["memory_gb"] is None else f"{r['memory_gb']:.2f}"
            lines.append(f"| {METHOD_NAMES[m]} | {_t(f_)} ({_g(f_)} G) | "
                         f"{r['prefill_ms']:.1f} | {r['e2e_ms']:.1f} | {mem} | "
                         f"{r['policy_ms']:.2f} |")
        lines += ["", "Prefill: the LLM forward over the sequence the method feeds it. E2E: "
                  "scoring, selection, compaction, prefill and the forced decode. Policy "
                  f"overhead: scoring + Top-K + compaction alone. Mem.: {mem_note}."]
    return "\n".join(lines) + "\n"


def chart(results: dict, path: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fl = results["flops"]["rows"]
    panels = [("prefill + selection FLOPs (T)",
               {m: r["prefill_plus_policy"] / 1e12 for m, r in fl.items()})]
    lat = results.get("latency")
    if lat:
        tag = "" if lat["label"] == "real size" else " [CPU-scaled]"
        panels.append((f"prefill (ms){tag}", {m: r["prefill_ms"] for m, r in lat["rows"].items()}))
        panels.append((f"end-to-end (ms){tag}", {m: r["e2e_ms"] for m, r in lat["rows"].items()}))
    colours = {"full": "#888888", "avex": "#1f77b4", "fastv": "#ff7f0e"}
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2))
    axes = [axes] if len(panels) == 1 else list(axes)
    for ax, (title, values) in zip(axes, panels):
        ax.bar([METHOD_NAMES[m] for m in values], list(values.values()),
               color=[colours[m] for m in values])
        ax.set_title(title, fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
        for i, v in enumerate(values.values()):
            ax.text(i, v, f"{v:,.0f}" if v >= 100 else f"{v:.3g}", ha="center",
                    va="bottom", fontsize=8)
    s = results["settings"]
    fig.suptitle(f"{s['backbone']}, {s['retention']:.0%} retention, batch 1", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
