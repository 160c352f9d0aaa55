"""Paired bootstrap intervals (avex.intervals): their contracts on arrays, on a results
file's rows, and their coverage on synthetic data."""
import argparse
import math
from statistics import NormalDist

import numpy as np
import pytest

from avex.intervals import (Interval, compact_per_clip, difference_table, differences,
                            interval_fields, paired_interval, parse_plans, planned_interval,
                            pooled_interval, seed_rows, variance_components)


def test_identical_inputs_give_zero_zero():
    scores = np.random.default_rng(0).normal(400, 120, (3, 300))
    interval = paired_interval(scores, scores)
    assert (interval.difference, interval.low, interval.high) == (0.0, 0.0, 0.0)
    assert (interval.clips, interval.seeds) == (300, 3)


def test_a_constant_shift_gives_an_interval_around_it():
    other = np.random.default_rng(1).normal(400, 120, 500)
    interval = paired_interval(other + 7.5, other)
    assert interval.difference == pytest.approx(7.5)
    assert interval.low == pytest.approx(7.5) and interval.high == pytest.approx(7.5)
    assert interval.above_zero and not interval.below_zero
    flipped = paired_interval(other, other + 7.5)
    assert flipped.below_zero and flipped.text() == "-7.5 [-7.5, -7.5]"


def test_pairing_removes_the_clips_own_spread():
    """Clips differ by hundreds of points, the two methods by 3 +- 5 per clip: the paired
    interval is as narrow as the per-clip differences allow, far narrower than the clips'
    spread would make an unpaired one (2 x 1.96 x 120 x sqrt(2 / 1000), about 21 points)."""
    rng = np.random.default_rng(2)
    other = rng.normal(400, 120, 1000)
    ours = other + rng.normal(3, 5, 1000)
    interval = paired_interval(ours, other)
    assert interval.low < interval.difference < interval.high
    assert abs(interval.difference - 3) < 1 and interval.high - interval.low < 1.5
    assert interval.above_zero


def test_seeds_are_resampled_with_the_clips():
    """Two seeds, one level with the other method and one 10 points ahead on every clip: the
    replicates' seed draws give 0, 5 or 10 (probabilities 1/4, 1/2, 1/4), so the 95% interval
    is [0, 10]. Without resampling seeds it would be [5, 5]."""
    other = np.random.default_rng(3).normal(400, 120, 200)
    ours = np.stack([other, other + 10])
    interval = paired_interval(ours, other)
    assert interval.difference == pytest.approx(5)
    assert interval.low == pytest.approx(0) and interval.high == pytest.approx(10)
    assert interval.seeds == 2


def test_a_method_without_a_seed_is_used_for_every_seed():
    rng = np.random.default_rng(4)
    ours, other = rng.normal(400, 100, (3, 100)), rng.normal(380, 100, 100)
    interval = paired_interval(ours, other)
    assert interval.difference == pytest.approx(ours.mean() - other.mean())
    # the same seedless row given once per seed is the same comparison
    again = paired_interval(ours, np.stack([other] * 3))
    assert (again.low, again.high) == pytest.approx((interval.low, interval.high))
    reverse = paired_interval(other, ours)
    assert reverse.difference == pytest.approx(-interval.difference)


def test_reproducible_from_its_seed():
    rng = np.random.default_rng(5)
    ours, other = rng.normal(400, 100, (3, 150)), rng.normal(395, 100, (3, 150))
    assert paired_interval(ours, other, seed=11) == paired_interval(ours, other, seed=11)
    assert paired_interval(ours, other, seed=11) != paired_interval(ours, other, seed=12)


def test_coverage_on_synthetic_data():
    """Per-clip differences drawn around a known mean: the 95% interval holds it in about 95%
    of 200 draws (a binomial's 1.5% sd; the percentile bootstrap runs slightly narrow)."""
    rng = np.random.default_rng(6)
    true, held = 2.0, 0
    for _ in range(200):
        other = rng.normal(400, 120, 200)
        ours = other + rng.normal(true, 15, 200)
        interval = paired_interval(ours, other, replicates=1000, seed=int(rng.integers(1 << 30)))
        held += interval.low <= true <= interval.high
    assert 0.89 <= held / 200 <= 0.99


