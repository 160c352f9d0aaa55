"""What the reward and the exchange term's labels carry, measured during training (issues #25,
#33 and #36).

Per RL micro-batch, over its clips (``reward_diagnostics`` in each RL line of
``metrics.jsonl``, every run, whatever the reward):

* ``tied``: the share of RL groups (a clip's anchors) whose rewards all tie exactly (they
  give L_RL no gradient); None with one anchor;
* on steps where CIDEr and a dense (fidelity) term were both computed (every step of
  ``cider+fidelity``, every ``diagnostics_every`` steps of ``fidelity``): ``cider_tied`` (the
  same share under CIDEr alone), ``cider_mean``, and ``agree``: over pairs of one clip's
  anchors whose CIDEr differs, the share where the dense term's difference has CIDEr's sign
  (``pairs``: how many such pairs).

Per RL micro-batch and exchange type (V>V, A>A, V>A, A>V), over the exchanges that were built:

* ``zero``: the share whose reward difference dR = R(S) - R(S') is exactly 0 (no label);
* ``disagree``: the share whose sign of dR disagrees with the current ranking, i.e.
  sign(dR) * dF < 0 with dF = sum s_G - sum s_G' (only these can change the ranking);
* ``positive``: the share with dR > 0 (the anchor's group was better);
* ``g_over_k``: the mean group size over the set size K;
* ``valid``: the share of slots of the type that were built at all (group size >= 2);
* where CIDEr and the dense term were both computed (as above): ``cider_zero`` (the share
  whose CIDEr dR is exactly 0) and ``agree`` (where CIDEr's dR is not 0, the share whose dense
  dR has its sign); None otherwise;
* ``grad_ratio`` (every ``diagnostics_every`` steps, and whenever the term is normalised):
  ||grad(lambda L_ex,type)|| / ||grad L_RL|| over the policy's parameters, L_ex,type being the
  type's part of L_ex (the parts sum to L_ex).

Training writes them into each RL line of ``metrics.jsonl`` (``exchange_diagnostics``: one
entry per micro-batch) and, at the end of the RL phase, ``exchange_diagnostics.json`` (means per
type and retention, and the RL groups' under ``anchors``) and ``exchange_diagnostics.png`` in the
run directory.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from avex.figures import save_figure
from avex.run_files import EXCHANGE_DIAGNOSTICS_FIGURE, EXCHANGE_DIAGNOSTICS_FILE, METRICS_FILE

STATISTICS = ("zero", "disagree", "positive", "g_over_k", "valid", "cider_zero", "agree")
ANCHOR_STATISTICS = ("tied", "cider_tied", "agree", "cider_mean")

__all__ = ["anchor_statistics", "exchange_statistics", "grad_norm", "summarize", "plot",
           "write_report"]


@torch.no_grad()
def anchor_statistics(rewards: torch.Tensor, retention: float, k: int, *,
                      cider: torch.Tensor | None = None,
                      dense: torch.Tensor | None = None) -> dict:
    """One micro-batch's RL groups: ``rewards`` [B, A], each clip's anchor rewards under the
    run's reward; ``cider`` and ``dense`` [B, A], CIDEr and the dense term where computed.
    Returns {"retention", "k", "groups", "tied", and where computed "cider_tied",
    "cider_mean", "agree", "pairs"} (the module's docstring says what each is)."""
    groups, anchors = rewards.shape
    out = {"retention": float(retention), "k": int(k), "groups": groups,
           "tied": _tied_share(rewards)}
    if cider is not None:
        out["cider_tied"] = _tied_share(cider)
        out["cider_mean"] = float(cider.double().mean())
    if cider is not None and dense is not None:
        first, second = torch.triu_indices(anchors, anchors, offset=1, device=rewards.device)
        by_cider = cider[:, first] - cider[:, second]
        by_dense = dense[:, first] - dense[:, second]
        moved = by_cider != 0
        out["pairs"] = int(moved.sum())
        out["agree"] = float((torch.sign(by_dense[moved]) == torch.sign(by_cider[moved]))
                             .double().mean()) if out["pairs"] else None
    return out


def _tied_share(rewards: torch.Tensor) -> float | None:
    if rewards.shape[1] < 2 or rewards.shape[0] == 0:
        return None
    return float((rewards == rewards[:, :1]).all(dim=1).double().mean())


@torch.no_grad()
def exchange_statistics(delta_reward: torch.Tensor, delta_f: torch.Tensor, valid: torch.Tensor,
                        group_size: torch.Tensor, set_size: torch.Tensor,
                        slot_types, *, cider_delta: torch.Tensor | None = None,
                        dense_delta: torch.Tensor | None = None) -> dict:
    """type -> {statistic: float or None} for one micro-batch. ``delta_reward``, ``delta_f``,
    ``valid``, ``group_size``: [B, E]; ``set_size``: K per sample [B]; ``slot_types``: the
    exchange type of each of the E slots; ``cider_delta``, ``dense_delta`` [B, E]: CIDEr's and
    the dense term's dR, where both were computed. A statistic over no built exchange (or not
    computed) is None."""
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
                "g_over_k": float((group_size[built].double() / k[built]).mean()),
                "cider_zero": None, "agree": None})
            if cider_delta is not None and dense_delta is not None:
                by_cider, by_dense = cider_delta[built], dense_delta[built]
                moved = by_cider != 0
                entry["cider_zero"] = float((~moved).double().mean())
                if bool(moved.any()):
                    entry["agree"] = float((torch.sign(by_dense[moved]) ==
                                            torch.sign(by_cider[moved])).double().mean())
        out[name] = entry
    return out


