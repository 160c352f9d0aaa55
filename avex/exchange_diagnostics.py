"""What the exchange term's labels carry, measured during training (issue #25's review).

Per RL micro-batch and exchange type (V>V, A>A, V>A, A>V), over the exchanges that were built:

* ``zero``: the share whose reward difference dR = R(S) - R(S') is exactly 0 (no label);
* ``disagree``: the share whose sign of dR disagrees with the current ranking, i.e.
  sign(dR) * dF < 0 with dF = sum s_G - sum s_G' (only these can change the ranking);
* ``positive``: the share with dR > 0 (the anchor's group was better);
* ``g_over_k``: the mean group size over the set size K;
* ``valid``: the share of slots of the type that were built at all (group size >= 2);
* ``grad_ratio`` (every ``diagnostics_every`` steps, and whenever the term is normalised):
  ||grad(lambda L_ex,type)|| / ||grad L_RL|| over the policy's parameters, L_ex,type being the
  type's part of L_ex (the parts sum to L_ex).

Training writes them into each RL line of ``metrics.jsonl`` (``exchange_diagnostics``: one
entry per micro-batch) and, at the end of the RL phase, ``exchange_diagnostics.json`` (means per
type and retention) and ``exchange_diagnostics.png`` in the run directory.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from avex.figures import save_figure
from avex.run_files import (EXCHANGE_DIAGNOSTICS_FIGURE, EXCHANGE_DIAGNOSTICS_FILE,
                             METRICS_FILE)

STATISTICS = ("zero", "disagree", "positive", "g_over_k", "valid")

__all__ = ["exchange_statistics", "grad_norm", "summarize", "plot", "write_report"]


@torch.no_grad()
def exchange_statistics(delta_reward: torch.Tensor, delta_f: torch.Tensor, valid: torch.Tensor,
                        group_size: torch.Tensor, set_size: torch.Tensor,
                        slot_types) -> dict:
    """type -> {statistic: float or None} for one micro-batch. ``delta_reward``, ``delta_f``,
    ``valid``, ``group_size``: [B, E]; ``set_size``: K per sample [B]; ``slot_types``: the
    exchange type of each of the E slots. A statistic over no built exchange is None."""
    out = {}
    k = set_size.to(torch.float64).clamp_min(1)[:, None].expand_as(delta_f)
    for name in dict.fromkeys(slot_types):
        cols = torch.tensor([t == name for t in slot_types], device=valid.device)
        built = valid & cols[None, :]
        n = int(built.sum())
        entry = {"valid": float(built.sum()) / max(1, int(cols.sum()) * valid.shape[0])}
        if n == 0:
            entry.update({s: None for s in STATISTICS if s != "valid"})
        else:
            dr, df = delta_reward[built].double(), delta_f.detach()[built].double()
            entry.update({
                "zero": float((dr == 0).double().mean()),
                "disagree": float((torch.sign(dr) * df < 0).double().mean()),
                "positive": float((dr > 0).double().mean()),
                "g_over_k": float((group_size[built].double() / k[built]).mean())})
        out[name] = entry
    return out


def grad_norm(term: torch.Tensor, params) -> torch.Tensor:
    """||d term / d params||, leaving the graph in place for the backward that follows."""
    grads = torch.autograd.grad(term, params, retain_graph=True, allow_unused=True)
    squares = [g.detach().double().square().sum() for g in grads if g is not None]
    if not squares:
        return torch.zeros((), dtype=torch.float64)
    return torch.stack(squares).sum().sqrt()


def _rl_records(metrics_path) -> list[dict]:
    records = []
    for line in Path(metrics_path).read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        if record.get("phase") == "rl" and record.get("exchange_diagnostics"):
            records.append(record)
    return records


def summarize(metrics_path) -> dict:
    """Means over a run's RL micro-batches, per exchange type: ``all`` and per retention
    (``"0.2"``, ...), each {statistic: mean or None, "micro_batches": count}."""
    sums: dict = {}
    for record in _rl_records(metrics_path):
        for micro in record["exchange_diagnostics"]:
            ratios = micro.get("grad_ratio") or {}
            entries = {name: dict(entry, grad_ratio=ratios.get(name))
                       for name, entry in micro["types"].items()}
            # the whole term: its gradient-norm ratio, before and after lambda (and scaling)
            entries["total"] = {"grad_ratio": ratios.get("total"),
                                "unscaled": ratios.get("unscaled"),
                                "exchange_scale": micro.get("exchange_scale")}
            for name, values in entries.items():
                for key in ("all", f"{micro['retention']:g}"):
                    slot = sums.setdefault(name, {}).setdefault(key, {"micro_batches": 0})
                    slot["micro_batches"] += 1
                    for stat, value in values.items():
                        if value is not None:
                            slot.setdefault(stat, []).append(value)
    out = {}
    for name, by_key in sums.items():
        out[name] = {}
        for key, slot in by_key.items():
            out[name][key] = {"micro_batches": slot["micro_batches"],
                              **{stat: (float(np.mean(slot[stat])) if slot.get(stat) else None)
                                 for stat in ((*STATISTICS, "grad_ratio") if name != "total"
                                              else ("grad_ratio", "unscaled",
                                                    "exchange_scale"))}}
    return out


def plot(metrics_path, path) -> Path | None:
    """Four panels against the RL step (a 10-step running mean per exchange type): share of
    dR = 0, share disagreeing with the ranking, mean g/K, and the gradient-norm ratio."""
    records = _rl_records(metrics_path)
    if not records:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt


    panels = (("zero", "share of dR = 0"), ("disagree", "share disagreeing with the ranking"),
              ("g_over_k", "mean g / K"), ("grad_ratio", "||grad lambda L_ex,type|| / ||grad L_RL||"))
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    names = list(dict.fromkeys(n for r in records for m in r["exchange_diagnostics"]
                               for n in m["types"])) + ["total"]
    for ax, (stat, title) in zip(axes.flat, panels):
        positive = False
        for name in names:
            steps, values = [], []
            for record in records:
                got = [(m.get("grad_ratio") or {}).get(name) if stat == "grad_ratio"
                       else m["types"].get(name, {}).get(stat)
                       for m in record["exchange_diagnostics"]] if name != "total" or \
                    stat == "grad_ratio" else []
                got = [v for v in got if v is not None]
                if got:
                    steps.append(record["step"])
                    values.append(float(np.mean(got)))
            if not values:
                continue
            positive = positive or max(values) > 0
            window = max(1, min(10, len(values) // 5)) if stat != "grad_ratio" else 1
            smooth = np.convolve(values, np.ones(window) / window, mode="valid")
            ax.plot(steps[window - 1:], smooth, label="L_ex" if name == "total" else
                    f"{name[0].upper()}>{name[1].upper()}", color="black" if name == "total"
                    else None,
                    marker="o" if stat == "grad_ratio" else None, markersize=3)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("RL step")
        if stat == "grad_ratio" and positive:
            ax.set_yscale("log")
        ax.legend(fontsize=8)
    return save_figure(fig, Path(path))


def write_report(run_dir) -> dict:
    """``exchange_diagnostics.json`` and ``.png`` in ``run_dir`` from its metrics.jsonl."""
    run_dir = Path(run_dir)
    summary = summarize(run_dir / METRICS_FILE)
    (run_dir / EXCHANGE_DIAGNOSTICS_FILE).write_text(json.dumps(summary, indent=1) + "\n")
    plot(run_dir / METRICS_FILE, run_dir / EXCHANGE_DIAGNOSTICS_FIGURE)
    return summary