@pytest.mark.parametrize("call,error,match", [
    (lambda: paired_interval(np.zeros(200), np.zeros(199)), ValueError,
     "other has 199 clips but ours has 200"),
    (lambda: paired_interval(np.zeros((3, 10)), np.zeros((2, 10))), ValueError,
     "other has 2 seed rows but ours has 3"),
    (lambda: paired_interval(np.zeros((2, 2, 2)), np.zeros(2)), ValueError,
     r"ours must be \[clips\] or \[seeds, clips\], got shape \(2, 2, 2\)"),
    (lambda: paired_interval([], [1.0]), ValueError, r"ours is empty \(shape \(1, 0\)\)"),
    (lambda: paired_interval([1.0, float("nan")], [1.0, 2.0]), ValueError,
     "ours must be finite, got nan at seed row 0, clip 1"),
    (lambda: paired_interval([1.0], ["a"]), TypeError, "other must be per-clip scores"),
    (lambda: paired_interval([1.0], [1.0], level=1.0), ValueError,
     r"level must be a finite number in \(0, 1\), got 1.0"),
    (lambda: paired_interval([1.0], [1.0], replicates=10), ValueError,
     "replicates must be >= 100, got 10"),
    (lambda: paired_interval([1.0], [1.0], seed=-1), ValueError, "seed must be >= 0, got -1"),
])
def test_bad_input_is_refused_naming_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


# -- from a results file's rows ------------------------------------------------------------------

def sweep_rows(clips=60, seeds=(0, 1, 2)):
    """Rows shaped as sweep.json's: full tokens once, a seedless method repeated per seed, a
    trained one per training seed."""
    rng = np.random.default_rng(7)
    full = rng.normal(450, 100, clips)
    tome = full - 30 + rng.normal(0, 10, clips)
    rows = [{"method": "full", "retention": 1.0, "seed": None,
             "per_clip": compact_per_clip({"C_av": full})}]
    avex = {}
    for seed in seeds:
        avex[seed] = full - 5 + rng.normal(0, 10, clips)
        rows.append({"method": "tome", "retention": 0.4, "seed": seed,
                     "per_clip": compact_per_clip({"C_av": tome})})
        rows.append({"method": "avex", "retention": 0.4, "seed": seed,
                     "per_clip": compact_per_clip({"C_av": avex[seed]})})
    return rows, full, tome, avex


def test_rows_give_the_interval_of_their_per_clip_scores():
    rows, full, tome, avex = sweep_rows()
    got = differences(rows, "avex", ["full", "tome"], [0.4])
    ours = np.round(np.stack([avex[s] for s in (0, 1, 2)]), 2)
    assert got[("tome", 0.4)] == paired_interval(ours, np.round(tome, 2))
    assert got[("full", 0.4)] == paired_interval(ours, np.round(full, 2))
    assert got[("tome", 0.4)].above_zero and got[("full", 0.4)].below_zero
    assert seed_rows(rows, "tome", 0.4).keys() == {0, 1, 2}
    table = difference_table(got, "AVEX-Prune", {"full": "Full tokens", "tome": "ToMe-AV"},
                             [0.4])
    assert "| AVEX-Prune − method | 40% |" in table
    assert f"| ToMe-AV | {got[('tome', 0.4)].text()} |" in table


def test_rows_without_per_clip_scores_or_with_unpaired_seeds_say_why():
    rows, *_ = sweep_rows()
    old = [{k: v for k, v in r.items() if k != "per_clip"} for r in rows]
    got = differences(old, "avex", ["tome"], [0.4])
    assert got[("tome", 0.4)] == "no interval: per-clip scores not recorded"
    unpaired = [dict(r, seed=r["seed"] + 5) if r["method"] == "tome" else r for r in rows]
    reason = differences(unpaired, "avex", ["tome"], [0.4])[("tome", 0.4)]
    assert reason.startswith("no interval: tome has training seeds [5, 6, 7] but avex has "
                             "[0, 1, 2]")
    assert differences(rows, "avex", ["tome"], [0.2])[("tome", 0.2)] == \
        "no interval: no avex row at 20%"


