"""Exchange search, then distillation (issue #36 item 4): the paper's exchanges used as a local
search during training.

Per clip and drawn retention, the search starts from the policy's Top-K set and runs
``rounds`` rounds of exchanges (V>V, A>A, V>A, A>V, in turn). Each round builds its share of
the ``candidates`` exchange sets around the current set, the reward scores them, and the best
candidate replaces the current set when its reward is strictly higher. An exchange of type
X>Y removes G, the g lowest-scored tokens of modality X in the current set (never a token an
accepted swap put there: the search would undo its own gains), and inserts G': the
g - d highest-scored tokens of modality Y outside it (the paper's choice) and d drawn uniformly
from the rest of those tokens, however deep below the boundary (d = round(deep x g)).

Every evaluated swap is a labelled pair (dR = R(current) - R(candidate), dF = sum s_G -
sum s_G'), trained with the exchange term's pairwise loss; the final set, where the search
improved on Top-K, is distilled into the scores (:func:`distill_loss`).

Cost: 1 + ``candidates`` keep-sets rewarded per clip per step (the Top-K set and the
candidates), in ``rounds`` reward calls (the first one scores the Top-K set with its
candidates). :func:`round_sizes` says how the candidates split over the rounds.
"""
from __future__ import annotations

import math
import zlib
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

from avex import _checks
from avex.fidelity import break_ties
from avex.modality import AUDIO, VISUAL

__all__ = ["SearchResult", "Swaps", "Rewards", "swap_delta_f", "round_sizes", "candidate_types",
           "propose", "comparable", "primary", "run_search", "distill_loss", "search_seed"]

_CODE = {"v": VISUAL, "a": AUDIO}


def round_sizes(candidates: int, rounds: int) -> list[int]:
    """How many candidates each round builds: ``candidates`` split over ``rounds`` as evenly
    as possible, the earlier rounds taking the remainder (7 over 2: [4, 3])."""
    _checks.int_at_least("rounds", rounds, 1)
    _checks.int_at_least("candidates", candidates, rounds)
    base, extra = divmod(candidates, rounds)
    return [base + (r < extra) for r in range(rounds)]


def candidate_types(types, sizes: list[int]) -> list[list[str]]:
    """Each round's candidate types: the types in turn over every candidate of the search, so
    that each round of 4 candidates tries each type once."""
    types = list(types)
    out, j = [], 0
    for size in sizes:
        out.append([types[(j + c) % len(types)] for c in range(size)])
        j += size
    return out


def search_seed(seed: int) -> int:
    """The seed of a micro-batch's search draws, apart from its Gumbel draws."""
    return zlib.crc32(f"exchange-search:{seed}".encode())


def deep_count(g: int, deep: float) -> int:
    """d, how many of G's g inserted tokens are drawn from below the next-best (round half up)."""
    return min(g, int(math.floor(deep * g + 0.5)))


class Swaps(NamedTuple):
    """A round's candidates, C per clip: ``keep`` bool [B, C, M] (the current set where the
    exchange could not be built), ``removed`` / ``inserted`` int64 [B, C, g] (G and G', AV-axis
    positions), ``valid`` bool [B, C] and ``types`` (C names)."""
    keep: torch.Tensor
    removed: torch.Tensor
    inserted: torch.Tensor
    valid: torch.Tensor
    types: list


def _lowest(key: torch.Tensor, count: int) -> torch.Tensor:
    """Indices [B, count] of each row's ``count`` smallest keys (ties to the lower index)."""
    return torch.sort(key, dim=1, stable=True).indices[:, :count]


def propose(scores: torch.Tensor, keep: torch.Tensor, modality: torch.Tensor,
            protected: torch.Tensor, types, g: int, deep: float,
            generator: torch.Generator) -> Swaps:
    """One exchange of each of ``types`` around the current sets ``keep`` bool [B, M]
    (``scores`` [B, M], read without gradient; ``modality`` [B, M], PAD past a row;
    ``protected`` bool [B, M]: tokens an accepted swap inserted, never removed). Type X>Y
    removes the g lowest-scored unprotected X tokens of the set and inserts the g - d
    highest-scored Y tokens outside it plus d drawn uniformly from the other Y tokens outside
    it (:func:`deep_count`); it is valid where both pools hold g tokens."""
    s = scores.detach().double()
    rows = torch.arange(s.shape[0], device=s.device)[:, None]
    n_deep = deep_count(g, deep)
    inf = torch.full_like(s, float("inf"))
    keeps, removed, inserted, valid = [], [], [], []
    for name in types:
        out_code, in_code = _CODE[name[0]], _CODE[name[1]]
        leave = keep & (modality == out_code) & ~protected
        enter = ~keep & (modality == in_code)
        group_removed = _lowest(torch.where(leave, s, inf), g)
        near = _lowest(torch.where(enter, -s, inf), g - n_deep)
        rest = enter.clone()
        rest[rows, near] = False
        noise = torch.rand(s.shape, generator=generator, dtype=torch.float64).to(s.device)
        far = _lowest(torch.where(rest, noise, inf), n_deep)
        group_inserted = torch.cat([near, far], dim=1)
        ok = (leave.sum(1) >= g) & (enter.sum(1) >= g)
        changed = keep.clone()
        changed[rows, group_removed] = False
        changed[rows, group_inserted] = True
        keeps.append(torch.where(ok[:, None], changed, keep))
        removed.append(group_removed)
        inserted.append(group_inserted)
        valid.append(ok)
    return Swaps(torch.stack(keeps, 1), torch.stack(removed, 1), torch.stack(inserted, 1),
                 torch.stack(valid, 1), list(types))