def grad_norm(term: torch.Tensor, params) -> torch.Tensor:
    """||d term / d params||, leaving the graph in place for the backward that follows."""
    grads = torch.autograd.grad(term, params, retain_graph=True, allow_unused=True)
    squares = [g.detach().double().square().sum() for g in grads if g is not None]
    if not squares:
        return torch.zeros((), dtype=torch.float64)
    return torch.stack(squares).sum().sqrt()


def _rl_records(metrics_path, key: str = "exchange_diagnostics") -> list[dict]:
    """The RL lines of a metrics.jsonl that carry ``key``."""
    records = []
    for line in Path(metrics_path).read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        if record.get("phase") == "rl" and record.get(key):
            records.append(record)
    return records


def _means(slots: dict, statistics) -> dict:
    return {key: {"micro_batches": slot["micro_batches"],
                  **{stat: (float(np.mean(slot[stat])) if slot.get(stat) else None)
                     for stat in statistics}}
            for key, slot in slots.items()}


def summarize(metrics_path) -> dict:
    """Means over a run's RL micro-batches, per exchange type and for the RL groups
    (``anchors``): ``all`` and per retention (``"0.2"``, ...), each {statistic: mean or None,
    "micro_batches": count}. A run without exchanges has ``anchors`` alone."""
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
                _add(sums.setdefault(name, {}), micro["retention"], values)
    out = {name: _means(by_key, (*STATISTICS, "grad_ratio") if name != "total"
                        else ("grad_ratio", "unscaled", "exchange_scale"))
           for name, by_key in sums.items()}
    anchors: dict = {}
    for record in _rl_records(metrics_path, "reward_diagnostics"):
        for micro in record["reward_diagnostics"]:
            _add(anchors, micro["retention"], {s: micro.get(s) for s in ANCHOR_STATISTICS})
    if anchors:
        out["anchors"] = _means(anchors, ANCHOR_STATISTICS)
    return out


def _add(by_key: dict, retention: float, values: dict) -> None:
    """One micro-batch's ``values`` into the running lists of ``all`` and its retention."""
    for key in ("all", f"{retention:g}"):
        slot = by_key.setdefault(key, {"micro_batches": 0})
        slot["micro_batches"] += 1
        for stat, value in values.items():
            if value is not None:
                slot.setdefault(stat, []).append(value)


def _series(records, key: str, pick) -> tuple[list, list]:
    """(steps, per-step means) of ``pick(micro)`` over each record's ``key`` entries (None
    skipped; a step with none is left out)."""
    steps, values = [], []
    for record in records:
        got = [v for v in (pick(m) for m in record[key]) if v is not None]
        if got:
            steps.append(record["step"])
            values.append(float(np.mean(got)))
    return steps, values