def test_results_files_store_an_interval_or_why_there_is_none_under_one_key():
    rows, *_ = sweep_rows()
    got = differences(rows, "avex", ["tome"], [0.4, 0.2])
    stored = interval_fields(got[("tome", 0.4)])
    assert Interval(**stored) == got[("tome", 0.4)]
    assert interval_fields(got[("tome", 0.2)]) == {"none": "no interval: no avex row at 20%"}


def test_compact_per_clip_rounds_and_keeps_the_mean():
    values = np.random.default_rng(8).normal(400, 100, 1000)
    stored = compact_per_clip({"C_av": values})["C_av"]
    assert all(round(x, 2) == x for x in stored)
    assert abs(np.mean(stored) - values.mean()) <= 0.005
    assert isinstance(Interval(1, 0, 2, 0.95, 3, 1, 100).as_dict()["difference"], int)


def test_one_stratum_pools_to_its_paired_interval():
    rng = np.random.default_rng(5)
    other = rng.normal(400, 120, (3, 400))
    ours = other + rng.normal(2, 8, (3, 400))
    assert pooled_interval([(ours, other)]) == paired_interval(ours, other)


def test_strata_are_weighted_equally_and_resampled_on_their_own():
    """+10 on a benchmark of 100 clips and 0 on one of 2000: the pooled difference is 5 (not
    the clip-weighted 0.5), and the small benchmark's noise widens the interval."""
    rng = np.random.default_rng(6)
    small, large = rng.normal(400, 100, (3, 100)), rng.normal(400, 100, (3, 2000))
    small_ours = small + 10 + rng.normal(0, 20, small.shape)
    large_ours = large + rng.normal(0, 20, large.shape)
    interval = pooled_interval([(small_ours, small), (large_ours, large)])
    assert interval.difference == pytest.approx(
        ((small_ours - small).mean() + (large_ours - large).mean()) / 2)
    assert interval.low < interval.difference < interval.high
    assert (interval.clips, interval.seeds) == (2100, 6)
    alone = paired_interval(small_ours, small)
    assert interval.high - interval.low == pytest.approx((alone.high - alone.low) / 2, rel=0.2)


def test_pooling_refuses_unpaired_or_no_strata():
    with pytest.raises(ValueError, match="strata is empty"):
        pooled_interval([])
    with pytest.raises(ValueError, match=r"strata\[1\]: other has 5 clips but ours has 4"):
        pooled_interval([(np.zeros(4), np.zeros(4)), (np.zeros(4), np.zeros(5))])


def test_full_tokens_take_a_name_no_row_carries():
    """The ablation has a variant called "full" (Full AVEX, g = 8) beside full tokens: full
    tokens must go by another name there, and a collision is refused, not silently merged."""
    rng = np.random.default_rng(3)
    clips = 40
    full_tokens = rng.normal(450, 100, clips)
    a = {s: full_tokens - 20 + rng.normal(0, 5, clips) for s in (0, 1)}
    full_avex = {s: full_tokens - 25 + rng.normal(0, 5, clips) for s in (0, 1)}
    rows = [{"variant": name, "retention": 0.2, "seed": s,
             "per_clip": compact_per_clip({"C_av": scores[s]})}
            for name, scores in (("A", a), ("full", full_avex)) for s in (0, 1)]
    full = {"per_clip": compact_per_clip({"C_av": full_tokens})}
    with pytest.raises(ValueError, match="a row's variant is 'full'"):
        differences(rows, "A", ["full"], [0.2], key="variant", full=full)
    got = differences(rows, "A", ["full", "full tokens"], [0.2], key="variant", full=full,
                      full_key="full tokens")
    ours = np.round(np.stack([a[0], a[1]]), 2)
    assert got[("full", 0.2)] == paired_interval(ours, np.round(np.stack(
        [full_avex[0], full_avex[1]]), 2))
    assert got[("full tokens", 0.2)] == paired_interval(ours, np.round(full_tokens, 2))
    assert got[("full", 0.2)].above_zero and got[("full tokens", 0.2)].below_zero


