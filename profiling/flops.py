"""FLOP counting with fvcore, plus the analytic cross-check (the hand count), which stands in
where fvcore is not installed (:func:`fvcore_missing`; the GPU image lacks it).

Convention: fvcore's, **one multiply-add = one flop** (so 2 * params * tokens "FLOPs" in the
other convention is params * tokens here). Every number this module returns is in that unit
(MACs); multiply by 2 for the multiply-and-add convention.

What fvcore does not count by itself gets a handle here:

* ``aten::scaled_dot_product_attention``: Q K^T plus A V over the key positions each query may
  see. With ``is_causal`` that is the causal triangle (query i of Lq sees Lk - Lq + i + 1 keys);
  with an explicit mask or none it is the dense Lq x Lk product (what the kernel computes).
* ``avex::topk_select`` and ``avex::compact``: the project's selection and compaction kernels
  (:func:`avex.kernels.gumbel_topk`, :func:`avex.kernels.compact`) registered as
  ``torch.library`` custom ops, so a traced pipeline shows them as single nodes. Their formulas:
  selection counts one comparison per element per sort stage, B * M * ceil(log2 M); compaction
  is a gather with no arithmetic, 0 flops.
* ``aten::sort`` and ``aten::topk`` (the baselines' rankings): the same formula as
  ``avex::topk_select``.

The baselines of :mod:`avex.methods` are counted by tracing their selectors as they are
(:func:`fastv_flops`, :func:`tome_flops`, :func:`fastav_flops`, :func:`attention_flops`), each
next to a hand count.

Real sizes cost no full model: :func:`backbone_flops` traces the model built with 1 and with 2
decoder layers (random weights, real width and vocabulary), and extrapolates exactly: every
decoder layer has the same shapes, so F(n layers) = F(1) + (n - 1) * (F(2) - F(1)). Decode
steps are traced at two KV-cache lengths; their cost is affine in the cache length (only the
attention term grows), so the sum over the forced decode length is exact too.
"""
from __future__ import annotations

import copy
import functools
import math
import warnings
from collections import Counter
from dataclasses import dataclass

import torch
from torch import nn

from avex.captioner.frozen import text_to_av_attention
from avex.kernels import compact as _compact
from avex.kernels import gumbel_topk as _gumbel_topk
from avex.methods import make_selector
from avex.methods.fastav import DEFAULT_STAGE1_DROP, attention_rollout
from avex.modality import AUDIO, VISUAL
from avex.policy import POSITION_FEATURES
from avex.pruning import cache_keyword
from avex.selection import AVLayout, num_kept, split_budget

from .methods import av_batch

UNIT = "fvcore flops (1 multiply-add = 1 flop, i.e. MACs)"


def fvcore_missing() -> str | None:
    """Why fvcore can't count here (None where it can); the hand counts then stand in."""
    try:
        import fvcore.nn  # noqa: F401
    except ImportError as e:
        return (f"fvcore is not installed ({e}): pip install fvcore, or on the GPU image "
                "carry the wheels that bench/fetch_gpu_wheels.sh puts in .whl/")
    return None

# ----------------------------------------------------------------------------------------------
# The project's kernels as custom ops
# ----------------------------------------------------------------------------------------------