def _smoothed(ax, steps, values, *, window: int | None = None, **style) -> bool:
    if not values:
        return False
    window = max(1, min(10, len(values) // 5)) if window is None else window
    smooth = np.convolve(values, np.ones(window) / window, mode="valid")
    ax.plot(steps[window - 1:], smooth, **style)
    return True


def _type_label(name: str) -> str:
    return "L_ex" if name == "total" else f"{name[0].upper()}>{name[1].upper()}"


def _panels(reward_records: list, exchange_records: list) -> list[tuple[str, str]]:
    """(statistic, title) of each panel :func:`plot` draws for these records."""
    panels = []
    if reward_records:
        panels.append(("ties", "share of RL groups whose anchors all tie"))
    if exchange_records:
        panels += [("zero", "share of dR = 0"), ("disagree", "share disagreeing with the ranking"),
                   ("g_over_k", "mean g / K"),
                   ("grad_ratio", "||grad lambda L_ex,type|| / ||grad L_RL||")]
    has_agreement = any(m.get("agree") is not None for r in reward_records
                        for m in r["reward_diagnostics"]) or any(
        t.get("agree") is not None for r in exchange_records for m in r["exchange_diagnostics"]
        for t in m["types"].values())
    if has_agreement:
        panels.append(("agree", "share of dense dR with CIDEr's sign (CIDEr dR != 0)"))
    return panels


def plot(metrics_path, path) -> Path | None:
    """Panels against the RL step (10-step running means): the share of RL groups whose anchors
    all tie, per retention (CIDEr's dashed, where computed); with exchanges, per type, the
    share of dR = 0, the share disagreeing with the ranking, the mean g / K and the
    gradient-norm ratio; where CIDEr and a dense reward were both computed, how often the
    dense dR has CIDEr's sign (anchor pairs and each exchange type)."""
    exchange_records = _rl_records(metrics_path)
    reward_records = _rl_records(metrics_path, "reward_diagnostics")
    if not exchange_records and not reward_records:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = _panels(reward_records, exchange_records)
    columns = 1 if len(panels) == 1 else 2 if len(panels) <= 4 else 3
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5.5 * columns, 3.5 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    names = list(dict.fromkeys(n for r in exchange_records for m in r["exchange_diagnostics"]
                               for n in m["types"])) + ["total"]
    retentions = sorted({m["retention"] for r in reward_records
                         for m in r["reward_diagnostics"]}, reverse=True)
    for ax, (stat, title) in zip(axes.flat, panels):
        drawn = False
        if stat == "ties":
            for i, retention in enumerate(retentions):
                color = f"C{i}"
                for field, dashes in (("tied", "-"), ("cider_tied", "--")):
                    steps, values = _series(reward_records, "reward_diagnostics",
                                            lambda m, f=field, r=retention: m.get(f)
                                            if m["retention"] == r else None)
                    drawn |= _smoothed(ax, steps, values, color=color, linestyle=dashes, marker=".",
                                       label=f"{retention:.0%}" + (" (CIDEr)" if
                                                                  field == "cider_tied" else ""))
            ax.set_ylim(-0.02, 1.02)
        elif stat == "agree":
            steps, values = _series(reward_records, "reward_diagnostics",
                                    lambda m: m.get("agree"))
            drawn |= _smoothed(ax, steps, values, window=1, color="black", marker="o",
                               markersize=3, label="anchor pairs")
            for name in names[:-1]:
                steps, values = _series(exchange_records, "exchange_diagnostics",
                                        lambda m, n=name: m["types"].get(n, {}).get("agree"))
                drawn |= _smoothed(ax, steps, values, window=1, marker="o", markersize=3,
                                   label=_type_label(name))
            ax.set_ylim(-0.02, 1.02)
        else:
            positive = False
            for name in names:
                if name == "total" and stat != "grad_ratio":
                    continue
                steps, values = _series(
                    exchange_records, "exchange_diagnostics",
                    (lambda m, n=name: (m.get("grad_ratio") or {}).get(n)) if stat == "grad_ratio"
                    else (lambda m, n=name: m["types"].get(n, {}).get(stat)))
                positive = positive or bool(values and max(values) > 0)
                drawn |= _smoothed(ax, steps, values, window=1 if stat == "grad_ratio" else None,
                                   label=_type_label(name),
                                   color="black" if name == "total" else None,
                                   marker="o" if stat == "grad_ratio" else None, markersize=3)
            if stat == "grad_ratio" and positive:
                ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("RL step")
        if drawn:
            ax.legend(fontsize=8)
    return save_figure(fig, Path(path))


def write_report(run_dir) -> dict:
    """``exchange_diagnostics.json`` and ``.png`` in ``run_dir`` from its metrics.jsonl."""
    run_dir = Path(run_dir)
    summary = summarize(run_dir / METRICS_FILE)
    (run_dir / EXCHANGE_DIAGNOSTICS_FILE).write_text(json.dumps(summary, indent=1) + "\n")
    plot(run_dir / METRICS_FILE, run_dir / EXCHANGE_DIAGNOSTICS_FIGURE)
    return summary