def test_arm_pairs_parse_and_name_a_malformed_item():
    import argparse

    from avex.intervals import arm_pairs

    assert arm_pairs("Dc-fid:Cc-fid,A:B@old") == [("Dc-fid", "Cc-fid"), ("A", "B@old")]
    for bad in ("A", "A:", ":B", "A:B,"):
        with pytest.raises(argparse.ArgumentTypeError, match="--pairs must be X:Y"):
            arm_pairs(bad)


# -- planning a deciding benchmark ---------------------------------------------------------------

def test_variance_components_are_exact_on_an_additive_matrix():
    # d = a_s + b_c with no residual: the components are the two sample variances
    seed_effects, clip_effects = np.array([-1.0, 0.5, 2.0]), np.linspace(-30, 40, 7)
    diff = seed_effects[:, None] + clip_effects[None, :]
    seed, clip, residual = variance_components(diff)
    assert seed == pytest.approx(seed_effects.var(ddof=1))
    assert clip == pytest.approx(clip_effects.var(ddof=1))
    assert residual == pytest.approx(0.0, abs=1e-12)


def test_variance_components_recover_a_simulated_benchmark():
    rng = np.random.default_rng(0)
    diff = (rng.normal(0, 3, (40, 1)) + rng.normal(0, 40, (1, 2000))
            + rng.normal(0, 20, (40, 2000)))
    seed, clip, residual = variance_components(diff)
    assert seed == pytest.approx(9, rel=0.5)
    assert clip == pytest.approx(1600, rel=0.1)
    assert residual == pytest.approx(400, rel=0.05)


def test_a_planned_interval_is_the_normal_approximation_at_that_size():
    half, chance = planned_interval((9.0, 1600.0, 400.0), 4.0, 1000, 3)
    se = math.sqrt(9 / 3 + 1600 / 1000 + 400 / 3000)
    assert half == pytest.approx(1.959964 * se, rel=1e-6)
    assert chance == pytest.approx(NormalDist().cdf(4.0 / se - 1.959964), rel=1e-5)
    # a gap of exactly the half-width is resolved half of the time, on either side
    assert planned_interval((9.0, 1600.0, 400.0), -half, 1000, 3)[1] == pytest.approx(0.5)
    # more seeds shrink the seed part, more clips the clip part
    assert planned_interval((9.0, 1600.0, 400.0), 4.0, 1000, 10)[0] < half
    assert planned_interval((9.0, 1600.0, 400.0), 4.0, 4000, 3)[0] < half
    assert planned_interval((0.0, 0.0, 0.0), 1.0, 10, 2) == (0.0, 1.0)


def test_a_planned_interval_matches_the_bootstrap_without_a_seed_effect():
    rng = np.random.default_rng(1)
    clips = rng.normal(0, 40, (1, 1000))
    ours = 5 + clips + rng.normal(0, 20, (3, 1000))
    other = np.zeros_like(ours)
    half, _ = planned_interval(variance_components(ours - other), 5.0, 1000, 3)
    boot = paired_interval(ours, other, replicates=1000)
    assert (boot.high - boot.low) / 2 == pytest.approx(half, rel=0.15)


@pytest.mark.parametrize("diff, match", [
    ([[1.0, 2.0, 3.0]], r"diff must be \[seeds, clips\] with >= 2 of each, got shape \[1, 3\]"),
    ([[1.0], [2.0]], r"got shape \[2, 1\]"),
    ([[1.0, float("nan")], [2.0, 3.0]], r"diff must be finite, got nan at seed row 0, clip 1"),
])
def test_variance_components_refuse_what_they_cannot_split(diff, match):
    with pytest.raises(ValueError, match=match):
        variance_components(diff)


def test_plans_parse_and_bad_ones_are_named():
    assert parse_plans("1000x3,2000x10") == [(1000, 3), (2000, 10)]
    for text in ("1000", "1000x0", "ax3", "1000x3,"):
        with pytest.raises(argparse.ArgumentTypeError, match="--plan must be CLIPSxSEEDS"):
            parse_plans(text)