class Rewards(NamedTuple):
    """Rewards of sets [B, S] as the reward function gives them: ``reward``, and ``cider`` /
    ``fidelity`` where computed (:class:`avex.training.steps.SetRewards` has these fields)."""
    reward: torch.Tensor
    cider: torch.Tensor | None
    fidelity: torch.Tensor | None


def _cat(a, b):
    return None if a is None or b is None else torch.cat([a, b], dim=1)


def _take(r, cols) -> Rewards:
    pick = (lambda t: None if t is None else t[:, cols])
    return Rewards(pick(r.reward), pick(r.cider), pick(r.fidelity))


def comparable(reward: str, current: Rewards, candidates: Rewards) -> torch.Tensor:
    """[B, 1 + C]: the current set's reward then its candidates', on one scale. For
    ``cider+fidelity`` the tie-break is recomputed over exactly these sets
    (:func:`avex.fidelity.break_ties`): each reward call breaks ties among its own sets only,
    so values from two calls are not comparable."""
    if reward == "cider+fidelity":
        return break_ties(_cat(current.cider, candidates.cider).double(),
                          _cat(current.fidelity, candidates.fidelity)).float()
    return torch.cat([current.reward, candidates.reward], dim=1)


def primary(reward: str, r: Rewards) -> torch.Tensor:
    """The reward in its own points, without a tie-break: CIDEr for ``cider+fidelity``."""
    return r.cider if reward == "cider+fidelity" else r.reward


class SearchResult(NamedTuple):
    """One micro-batch's search. ``start`` / ``final`` bool [B, M]: the Top-K set and the set
    the search ended on; ``start_reward`` / ``final_reward`` [B] in the reward's own points
    (:func:`primary`); ``accepted`` int64 [B]: swaps accepted; ``removed`` / ``inserted``
    [B, C, g], ``delta_reward`` [B, C] (R(current) - R(candidate), comparable within its
    round) and ``valid`` [B, C]: every evaluated swap; ``types``: their C types; ``passes``:
    keep-sets rewarded per clip (1 + C); ``calls``: reward calls; ``first``: the first call's
    rewards, comparable [B, 1 + C1] (the Top-K set, then its candidates), and as returned."""
    start: torch.Tensor
    final: torch.Tensor
    start_reward: torch.Tensor
    final_reward: torch.Tensor
    accepted: torch.Tensor
    removed: torch.Tensor
    inserted: torch.Tensor
    delta_reward: torch.Tensor
    valid: torch.Tensor
    types: list
    passes: int
    calls: int
    first: torch.Tensor
    first_rewards: Rewards