@torch.library.custom_op("avex::topk_select", mutates_args=())
def topk_select(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Deterministic Top-K indices [B, k] of ``scores`` [B, M] (``gumbel_topk(sample=False)``)."""
    return _gumbel_topk(scores, k, sample=False)[0].clone()


@topk_select.register_fake
def _(scores, k):
    return scores.new_empty((scores.shape[0], k), dtype=torch.long)


@torch.library.custom_op("avex::compact", mutates_args=())
def compact_op(hidden: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The kept tokens of ``hidden`` [B, L, D] under ``keep`` [B, L], left-padded [B, L', D]."""
    return _compact(hidden, keep, layout="padded", positions="contiguous",
                    padding_side="left").hidden.clone()


def _shape(value) -> list[int]:
    return list(value.type().sizes())


_CAUSAL_MASKS = [False]


def _sdpa_flops(inputs, outputs) -> Counter:
    q, k, v = (_shape(x) for x in inputs[:3])
    *batch, lq, dqk = q
    lk, dv = k[-2], v[-1]
    is_causal = bool(inputs[5].toIValue()) if len(inputs) > 5 else False
    has_mask = inputs[3].type().kind() == "TensorType"
    group = 1
    if has_mask:
        # transformers folds grouped query heads into the query length for single-token
        # decoding ([B, kv_heads, n_rep * Lq, D]); the mask keeps the real Lq
        mq = _shape(inputs[3])[-2]
        if mq != lq and lq % mq == 0:
            group, lq = lq // mq, mq
    # Under tracing, transformers passes the causal mask as an explicit tensor; inside
    # :func:`llm_flops` (batch 1, no padding) a masked multi-query attention is that causal mask.
    if is_causal or (has_mask and lq > 1 and _CAUSAL_MASKS[0]):
        # query i (0-based) sees keys 0 .. lk - lq + i
        pairs = lq * (lk - lq) + lq * (lq + 1) // 2
    else:
        pairs = lq * lk
    pairs *= group
    return Counter({"scaled_dot_product_attention": math.prod(batch) * pairs * (dqk + dv)})


def _topk_select_flops(inputs, outputs) -> Counter:
    b, m = _shape(inputs[0])
    return Counter({"topk_select": b * m * max(1, math.ceil(math.log2(max(m, 2))))})


def _sort_flops(inputs, outputs) -> Counter:
    # like avex::topk_select: one comparison per element per sort stage, along the sorted dim
    shape = _shape(inputs[0])
    # sort(self, dim, descending) or sort(self, stable, dim, descending): the first int is dim
    dims = [v for v in (i.toIValue() for i in inputs[1:]) if type(v) is int]
    m = shape[dims[0] if dims else -1] if shape else 1
    return Counter({"sort": math.prod(shape) * max(1, math.ceil(math.log2(max(m, 2))))})


def _topk_flops(inputs, outputs) -> Counter:
    # topk(self, k, dim, largest, sorted) ranks like a sort along dim (Attention-AV's per-modality
    # ranking); dim is its second int
    shape = _shape(inputs[0])
    dim = inputs[2].toIValue() if len(inputs) > 2 else -1
    m = shape[dim if type(dim) is int else -1] if shape else 1
    return Counter({"sort": math.prod(shape) * max(1, math.ceil(math.log2(max(m, 2))))})


def _zero(name):
    return lambda inputs, outputs: Counter({name: 0})


def _mha_flops(inputs, outputs) -> Counter:
    # aten::_native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, ...)
    q, k = _shape(inputs[0]), _shape(inputs[1])
    b, lq, e = q
    lk = k[1]
    proj = b * (2 * lq + 2 * lk) * e * e   # q, out projections on lq; k, v on lk
    attn = b * lq * lk * 2 * e
    return Counter({"native_multi_head_attention": proj + attn})


HANDLES = {
    "aten::scaled_dot_product_attention": _sdpa_flops,
    "aten::_native_multi_head_attention": _mha_flops,
    "avex::topk_select": _topk_select_flops,
    "avex::compact": _zero("compact"),
    "aten::sort": _sort_flops,
    "aten::topk": _topk_flops,
}

# Elementwise ops fvcore leaves out on purpose (norms, activations, rotary, masks): O(L * D)
# next to the O(L * D^2) matmuls. They are listed, not counted, by :func:`count`.


@dataclass
class Count:
    total: int
    by_operator: dict
    unsupported: dict


def count(module: nn.Module, inputs: tuple) -> Count:
    """fvcore count of ``module(*inputs)`` with this module's handles (unit: :data:`UNIT`)."""
    missing = fvcore_missing()
    if missing:
        raise ModuleNotFoundError(f"{missing}; analytic_llm_flops and the other analytic_* "
                                  "counts need no fvcore")
    from fvcore.nn import FlopCountAnalysis

    analysis = FlopCountAnalysis(module, inputs).set_op_handle(**HANDLES)
    analysis.unsupported_ops_warnings(False)
    analysis.uncalled_modules_warnings(False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        total = analysis.total()
        return Count(int(total), dict(analysis.by_operator()), dict(analysis.unsupported_ops()))


# ----------------------------------------------------------------------------------------------
# LLM prefill and decode
# ----------------------------------------------------------------------------------------------

class _Prefill(nn.Module):
    """Prefill as ``generate`` runs it: all tokens through the decoder, logits at the last one."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, inputs_embeds):
        return self.model(inputs_embeds=inputs_embeds, use_cache=False, logits_to_keep=1).logits


class _DecodeStep(nn.Module):
    """One cached decode step: one new token against a KV cache of the given length."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, inputs_embeds, keys, values):
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        for i, (k, v) in enumerate(zip(keys, values)):
            cache.update(k, v, i)
        past = keys[0].shape[2]
        position_ids = torch.full((1, 1), past, dtype=torch.long)
        return self.model(inputs_embeds=inputs_embeds, **{cache_keyword(self.model): cache},
                          use_cache=True, position_ids=position_ids, logits_to_keep=1).logits


def _layers(config) -> int:
    return int(config.num_hidden_layers)


def build_model(config, num_layers: int | None = None, *, dtype=torch.float32,
                device="cpu", random_weights: bool = True):
    """A causal LM from ``config`` (``num_layers`` overrides the depth).

    ``random_weights=False`` skips the (slow, at real size) random initialisation and zeroes the
    weights instead: enough for counting FLOPs, which do not depend on the values.
    """
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(config)
    if num_layers is not None:
        config.num_hidden_layers = num_layers
        if getattr(config, "layer_types", None) is not None:
            config.layer_types = list(config.layer_types)[:num_layers]
    config._attn_implementation = "sdpa"
    with torch.device(device), _skip_init(random_weights):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if not random_weights:   # values are irrelevant to a count; uninitialised memory may be NaN
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
    return model.eval()


def _skip_init(random_weights: bool):
    import contextlib

    if random_weights:
        return contextlib.nullcontext()
    from transformers.initialization import no_init_weights

    return no_init_weights()


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _prefill_count(model, tokens: int) -> Count:
    embeds = torch.zeros(1, tokens, model.config.hidden_size,
                         dtype=next(model.parameters()).dtype)
    with torch.no_grad():
        return count(_Prefill(model), (embeds,))


def _decode_count(model, cache_len: int) -> Count:
    c = model.config
    dtype = next(model.parameters()).dtype
    kv = (1, c.num_key_value_heads, cache_len, _head_dim(c))
    n = _layers(c)
    keys = tuple(torch.zeros(kv, dtype=dtype) for _ in range(n))
    embeds = torch.zeros(1, 1, c.hidden_size, dtype=dtype)
    with torch.no_grad():
        return count(_DecodeStep(model), (embeds, keys, keys))


@dataclass
class LLMFlops:
    prefill: int
    decode: int
    prefill_tokens: int
    decode_tokens: int


def llm_flops(models: tuple, config, prefill_tokens: int, decode_tokens: int) -> LLMFlops:
    """Prefill of ``prefill_tokens`` plus ``decode_tokens`` cached decode steps, for the full
    depth of ``config``, from the 1- and 2-layer ``models`` (see the module docstring).

    The first decoded token comes from the prefill's logits, so the decode steps feed tokens
    1 .. decode_tokens - 1 (``generate``'s count of forward passes).
    """
    one, two = models
    n = _layers(config)
    _CAUSAL_MASKS[0] = True
    try:
        return _llm_flops(one, two, n, prefill_tokens, decode_tokens)
    finally:
        _CAUSAL_MASKS[0] = False


def _llm_flops(one, two, n, prefill_tokens, decode_tokens):

    def extrapolate(f1: int, f2: int) -> int:
        return f1 + (n - 1) * (f2 - f1)

    prefill = extrapolate(_prefill_count(one, prefill_tokens).total,
                          _prefill_count(two, prefill_tokens).total)
    steps = max(decode_tokens - 1, 0)
    decode = 0
    if steps:
        a, b = prefill_tokens, prefill_tokens + 1
        fa = extrapolate(_decode_count(one, a).total, _decode_count(two, a).total)
        fb = extrapolate(_decode_count(one, b).total, _decode_count(two, b).total)
        slope = fb - fa   # per extra cached token
        # step t (1-based) sees a cache of prefill_tokens + t - 1 tokens
        decode = steps * fa + slope * (steps * (steps - 1) // 2)
    return LLMFlops(prefill, decode, prefill_tokens, decode_tokens)


def _per_token(config) -> int:
    """One decoder layer's matmul weights: q, k, v, o projections and 3 MLP matrices."""
    c = config
    d, h, kvh, hd = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, _head_dim(c)
    return d * h * hd * 2 + d * kvh * hd * 2 + 3 * d * c.intermediate_size


def _attention_pair(config) -> int:
    """QK^T + AV per (query, key) pair, over all heads."""
    return 2 * config.num_attention_heads * _head_dim(config)


def analytic_layer_flops(config, tokens: int, *, causal: bool = True) -> int:
    """One decoder layer over ``tokens`` tokens: weights x tokens + attention over the causal
    triangle, or over the dense ``tokens`` x ``tokens`` square (eager attention computes every
    pair before masking)."""
    pairs = tokens * (tokens + 1) // 2 if causal else tokens * tokens
    return _per_token(config) * tokens + _attention_pair(config) * pairs


def analytic_llm_flops(config, prefill_tokens: int, decode_tokens: int) -> LLMFlops:
    """The hand count, in the same unit: matmul weights x tokens + causal attention.

    Per layer and token: (q + k + v + o projections) + 3 MLP matrices; the LM head on the last
    prefill position and on every decode step; attention 2 * head_dim * heads per visible
    (query, key) pair. Embedding lookups are free.
    """
    c = config
    n = _layers(c)
    head = c.hidden_size * c.vocab_size
    p = prefill_tokens
    prefill = n * analytic_layer_flops(c, p) + head
    steps = max(decode_tokens - 1, 0)
    visible = sum(p + t for t in range(1, steps + 1))   # step t sees p + t - 1 cached + itself
    decode = steps * (n * _per_token(c) + head) + n * _attention_pair(c) * visible
    return LLMFlops(prefill, decode, prefill_tokens, decode_tokens)


def analytic_policy_flops(config, tokens: int) -> int:
    """The hand count of one :class:`avex.policy.AVEXPolicy` pass (``config``: its
    ``PolicyConfig``) over ``tokens`` positions, batch 1, in fvcore's convention.

    The policy runs over every position (text too). Per token: the input projections (none when
    it is as wide as the LLM), the position projection, each encoder block's q, k, v, o and
    SwiGLU matrices, the cross-attention's four projections, the token MLP and the head's two
    matrices. Attention is dense, 2 * width per (query, key) pair: each encoder block attends
    under a key mask, the cross-attention over every position. fvcore also counts LayerNorm (5
    per element: the cross-attention's and the head's); RMSNorm, activations and the position
    features are elementwise and not counted.
    """
    c = config
    w, i = c.hidden_size, c.intermediate_size
    kv = c.num_kv_heads * (w // c.num_heads)
    per_token = (0 if c.input_size == w else 2 * c.input_size * w)   # av_in, text_in
    per_token += 2 * POSITION_FEATURES * w if c.positional else 0
    per_token += c.num_layers * (2 * w * w + 2 * w * kv + 3 * w * i)   # encoder blocks
    per_token += 4 * w * w + 2 * w * i + w * w + w   # cross-attention, token MLP, head
    attention = (c.num_layers + 1) * tokens * tokens * 2 * w
    layer_norms = 2 * 5 * w * tokens
    return per_token * tokens + attention + layer_norms


def policy_flops(policy, hidden_size: int, modality: torch.Tensor, retention: float, *,
                 traced: bool = True) -> dict:
    """The policy pass, the Top-K selection and the compaction (custom ops): fvcore's count of
    the traced code ("policy", "selection"; ``traced=False``: the hand counts) and the hand
    counts ("policy_analytic", "selection_analytic")."""
    is_av = (modality == VISUAL) | (modality == AUDIO)
    n_av, k = int(is_av.sum()), int(num_kept(retention, is_av.sum(1))[0])
    # a set-aware policy's picks, by hand on either path: the unit hidden states and a cosine
    # row per pick but the last (argmax scans left out, as Top-K's comparisons are)
    width = policy.config.hidden_size
    aware = ({"tokens": n_av, "width": width, "k": k, "flops": n_av * width * max(k, 1)}
             if getattr(policy, "set_aware", False) else None)
    hand = dict(policy_analytic=analytic_policy_flops(policy.config, modality.shape[1]),
                selection_analytic=selection_flops(n_av) if aware is None else aware["flops"],
                **({} if aware is None else {"set_aware": aware}))   # compaction: 0
    if not traced:
        return dict(policy=hand["policy_analytic"], selection=hand["selection_analytic"],
                    policy_unsupported={}, selection_by_operator={}, **hand)
    dtype = next(policy.parameters()).dtype
    embeds = torch.randn(1, modality.shape[1], hidden_size, dtype=dtype)
    with torch.no_grad():
        scores_count = count(policy, (embeds, modality))

    class Select(nn.Module):
        def forward(self, s, hidden, keep):
            return torch.ops.avex.topk_select(s, k), torch.ops.avex.compact(hidden, keep)

    select_count = count(Select(), (torch.randn(1, n_av), embeds.float(),
                                    torch.ones(modality.shape, dtype=torch.bool)))
    by_op = select_count.by_operator   # set-aware: the compaction traced, the picks by hand
    selection = select_count.total + (0 if aware is None
                                      else aware["flops"] - by_op.get("topk_select", 0))
    return {"policy": scores_count.total, "selection": selection,
            "policy_unsupported": scores_count.unsupported, "selection_by_operator": by_op,
            **hand}


def selection_flops(num_av: int) -> int:
    """The Top-K selection over ``num_av`` scores (batch 1), by the ``avex::topk_select``
    formula."""
    return num_av * max(1, math.ceil(math.log2(max(num_av, 2))))


# ----------------------------------------------------------------------------------------------
# The baselines' selection work (the selectors of avex.methods, traced)
# ----------------------------------------------------------------------------------------------

class _Selector(nn.Module):
    """A selector of :mod:`avex.methods` on one batch-1 sequence, for fvcore.

    It returns the keep-set, ToMe-AV's merged embeddings, the last hidden state of every
    decoder pass the selector runs and the logits of every whole-model pass (Attention-AV's
    prefill computes them): a trace drops work whose result is unused, and the selectors run
    whole passes but read only their attention maps.
    """

    def __init__(self, selector, modality, retention, model=None):

        super().__init__()
        self.selector, self.modality, self.retention = selector, modality, retention
        self.model = model   # a submodule, so the trace takes its weights as parameters
        self.layout = AVLayout.of(modality)   # bookkeeping, built once outside the count

    def forward(self, inputs_embeds):
        passes = []
        hooks = []
        if self.model is not None:
            hooks = [self.model.get_decoder().register_forward_hook(
                         lambda module, args, out: passes.append(out.last_hidden_state)),
                     self.model.register_forward_hook(
                         lambda module, args, out: passes.append(out.logits))]
        try:
            out = self.selector(av_batch(inputs_embeds, self.modality), self.layout,
                                self.retention)
        finally:
            for hook in hooks:
                hook.remove()
        if isinstance(out, tuple):   # ToMe-AV: Selection(keep, merged inputs_embeds)
            return (out.keep, out.inputs_embeds, *passes)
        return (out, *passes)


def selector_count(selector, modality, retention: float, hidden_size: int, model=None) -> Count:
    """fvcore count of one call of ``selector`` on random embeddings [1, L, hidden_size]."""
    dtype = next(model.parameters()).dtype if model is not None else torch.float32
    embeds = torch.randn(1, modality.shape[1], hidden_size, dtype=dtype)
    with torch.no_grad():
        return count(_Selector(selector, modality, retention, model), (embeds,))


class _Rollout(nn.Module):
    def forward(self, *maps):

        return attention_rollout(list(maps))


@dataclass
class SelectionFlops:
    fvcore: int | None   # None: not traced (``traced=False``, where fvcore is missing)
    analytic: int
    detail: dict


def _av_counts(modality) -> tuple[int, int, int]:

    nv, na = int((modality == VISUAL).sum()), int((modality == AUDIO).sum())
    return nv, na, modality.shape[1] - nv - na


def fastv_flops(models: tuple | None, config, modality, retention: float,
                layer: int = 2, *, traced: bool = True) -> SelectionFlops:
    """FastV-AV's selection (``avex.methods.fastv`` on the first K = ``layer`` layers): K
    layers over every token with eager attention (the dense Q K^T and A V), then a sort of the
    AV scores. Traced on the 1- and 2-layer ``models`` and extrapolated to K layers."""

    k = min(layer, _layers(config))
    fv = None
    if traced:
        counts = [selector_count(make_selector("fastv", llm=m, layer=n),
                                 modality, retention, config.hidden_size, m).total
                  for n, m in enumerate(models, 1)]
        fv = counts[0] + (k - 1) * (counts[1] - counts[0])
    nv, na, _ = _av_counts(modality)
    length = modality.shape[1]
    analytic = k * analytic_layer_flops(config, length, causal=False) + selection_flops(nv + na)
    return SelectionFlops(fv, analytic, dict(layers=k))


def fastav_flops(models: tuple | None, config, modality, retention: float, *,
                 traced: bool = True) -> SelectionFlops:
    """FastAV's selection as ``avex.methods.fastav`` runs it (rollout over E = depth // 2
    layers, the fine prune at the last layer): stage 1, the whole decoder over every token
    (eager); the rollout products of E attention maps; stage 2, the whole decoder over the text
    and the K1 stage-1 survivors; a sort of the AV scores in each stage. The decoder passes are
    traced on the 1- and 2-layer ``models`` and extrapolated; the rollout is traced at E."""

    n = _layers(config)
    rollout_layers = max(1, n // 2)
    length = modality.shape[1]
    fv = None
    if traced:
        counts = [selector_count(
            make_selector("fastav", llm=m, rollout_layers=1, late_layer=depth),
            modality, retention, config.hidden_size, m).total
            for depth, m in enumerate(models, 1)]
        maps = tuple(torch.rand(1, length, length) for _ in range(rollout_layers))
        with torch.no_grad():
            rollout = count(_Rollout(), maps).total
        fv = counts[0] + (n - 1) * (counts[1] - counts[0]) + rollout

    nv, na, text = _av_counts(modality)
    k = int(num_kept(retention, torch.tensor([nv + na]))[0])
    k1 = nv + na - math.ceil(DEFAULT_STAGE1_DROP * (nv + na - k))
    stage1 = n * analytic_layer_flops(config, length, causal=False)
    stage2 = n * analytic_layer_flops(config, text + k1, causal=False)
    analytic = stage1 + (rollout_layers - 1) * length ** 3 + stage2 \
        + 2 * selection_flops(nv + na)
    # stage 1 reads only layers 0..E-1; the rest of its pass is the implementation's
    unread = (n - rollout_layers) * analytic_layer_flops(config, length, causal=False)
    return SelectionFlops(fv, analytic, dict(rollout_layers=rollout_layers, late_layer=n,
                                             stage2_tokens=text + k1,
                                             stage1_unread_layers=unread))


def tome_flops(config, modality, retention: float, *, traced: bool = True) -> SelectionFlops:
    """ToMe-AV's matching (``avex.methods.tome`` on the input embeddings): per merge round
    the cosine similarities of the source and destination halves, |A| x |B| x D, and a sort of
    the |A| best matches. The size-weighted averages of the merges are elementwise (not
    counted, fvcore's convention)."""

    fv = (selector_count(make_selector("tome"), modality, retention, config.hidden_size).total
          if traced else None)
    nv, na, _ = _av_counts(modality)
    k = int(num_kept(retention, torch.tensor([nv + na]))[0])
    analytic, rounds = 0, 0
    for n, target in zip((nv, na), split_budget(k, nv, na)):
        while target and n > target and n >= 2:   # merge_modality's loop
            src, dst = (n + 1) // 2, n // 2
            analytic += src * dst * config.hidden_size + selection_flops(src)
            n -= min(n - target, src)
            rounds += 1
    return SelectionFlops(fv, analytic, dict(rounds=rounds))


def attention_flops(models: tuple | None, config, modality, retention: float, *,
                    traced: bool = True) -> SelectionFlops:
    """Attention-AV's selection (``avex.methods.attention``): a full-token prefill of the whole
    model with eager attention (dense Q K^T and A V in every layer; the LM head at the last
    position only, as the captioner's ``text_to_av_attention`` asks), then a sort within each
    modality. Traced on the 1- and 2-layer ``models`` and extrapolated."""

    n = _layers(config)
    fv = None
    if traced:
        selectors = [make_selector("attention",
                                   attention=functools.partial(text_to_av_attention, m))
                     for m in models]
        counts = [selector_count(selector, modality, retention, config.hidden_size, m).total
                  for selector, m in zip(selectors, models)]
        fv = counts[0] + (n - 1) * (counts[1] - counts[0])
    nv, na, _ = _av_counts(modality)
    length = modality.shape[1]
    analytic = n * analytic_layer_flops(config, length, causal=False) \
        + config.hidden_size * config.vocab_size \
        + selection_flops(nv) + selection_flops(na)
    return SelectionFlops(fv, analytic, dict(layers=n, prefill_tokens=length))
