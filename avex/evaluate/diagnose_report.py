"""The diagnosis's report (``python -m avex.evaluate diagnose``): its Markdown
(:func:`report_markdown`) and the JSON file's compact copy (:func:`compact_result`) of what
:func:`avex.evaluate.diagnose.run_diagnose` measured."""
from __future__ import annotations

from avex.judge_identity import judge_line
from avex.tables import markdown_table

#: the rows of one retention, in table order: name -> label
ROWS = {"policy": "policy Top-K (deployed)",
        "every-role": "role oracle: every subject, event and music token (+ policy fill)",
        "one-per-role": "role oracle: one coloured subject token, each event's onset, music "
                        "(+ policy fill)",
        "sample-mean": "policy samples: the mean sample",
        "best-fidelity": "best of N by log p(y_full \\| S) (reference-free)",
        "best-cider": "best of N by CIDEr (oracle: reads the references)"}


def compact_result(result: dict) -> dict:
    """The JSON file's copy: per-clip scores rounded to 2 decimals, captions of the policy
    only (the others can be regenerated from the command)."""
    def clip_scores(values):
        return [round(float(v), 2) for v in values]
    copy = dict(result, full=dict(result["full"], per_clip=clip_scores(result["full"]
                                                                         ["per_clip"])))
    copy["retentions"] = {}
    for key, block in result["retentions"].items():
        rows = {}
        for name, row in block["rows"].items():
            row = dict(row, per_clip=clip_scores(row["per_clip"]))
            if name != "policy":
                row.pop("captions", None)
            rows[name] = row
        copy["retentions"][key] = dict(block, rows=rows)
    return copy


def _points(value) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _share(value) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"


def _interval(row: dict) -> str:
    iv = row.get("minus_policy")
    if not iv:
        return "–"
    return f"{iv['difference']:+.1f} [{iv['low']:+.1f}, {iv['high']:+.1f}]"


def report_markdown(result: dict) -> str:
    s = result["settings"]
    lines = [f"# Where the lost CIDEr goes: {s['split']} split, {s['clips']} clips", "",
             f"Policy: `{s['run']}` ({s['recipe']}; weights sha256 "
             f"`{s['policy_sha256'][:16]}`). Decoding: {s['num_beams']} beam(s), "
             f"{s['max_new_tokens']} new tokens. N = {s['samples']} Gumbel-Top-K samples per "
             f"clip at tau {s['tau']:g} (seed {s['seed']}).", "",
             f"Full tokens: C_av {result['full']['C_av']:.1f}; their captions state the "
             f"generator's content exactly (every slot) on "
             f"{_share(result['full']['slots_correct'])} of clips.", ""]
    for key, block in result["retentions"].items():
        rows = block["rows"]
        lines += [f"## {block['retention']:.0%} retention (K = {block['k']})", "",
                  "C_av loss = full-token C_av − the row's; the interval is the row − the "
                  "policy's Top-K, paired bootstrap 95% over clips. Exact: the share of clips "
                  "whose caption is the full-token caption. log p: the mean teacher-forced "
                  "log-likelihood per token of y_full under the set.", ""]
        table = [[ROWS[name], _points(r["C_av"]), _points(r["loss"]), _share(r["exact"]),
                  f"{r['log_prob']:.3f}", _interval(r)] for name, r in rows.items()]
        lines += [markdown_table(["set", "C_av", "loss", "exact", "log p", "− policy [95%]"],
                                 table), ""]
        agree = rows["best-fidelity"].get("agrees_with_best_cider")
        lines += [f"Best of N by log p picks a sample with the best CIDEr of the N on "
                  f"{_share(agree)} of clips. The policy's captions state the generator's "
                  f"content exactly on {_share(block['policy_slots_correct'])} of clips.", ""]
        diff = block["by_difference"]
        lines += ["### Loss by kind of difference (policy Top-K against full tokens)", "",
                  "Carried: the points of the mean C_av loss that the clips of the row "
                  "account for (exact + paraphrase + content = the loss; a caption can change "
                  "several slots, so the slot rows overlap).", ""]
        table = [[name, str(d["clips"]), _share(d["share"]), _points(d["mean_loss"]),
                  _points(d["carried"]), _share(d["carried_share"])]
                 for name, d in (("exact", diff["exact"]), ("paraphrase", diff["paraphrase"]),
                                 ("content change", diff["content"]))]
        table += [[f"&nbsp;&nbsp;{slot} changed", str(d["clips"]), _share(d["share"]),
                   _points(d["mean_loss"]), _points(d["carried"]), _share(d["carried_share"])]
                  for slot, d in diff["slots"].items()]
        lines += [markdown_table(["difference", "clips", "share", "mean loss", "carried",
                                  "of the loss"], table), ""]
        lines += ["### Loss by clip (policy Top-K)", ""]
        table = []
        for attribute, values in block["by_clip"].items():
            for value, d in values.items():
                table.append([attribute, value, str(d["clips"]), _points(d["full"]),
                              _points(d["pruned"]), _points(d["mean_loss"]),
                              _points(d["carried"]), _share(d["carried_share"])])
        lines += [markdown_table(["attribute", "value", "clips", "full C_av", "pruned C_av",
                                  "mean loss", "carried", "of the loss"], table), ""]
    lines += ["## Ties in training", ""]
    ties = result["ties"]
    if ties:
        same = s["ties_run_policy_sha256"] == s["policy_sha256"]
        whose = "" if s["ties_run"] == s["run"] else (
            " (a run whose final policy weights are the diagnosed policy's, byte for byte)"
            if same else f" (a run whose final policy weights differ from the diagnosed "
            f"policy's: sha256 `{s['ties_run_policy_sha256'][:16]}`)")
        lines += [f"The share of RL groups (a clip's anchors) whose rewards all tied, from "
                  f"`{s['ties_run']}/metrics.jsonl`{whose} (`reward_diagnostics`); figure: "
                  f"`{result['ties_figure']}`.", ""]
        keys = sorted((k for k in ties if k != "all"), key=float, reverse=True) + ["all"]
        lines += [markdown_table(["retention", "tied groups", "micro-batches"],
                                 [[k if k == "all" else f"{float(k):.0%}",
                                   _share(ties[k]["tied"]), str(ties[k]["micro_batches"])]
                                  for k in keys if k in ties]), ""]
    else:
        lines += [f"`{s['ties_run']}/metrics.jsonl` has no `reward_diagnostics` (the run was "
                  "trained before they were logged).", ""]
    lines += [f"Took {result['seconds']:.0f} s.", "", judge_line(s["judge"])]
    if result.get("command"):
        lines += ["", f"Command: `{result['command']}`"]
    return "\n".join(lines) + "\n"