@torch.no_grad()
def run_search(scores: torch.Tensor, start: torch.Tensor, modality: torch.Tensor,
               evaluate: Callable[[torch.Tensor], Rewards], *, reward: str, types, g: int,
               candidates: int, rounds: int, deep: float, seed: int) -> SearchResult:
    """Local search from ``start`` bool [B, M] (the policy's Top-K set). ``evaluate(sets)``
    rewards keep-sets [B, S, M] (one reward call; returns :class:`Rewards`-like fields);
    ``reward``: the run's reward name (how calls compare, :func:`comparable`). Round r builds
    ``round_sizes(candidates, rounds)[r]`` candidates (:func:`propose`) around the current
    set; the best one replaces it where its reward is strictly higher. The draws are a
    function of ``seed``."""
    generator = torch.Generator().manual_seed(search_seed(seed))
    rows = torch.arange(start.shape[0], device=start.device)
    current, protected = start.clone(), torch.zeros_like(start)
    accepted = torch.zeros(start.shape[0], dtype=torch.long, device=start.device)
    held = None            # the current set's rewards [B, 1], as the reward returned them
    logged = {"removed": [], "inserted": [], "delta": [], "valid": [], "types": []}
    first = first_rewards = None
    for r, names in enumerate(candidate_types(types, round_sizes(candidates, rounds))):
        swaps = propose(scores, current, modality, protected, names, g, deep, generator)
        if held is None:   # the Top-K set is scored with the first round's candidates
            got = evaluate(torch.cat([current[:, None], swaps.keep], dim=1))
            held, scored = _take(got, [0]), _take(got, list(range(1, 1 + len(names))))
            start_reward = primary(reward, held)[:, 0]
            first_rewards = got
        else:
            scored = evaluate(swaps.keep)
        values = comparable(reward, held, scored)                          # [B, 1 + C]
        if first is None:
            first = values
        delta = values[:, :1] - values[:, 1:]
        logged["removed"].append(swaps.removed)
        logged["inserted"].append(swaps.inserted)
        logged["delta"].append(torch.where(swaps.valid, delta, torch.zeros_like(delta)))
        logged["valid"].append(swaps.valid)
        logged["types"] += names
        gains = torch.where(swaps.valid, -delta, torch.full_like(delta, float("-inf")))
        best_gain, best = gains.max(dim=1)
        take = best_gain > 0                                      # strictly better only
        chosen = swaps.keep[rows, best]
        current = torch.where(take[:, None], chosen, current)
        put = torch.zeros_like(protected)
        put[rows[:, None], swaps.inserted[rows, best]] = True
        protected = protected | (put & take[:, None])
        held = _merge(held, _column(scored, best), take)
        accepted += take.long()
    return SearchResult(start, current, start_reward, primary(reward, held)[:, 0], accepted,
                        torch.cat(logged["removed"], 1), torch.cat(logged["inserted"], 1),
                        torch.cat(logged["delta"], 1), torch.cat(logged["valid"], 1),
                        logged["types"], 1 + candidates, rounds, first, first_rewards)


def _column(r, best: torch.Tensor) -> Rewards:
    """Each row's column ``best[b]`` of every field of ``r``, [B, 1]."""
    pick = (lambda t: None if t is None else t.gather(1, best[:, None].to(t.device)))
    return Rewards(pick(r.reward), pick(r.cider), pick(r.fidelity))


def _merge(held: Rewards, chosen: Rewards, take: torch.Tensor) -> Rewards:
    """Per row, ``chosen`` [B, 1] where ``take`` else ``held``."""
    def pick(a, b):
        return None if a is None or b is None else torch.where(take[:, None], b, a)
    return Rewards(*(pick(a, b) for a, b in zip(held, chosen)))


def swap_delta_f(scores: torch.Tensor, removed: torch.Tensor, inserted: torch.Tensor,
                 valid: torch.Tensor) -> torch.Tensor:
    """dF = sum s_G - sum s_G' [B, C] of every swap, differentiable in ``scores`` [B, M];
    0 where not ``valid``."""
    finite = scores.masked_fill(~torch.isfinite(scores), 0.0)

    def group_sum(index):
        return finite.gather(1, index.flatten(1)).view(index.shape).sum(-1)
    delta = group_sum(removed) - group_sum(inserted)
    return torch.where(valid, delta, torch.zeros_like(delta))


def distill_loss(scores: torch.Tensor, final: torch.Tensor, *, tau: float,
                 form: str = "pl") -> torch.Tensor:
    """The loss [B] pulling the scores [B, M] (-inf past a row) toward the sets ``final`` bool
    [B, M] (a row with no token in its set gives 0).

    ``"pl"``: -(1/K) sum over i in the set of log P(i's Gumbel key beats every key outside the
    set) = log(e^{x_i} / (e^{x_i} + sum_{j outside} e^{x_j})), x = s / tau. Gumbel-Top-K draws
    the set exactly when all K events hold. Unlike the ordered Plackett-Luce log-probability
    of one order of the set (whose gradient can push a late-ranked member down), every member's
    score gets a gradient up and every outsider's down. ``"bce"``: binary cross-entropy of the
    scores against the set, over the row's tokens."""
    _checks.choice("form", form, ("pl", "bce"))
    present = torch.isfinite(scores.detach())
    final = final & present
    size = final.sum(1)
    if form == "bce":
        logits = scores.masked_fill(~present, 0.0)
        each = F.binary_cross_entropy_with_logits(logits, final.to(logits.dtype),
                                                  reduction="none")
        each = torch.where(present, each, torch.zeros_like(each))
        loss = each.sum(1) / present.sum(1).clamp_min(1)
        return torch.where(size > 0, loss, torch.zeros_like(loss))
    x = scores.masked_fill(~present, 0.0) / tau
    outside = torch.where(present & ~final, x, torch.full_like(x, float("-inf")))
    rest = torch.logsumexp(outside, dim=1, keepdim=True)              # -inf: nothing outside
    each = x - torch.logaddexp(x, rest)                               # log P(i beats outside)
    each = torch.where(final, each, torch.zeros_like(each))
    return -each.sum(1) / size.clamp_min(1).to(each.dtype)
