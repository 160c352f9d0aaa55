"""The gates' report (``python -m avex.evaluate gates``): :func:`to_markdown` and
:func:`write_report` (the Markdown and the JSON beside it) of what
:func:`avex.evaluate.gates.run_gates` measured."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from avex.judge_identity import judge_line
from avex.tables import markdown_table

from .gates import CRITICAL_GAIN, NEGLIGIBLE_GAIN, share_of

def _percent(share):
    return None if share is None else 100 * share


def _f(value, digits: int = 1) -> str:
    return "n/a" if value is None or (isinstance(value, float) and np.isnan(value)) \
        else f"{value:.{digits}f}"


def to_markdown(report: dict, command: str, timing_note: str | None = None) -> str:
    sections = [_header(report, command, timing_note), _full_tokens(report),
                _random_pruning(report), _attention_vs_gain(report), _redundancy(report),
                _non_additivity(report), _references(report)]
    return "\n\n".join(sections) + "\n"


def _header(report: dict, command: str, timing_note: str | None) -> str:
    run, machine = report["run"], report["run"]["machine"]
    lines = ["# Embedded benchmark: measured gates", "",
             f"Produced by `{command}` on {run['date']} ({machine['cores']}-core "
             f"{machine['cpu']}, torch {machine['torch']}, CUDA: {machine['cuda']}; the machine "
             f"was shared with other jobs: load average {_f(run['load_average_start'], 2)} at "
             f"the start, {_f(run['load_average_end'], 2)} at the end). The run took "
             f"{run['seconds']:.0f} s.", "",
             f"Benchmark: `{report['benchmark']}`; captioner: `{report['captioner']}`. CIDEr "
             "values are x100 (the paper's units) and come from "
             f"{run.get('cider_source', 'pycocoevalcap')} (PTB tokenizer); greedy decoding."]
    if timing_note:
        lines += ["", timing_note]
    train = report.get("captioner_training", {})
    if train:
        lines += ["", f"Captioner: {train.get('num_layers')} layers, hidden "
                  f"{train.get('hidden_size')}, {train.get('steps')} steps of batch "
                  f"{train.get('batch_size')} in {train.get('seconds')} s on "
                  f"{train.get('device')}; val CIDEr {train.get('val_cider')} "
                  f"on {train.get('val_clips')} val clips."]
    return "\n".join(lines)


def _metric_cells(m: dict) -> list[str]:
    return [_f(m["C_av"]), _f(m.get("C_v")), _f(m.get("C_a")), _f(m["BLEU-4"]), _f(m["METEOR"])]


def _full_tokens(report: dict) -> str:
    rows = [["test", report["test_clips"], *_metric_cells(report["full"])]]
    if "transfer_full" in report:
        rows.append(["transfer (not trained on)", report["transfer_clips"],
                     *_metric_cells(report["transfer_full"])])
    examples = [f"- `{ex['clip_id']}`: \"{ex['caption']}\" (a reference: "
                f"\"{ex['reference']}\")" for ex in report["examples"]]
    return "\n".join(["## Full tokens", "", markdown_table(
        ["split", "clips", "C_av", "C_v", "C_a", "BLEU-4", "METEOR"], rows), "",
        "Examples (test, full tokens):", "", *examples])


def _random_pruning(report: dict) -> str:
    full, settings = report["full"], report["run"]["settings"]
    rows = [["100%", _f(full["C_av"]), "1.00", _f(full.get("C_v")), _f(full.get("C_a"))]]
    for rho, row in report["random_sweep"].items():
        att = row["attention"]
        rows.append([f"{float(rho) * 100:.0f}%", f"{_f(row['C_av'])} ± {_f(row['C_av_std'])}",
                     _f(share_of(row["C_av"], full["C_av"]), 2),
                     f"{_f(row.get('C_v'))} ± {_f(row.get('C_v_std'))}",
                     f"{_f(row.get('C_a'))} ± {_f(row.get('C_a_std'))}",
                     _f(att["C_av"]), _f(att.get("C_v")), _f(att.get("C_a"))])
    share = report["gate_random_lowest_share"]
    lowest = min(float(r) for r in report["random_sweep"])
    verdict = "PASS" if share < 0.6 else "FAIL"   # NaN (no full-token CIDEr) fails
    return "\n".join([
        "## Random pruning (test split)", "",
        f"Mean ± std over {settings['seeds']} seeds; K = round(rho * M) AV tokens kept "
        "uniformly at random, text always kept, original position ids. The last columns are "
        "the balanced attention selection (top text-to-AV attention within each modality, "
        "K_a = round(K Na / N)), which the policy's warmup imitates.", "",
        markdown_table(["retention", "C_av", "C_av / full", "C_v", "C_a", "attention C_av",
                        "attention C_v", "attention C_a"], rows), "",
        "C_v scores the AV caption against the shorter visual-only references, so it can rise "
        "when pruning first removes the audio clause (CIDEr-D's length penalty then favours the "
        "shorter caption); compare methods on C_v at equal retention, not against the "
        "full-token value.", "",
        f"**Gate:** C_av at {lowest * 100:.0f}% random retention is {_f(share * 100)}% of full "
        f"tokens (must be below 60%): **{verdict}**."])


def _attention_vs_gain(report: dict) -> str:
    ph, settings = report["phenomena"], report["run"]["settings"]
    av = ph["attention_vs_gain"]
    rows = [["Spearman(attention, gain), per clip, mean", _f(av["spearman_per_clip_mean"], 3)],
            ["Spearman, per clip, median", _f(av["spearman_per_clip_median"], 3)],
            ["Spearman, all tokens pooled", _f(av["spearman_pooled"], 3)],
            ["Spearman, last prompt token's attention (FastV-style), per clip mean",
             _f(av["spearman_per_clip_mean_last_token"], 3)],
            [f"top-10% attention tokens with gain < {NEGLIGIBLE_GAIN:g}",
             f"{av['top_decile_attention_negligible_gain_share'] * 100:.0f}%"],
            [f"critical tokens (gain >= {CRITICAL_GAIN:g}) with below-median attention",
             f"{_f(_percent(av['critical_below_median_attention_share']), 0)}% "
             f"(of {av['critical_tokens']})"]]
    lines = ["## Phenomena", "",
             f"Counterfactual gains on the first {settings['counterfactual_clips']} test clips: "
             f"each AV token added to {settings['base_sets']} random base sets at "
             f"{settings['base_retention'] * 100:.0f}% retention that lack it; gain = CIDEr-D "
             "x100 difference (document frequencies from the test references).", "",
             "### Attention is a poor proxy for contribution (Fig. 1a)", "",
             markdown_table(["measure", "value"], rows)]
    if "by_role" in ph:
        lines += ["", "By generated token role (roles are annotations for analysis; no method "
                  "reads them):", "", markdown_table(
                      ["role", "tokens", "mean attention", "mean gain", "critical share"],
                      [[name, r["tokens"], f"{r['attention_mean']:.4f}", f"{r['gain_mean']:.1f}",
                        f"{r['critical_share'] * 100:.0f}%"] for name, r in ph["by_role"].items()])]
    return "\n".join(lines)


def _redundancy(report: dict) -> str:
    ph = report["phenomena"]
    red = ph["redundancy"]
    rows = [["cosine with the same patch in the next frame / the next audio token",
             f"{red['visual_adjacent_frame_cosine']:.2f}",
             f"{red['audio_adjacent_step_cosine']:.2f}"],
            ["tokens with a near-duplicate (cos >= 0.9) in another frame / time step",
             f"{red['visual_near_duplicate_share'] * 100:.0f}%",
             f"{red['audio_near_duplicate_share'] * 100:.0f}%"],
            [f"caption-critical tokens (counterfactual gain >= {CRITICAL_GAIN:g})",
             f"{ph['visual_critical_share'] * 100:.0f}%",
             f"{ph['audio_critical']['all']['critical_share'] * 100:.0f}%"],
            [f"tokens with negligible gain (abs < {NEGLIGIBLE_GAIN:g})",
             f"{ph['visual_negligible_gain_share'] * 100:.0f}%", ""]]
    lines = ["### Visual tokens are dense and redundant; audio tokens are sparse", "",
             markdown_table(["measure", "visual", "audio"], rows), "",
             "Share of caption-critical audio tokens by kind of audio track:", "",
             markdown_table(["audio track", "clips", "critical audio tokens"],
                            [[kind, r["clips"], f"{r['critical_share'] * 100:.0f}%"]
                             for kind, r in ph["audio_critical"].items()])]
    if "audio_content_token_share" in ph:
        lines += ["", f"Audio tokens that carry captioned content by construction (event or "
                  f"music): {ph['audio_content_token_share'] * 100:.0f}%."]
    return "\n".join(lines)


def _non_additivity(report: dict) -> str:
    na = report["phenomena"]["non_additivity"]
    rows = []
    for name, label in (("own_sound", "subject makes the sound"),
                        ("background_sound", "sound from elsewhere")):
        if name in na:
            r = na[name]
            rows.append([label, r["clips"], f"{r['mean_gain_visual']:.1f}",
                         f"{r['mean_gain_audio']:.1f}", f"{r['mean_gain_both']:.1f}",
                         f"{r['mean_deviation']:.1f}", f"{r['mean_abs_deviation']:.1f}",
                         f"{r['share_abs_deviation_over_5'] * 100:.0f}%"])
    return "\n".join([
        "### Audio-visual content is non-additive (Fig. 1b)", "",
        f"Per test clip with a visible subject and a sound event: G_v = {na['group_size']} "
        f"subject tokens, G_a = {na['group_size']} event tokens, base = random tokens from the "
        "rest at the base retention. Deviation = gain(G_v + G_a) - gain(G_v) - gain(G_a).", "",
        markdown_table(["clips", "n", "gain G_v", "gain G_a", "gain both", "mean deviation",
                        "mean abs deviation", "abs deviation > 5"], rows)])


def _references(report: dict) -> str:
    refs = report["phenomena"]["references"]
    return "\n".join([
        "### References", "",
        f"Distinct AV references per clip: {refs['distinct_av_refs_per_clip']:.2f} of 5; mean "
        f"length {refs['mean_av_ref_words']:.1f} words; vocabulary "
        f"{refs['reference_vocabulary']} words; leave-one-out CIDEr-D of one AV reference "
        f"against the other four: {refs['leave_one_out_cider_av']:.1f}."])


def write_report(report: dict, out_md, command: str, timing_note: str | None = None) -> Path:
    out_md = Path(out_md)
    out_md.parent.mkdir(parents=True, exist_ok=True)
    markdown = to_markdown(report, command, timing_note)
    if report.get("judge"):
        markdown = markdown.rstrip("\n") + "\n\n" + judge_line(report["judge"]) + "\n"
    out_md.write_text(markdown)
    out_md.with_suffix(".json").write_text(json.dumps(report, indent=1, default=float) + "\n")
    return out_md
