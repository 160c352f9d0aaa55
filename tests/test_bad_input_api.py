"""Bad input to the kernels, the keep-set helpers, prune_inputs / generate, the scoring loop and
the profiling timer: one case a line (tests/badinput.py). Each error names the argument (or the
file) and the value it got."""
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from avex.captioner import FrozenCaptioner
from avex.captioner.frozen import CAPTIONER_FILE
from avex.evaluate.ablation import AblationSettings, run_ablation
from avex.evaluate.motivation import MotivationSettings, run_motivation
from avex.evaluate.sweep import SweepSettings, run_sweep
from avex.kernels import build_exchanges, compact, gumbel_topk, plackett_luce_log_prob
from avex.methods import load_policy
from avex.modality import AUDIO, TEXT, VISUAL
from avex.policy import AVEXPolicy, PolicyConfig
from avex.profiling import ProfileSettings
from avex.profiling.latency import Clock, alternate, timed
from avex.pruning import expand_av_keep, generate, prune_inputs
from avex.scoring import caption_split, keep_all
from avex.selection import (AVLayout, balanced_attention_keep, num_kept, random_keep, split_budget,
                            topk_keep)
from avex.train import train
from avex.training.config import TrainConfig
from badinput import INF, NAN, case, exact, raises

HIDDEN = 16


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=23, hidden_size=HIDDEN, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=64, pad_token_id=0, eos_token_id=None)
    return Qwen2ForCausalLM(config).eval()


# Two samples: sample 0 has no AV tokens, sample 1 has three.
MODALITY = torch.tensor([[TEXT, TEXT, TEXT, TEXT, TEXT],
                         [TEXT, VISUAL, VISUAL, AUDIO, TEXT]])
EMBEDS = torch.randn(2, 5, HIDDEN)
SCORES = torch.randn(2, 5)


def pruned(embeds=EMBEDS, **kw):
    return prune_inputs(embeds, MODALITY, keep=MODALITY >= 0, **kw)


def scores_with(*where_value):
    s = SCORES.clone()
    for (b, pos), value in where_value:
        s[b, pos] = value
    return s


KERNEL_CASES = [
    case("gumbel_topk k=-5", lambda: gumbel_topk(torch.randn(2, 5), -5), ValueError, "k must be >= 1 for every row, got -5"),
    case("gumbel_topk k=-5 on an empty batch", lambda: gumbel_topk(torch.empty(0, 5), -5), ValueError, "k must be >= 1 for every row, got -5"),
    case("gumbel_topk k=0 on an empty batch", lambda: gumbel_topk(torch.empty(0, 5), 0), ValueError, "k must be >= 1 for every row, got 0"),
    case("gumbel_topk sample='no'", lambda: gumbel_topk(torch.randn(2, 5), 2, sample="no"), TypeError, "sample must be True or False, got str: 'no'"),
    case("gumbel_topk sample=0", lambda: gumbel_topk(torch.randn(2, 5), 2, sample=0), TypeError, "sample must be True or False, got int: 0"),
    case("gumbel_topk meta scores", lambda: gumbel_topk(torch.randn(2, 5, device="meta"), 2), ValueError, r"scores is a meta tensor \(shape \[2, 5\], no data\)"),
    case("gumbel_topk tau nan", lambda: gumbel_topk(torch.randn(2, 5), 2, tau=NAN), ValueError, "tau must be a finite number > 0, got nan"),
    case("plackett_luce index -2", lambda: plackett_luce_log_prob(torch.randn(2, 5), torch.tensor([[0, -2], [1, -1]])), ValueError, "indices must hold positions >= 0 and -1 padding, got -2"),
    case("plackett_luce index -2 mid-row", lambda: plackett_luce_log_prob(torch.randn(1, 5), torch.tensor([[0, -2, 3]])), ValueError, "indices must hold positions >= 0 and -1 padding, got -2"),
    case("plackett_luce meta indices", lambda: plackett_luce_log_prob(torch.randn(1, 5), torch.zeros(1, 1, dtype=torch.long, device="meta")), ValueError, "indices is a meta tensor"),
    case("build_exchanges meta modality", lambda: build_exchanges(torch.randn(1, 4), torch.tensor([[0]]), torch.zeros(1, 4, dtype=torch.long, device="meta"), g=1), ValueError, "modality is a meta tensor"),
    case("compact meta hidden", lambda: compact(torch.randn(1, 3, 2, device="meta"), torch.ones(1, 3, dtype=torch.bool)), ValueError, "hidden is a meta tensor"),
]

SCORES_NEG_INF = torch.tensor([[0.5, 0.1, 0.3, 0.2, 0.9], [0.2, 0.4, 0.1, 0.7, -INF]])


def log_prob_of(indices, scores=SCORES_NEG_INF):
    return lambda backend: plackett_luce_log_prob(scores, torch.tensor(indices), backend=backend)


def exchanges_of(indices, modality):
    return lambda backend: build_exchanges(torch.randn(1, 4), torch.tensor(indices), torch.tensor(modality), g=1, backend=backend)


# Every check runs before the backend is picked: the Triton kernels (under the interpreter) and
# the PyTorch reference refuse the same input with the same message.
BACKEND_CASES = [
    case("gumbel_topk k=100 on an empty batch of width 10", lambda backend: gumbel_topk(torch.randn(0, 10), 100, backend=backend), ValueError, r"k = 100 exceeds the 10 tokens of a row \(the width of scores\)"),
    case("gumbel_topk k=100 on an empty batch, Top-K", lambda backend: gumbel_topk(torch.randn(0, 10), 100, sample=False, backend=backend), ValueError, r"k = 100 exceeds the 10 tokens of a row"),
    case("plackett_luce index past the row", log_prob_of([[0, 2, -1], [1, 5, 3]]), ValueError, r"indices: a chosen position lies outside its row's valid length: row 1, position 1 holds 5, but the row has 5 positions"),
    case("plackett_luce -1 before a chosen position", log_prob_of([[0, -1, 2], [1, 0, 3]]), ValueError, r"row 0 has -1 at position 1, then 2 at position 2"),
    case("plackett_luce a position chosen twice", log_prob_of([[0, 2, 2], [1, 0, 3]]), ValueError, r"indices: a row chooses the same position twice: row 0 holds 2 at positions 1 and 2"),
    case("plackett_luce a -inf position chosen", log_prob_of([[0, 2, -1], [1, 4, 3]]), ValueError, r"indices: a chosen position has score -inf \(padding cannot be chosen\): row 1, position 1 holds 4"),
    case("plackett_luce index -3", log_prob_of([[0, -3, -1], [1, 0, 3]]), ValueError, r"indices must hold positions >= 0 and -1 padding, got -3 at row 0, position 1"),
    case("build_exchanges a padding position chosen", exchanges_of([[0, 3]], [[0, 0, 1, -1]]), ValueError, r"indices: a chosen position is padding \(modality -1\): row 0, position 1 holds 3"),
    case("build_exchanges modality 5", exchanges_of([[0, 3]], [[0, 0, 5, 1]]), ValueError, r"modality must hold -1 \(padding\), 0 \(visual\) or 1 \(audio\), got 5 at row 0, position 2"),
    case("build_exchanges index -2", exchanges_of([[0, -2]], [[0, 0, 1, 1]]), ValueError, r"indices must hold positions >= 0 and -1 padding, got -2 at row 0, position 1"),
    case("build_exchanges an index past the row", exchanges_of([[0, 7]], [[0, 0, 1, 1]]), ValueError, r"row 0, position 1 holds 7, but the row has 4 positions"),
]

HELPER_CASES = [
    case("num_kept negative count", lambda: num_kept(0.5, torch.tensor([4, -2])), ValueError, "num_tokens must be token counts >= 0, got -2"),
    case("num_kept float counts", lambda: num_kept(0.5, torch.tensor([4.0, 2.5])), TypeError, "num_tokens must be an integer tensor, got dtype torch.float32"),
    case("num_kept bool counts", lambda: num_kept(0.5, torch.tensor([True, False])), TypeError, "num_tokens must be an integer tensor, got dtype torch.bool"),
    case("num_kept a list", lambda: num_kept(0.5, [4, 2]), TypeError, "num_tokens must be a torch.Tensor, got list"),
    case("num_kept a bool", lambda: num_kept(0.5, True), TypeError, "num_tokens must be a torch.Tensor, got bool"),
    case("num_kept retention nan", lambda: num_kept(NAN, torch.tensor([4])), ValueError, r"retention must be in \(0, 1\], got nan"),
    case("expand_av_keep code 5", lambda: expand_av_keep(torch.ones(1, 2, dtype=torch.bool), torch.tensor([[2, 0, 5]])), ValueError, r"modality must hold -1 \(padding\), 0 \(visual\), 1 \(audio\) or 2 \(text\), got 5 at sample 0, position 2"),
    case("expand_av_keep code -3", lambda: expand_av_keep(torch.ones(1, 2, dtype=torch.bool), torch.tensor([[-3, 0, 1]])), ValueError, "got -3 at sample 0, position 0"),
    case("expand_av_keep meta", lambda: expand_av_keep(torch.ones(1, 2, dtype=torch.bool, device="meta"), torch.tensor([[0, 1]])), ValueError, "av_keep is a meta tensor"),
]

POLICY = AVEXPolicy(PolicyConfig(input_size=HIDDEN, hidden_size=8, num_heads=2))

PROBED_CASES = [  # found by probing beyond the list
    case("policy modality code 7", lambda: POLICY(EMBEDS, torch.tensor([[2, 2, 2, 2, 2], [2, 0, 7, 1, 2]])), ValueError, "modality must hold .* got 7 at sample 1, position 2"),
    case("PolicyConfig num_kv_heads 0", lambda: PolicyConfig(input_size=8, hidden_size=8, num_kv_heads=0), ValueError, "num_kv_heads must be >= 1, got 0"),
    case("PolicyConfig num_kv_heads -2", lambda: PolicyConfig(input_size=8, hidden_size=8, num_heads=2, num_kv_heads=-2), ValueError, "num_kv_heads must be >= 1, got -2"),
    case("PolicyConfig intermediate_size -1", lambda: PolicyConfig(input_size=8, hidden_size=8, intermediate_size=-1), ValueError, "intermediate_size must be >= 1, got -1"),
    case("PolicyConfig norm_eps nan", lambda: PolicyConfig(input_size=8, hidden_size=8, norm_eps=NAN), ValueError, "norm_eps must be a finite number > 0, got nan"),
    case("random_keep clip_ids shorter", lambda: random_keep(["a"], torch.tensor([3, 4]), torch.tensor([1, 1]), 0), ValueError, "clip_ids has 1 entries but counts has 2"),
    case("random_keep budget > count", lambda: random_keep(["a"], torch.tensor([3]), torch.tensor([5]), 0), ValueError, r"budget\[0\] = 5 must lie in \[0, counts\[0\] = 3\]"),
    case("random_keep budget -1", lambda: random_keep(["a"], torch.tensor([3]), torch.tensor([-1]), 0), ValueError, r"budget\[0\] = -1 must lie in"),
    case("topk_keep budget rows", lambda: topk_keep(torch.randn(2, 4), torch.tensor([1])), ValueError, "budget has 1 rows but scores has 2"),
    case("topk_keep NaN score", lambda: topk_keep(torch.tensor([[NAN, 1.0]]), torch.tensor([1])), ValueError, r"scores must be finite or -inf \(padding\), got NaN or \+inf"),
    case("balanced_attention_keep length", lambda: balanced_attention_keep(torch.randn(3), 4, 2, 0.5), ValueError, r"attention has 3 values but the clip has n_visual \+ n_audio = 4 \+ 2 tokens"),
    case("split_budget k -2", lambda: split_budget(-2, 3, 3), ValueError, "k must be >= 0, got -2"),
    case("split_budget k > n", lambda: split_budget(10, 3, 3), ValueError, r"k = 10 exceeds the 6 tokens"),
    case("AVLayout.of float codes", lambda: AVLayout.of(torch.tensor([[0.0, 1.0]])), TypeError, "modality must be an integer tensor"),
    case("AVLayout.of 1-D", lambda: AVLayout.of(torch.tensor([0, 1])), ValueError, r"modality must be 2-D, got shape \[2\]"),
    case("AVLayout.of code 9", lambda: AVLayout.of(torch.tensor([[0, 9]])), ValueError, "got 9 at sample 0, position 1"),
]

PRUNE_CASES = [
    case("every AV score -inf", lambda: prune_inputs(EMBEDS, MODALITY, scores=scores_with(((1, 1), -INF), ((1, 2), -INF), ((1, 3), -INF)), retention=0.5), ValueError, r"scores: sample 1 has 0 audio-visual tokens with a score > -inf, but retention=0.5 keeps 2 of its 3"),
    case("too few finite AV scores", lambda: prune_inputs(EMBEDS, MODALITY, scores=scores_with(((1, 1), -INF), ((1, 3), -INF)), retention=1.0), ValueError, r"sample 1 has 1 audio-visual tokens with a score > -inf, but retention=1.0 keeps 3"),
    case("+inf AV score", lambda: prune_inputs(EMBEDS, MODALITY, scores=scores_with(((1, 2), INF)), retention=0.5), ValueError, r"scores contains \+inf at audio-visual position 2 of sample 1"),
    case("NaN AV score", lambda: prune_inputs(EMBEDS, MODALITY, scores=scores_with(((1, 3), NAN)), retention=0.5), ValueError, "scores contains NaN at audio-visual position 3 of sample 1"),
    case("retention 0", lambda: prune_inputs(EMBEDS, MODALITY, scores=SCORES, retention=0), ValueError, r"retention must be in \(0, 1\], got 0"),
    case("meta inputs_embeds", lambda: prune_inputs(EMBEDS.to("meta"), MODALITY, scores=SCORES, retention=0.5), ValueError, "inputs_embeds is a meta tensor"),
    case("meta modality", lambda: prune_inputs(EMBEDS, MODALITY.to("meta"), scores=SCORES, retention=0.5), ValueError, "modality is a meta tensor"),
    case("modality code 7", lambda: prune_inputs(EMBEDS, torch.tensor([[2, 2, 2, 2, 7], [2, 0, 0, 1, 2]]), scores=SCORES, retention=0.5), ValueError, "got 7 at sample 0, position 4"),
    case("positions 'same'", lambda: prune_inputs(EMBEDS, MODALITY, scores=SCORES, retention=0.5, positions="same"), ValueError, r"positions must be one of \['contiguous', 'original'\], got 'same'"),
]


def generate_case(model_fn, pruned_fn, **kw):
    return lambda model: generate(model_fn(model), pruned_fn(), max_new_tokens=kw.pop("max_new_tokens", 2), **kw)


GENERATE_CASES = [
    case("generate(None, ...)", generate_case(lambda m: None, pruned), TypeError, r"model must be a Hugging Face \*ForCausalLM \(with \.generate and \.config\), got NoneType"),
    case("generate(a module without generate)", generate_case(lambda m: m.model, pruned), TypeError, "model must be a Hugging Face .* got Qwen2Model"),
    case("embeddings of the wrong width", generate_case(lambda m: m, lambda: pruned(torch.randn(2, 5, HIDDEN + 3))), ValueError, r"pruned.inputs_embeds has width 19 but the model's embeddings have width 16"),
    case("float64 embeddings, float32 model", generate_case(lambda m: m, lambda: pruned(EMBEDS.double())), TypeError, "pruned.inputs_embeds has dtype torch.float64 but the model runs in torch.float32"),
    case("num_beams=0", generate_case(lambda m: m, pruned, num_beams=0), ValueError, "num_beams must be >= 1, got 0"),
    case("num_return_sequences=-1", generate_case(lambda m: m, pruned, num_return_sequences=-1), ValueError, "num_return_sequences must be >= 1, got -1"),
    case("max_new_tokens=0", generate_case(lambda m: m, pruned, max_new_tokens=0), ValueError, "max_new_tokens must be >= 1, got 0"),
    case("num_beams=1.5", generate_case(lambda m: m, pruned, num_beams=1.5), TypeError, "num_beams must be an int, got float: 1.5"),
    case("pruned a tuple", lambda m: generate(m, tuple(pruned())), TypeError, "pruned must be the PrunedInputs returned by prune_inputs, got tuple"),
    case("attention 'flash'", lambda m: generate(m, pruned(), attention="flash"), ValueError, r"attention must be one of .* got 'flash'"),
]


def caption(selector=keep_all, retention=0.5, **kw):
    return lambda: caption_split(None, [], selector, retention, **kw)


PROFILING_CASES = [
    case("alternate rounds=0", lambda: alternate({"a": dict}, rounds=0), ValueError, "rounds must be >= 1, got 0"),
    case("alternate rounds=-3", lambda: alternate({"a": dict}, rounds=-3), ValueError, "rounds must be >= 1, got -3"),
    case("alternate warmup=-1", lambda: alternate({"a": dict}, rounds=1, warmup=-1), ValueError, "warmup must be >= 0, got -1"),
    case("Clock device 'cpu' (a str)", lambda: Clock("cpu"), TypeError, "device must be a torch.device, got str: 'cpu'"),
    case("timed fn None", lambda: timed(None, torch.device("cpu")), TypeError, "fn must be callable, got NoneType"),
    case("timed repeat=-3", lambda: timed(dict, torch.device("cpu"), repeat=-3), ValueError, "repeat must be >= 1, got -3"),
    case("timed repeat=0", lambda: timed(dict, torch.device("cpu"), repeat=0), ValueError, "repeat must be >= 1, got 0"),
    case("timed repeat=2.0", lambda: timed(dict, torch.device("cpu"), repeat=2.0), TypeError, "repeat must be an int, got float: 2.0"),
    case("ProfileSettings runs=0", lambda: ProfileSettings(runs=0).validate(), ValueError, "runs must be >= 1, got 0"),
    case("ProfileSettings runs=-3", lambda: ProfileSettings(runs=-3).validate(), ValueError, "runs must be >= 1, got -3"),
    case("ProfileSettings warmup=-1", lambda: ProfileSettings(warmup=-1).validate(), ValueError, "warmup must be >= 0, got -1"),
    case("ProfileSettings decode_tokens=2.5", lambda: ProfileSettings(decode_tokens=2.5).validate(), TypeError, "decode_tokens must be an int, got float: 2.5"),
    case("ProfileSettings visual_tokens='256'", lambda: ProfileSettings(visual_tokens="256").validate(), TypeError, "visual_tokens must be an int, got str: '256'"),
    case("ProfileSettings device 'cuda:x'", lambda: ProfileSettings(device="cuda:x").validate(), ValueError, r"device must be .* got 'cuda:x'"),
    case("ProfileSettings latency 'no'", lambda: ProfileSettings(latency="no").validate(), TypeError, "latency must be True or False, got str: 'no'"),
    case("ProfileSettings name a path", lambda: ProfileSettings(name="a/b").validate(), ValueError, r"name is a file stem \(profiling-<name>\.md\), not a path; got 'a/b'"),
    case("ProfileSettings methods a str", lambda: ProfileSettings(methods="full").validate(), TypeError, "methods must be a tuple of method names, got 'full'"),
    case("caption_split batch_size 0", caption(batch_size=0), ValueError, "batch_size must be >= 1, got 0"),
    case("caption_split num_beams 0", caption(num_beams=0), ValueError, "num_beams must be >= 1, got 0"),
    case("caption_split retention 2", caption(retention=2.0), ValueError, r"retention must be in \(0, 1\], got 2.0"),
    case("caption_split selector None", caption(selector=None), TypeError, "selector must be callable"),
]


# The experiments' settings, refused by run_* before any asset is built or file written (the
# CLI builds the same settings: test_bad_input_cli.py)
EXPERIMENT_CASES = [
    case("run_sweep a dict", lambda: run_sweep({"seeds": [0]}), TypeError, "settings must be a SweepSettings, got dict"),
    case("SweepSettings seeds 1,1", lambda: run_sweep(SweepSettings(seeds=[1, 1])), ValueError, r"seeds has duplicates: \[1, 1\]"),
    case("SweepSettings seeds a str", lambda: run_sweep(SweepSettings(seeds="0")), TypeError, "seeds must be a list of ints, got str"),
    case("SweepSettings retentions [1.5]", lambda: run_sweep(SweepSettings(retentions=[1.5])), ValueError, r"retentions must be in \(0, 1\], got 1.5"),
    case("SweepSettings methods bogus", lambda: run_sweep(SweepSettings(methods=["bogus"])), ValueError, r"methods must be one of .* got 'bogus'"),
    case("SweepSettings train a dict", lambda: run_sweep(SweepSettings(train={"epochs": 1})), TypeError, "train must be a TrainConfig, got dict"),
    case("SweepSettings train epochs nan", lambda: run_sweep(SweepSettings(train=TrainConfig(epochs=NAN))), ValueError, "epochs must be a finite number >= 0, got nan"),
    case("SweepSettings batch_size 0", lambda: run_sweep(SweepSettings(batch_size=0)), ValueError, "batch_size must be >= 1, got 0"),
    case("SweepSettings data missing", lambda: run_sweep(SweepSettings(data="/no/such/cache", captioner="/no/such")), FileNotFoundError, "--data: no feature cache at '/no/such/cache'"),
    case("AblationSettings variants bogus", lambda: run_ablation(AblationSettings(variants=["bogus"])), ValueError, r"variants must be one of .* got 'bogus'"),
    case("AblationSettings runs with two seeds", lambda: run_ablation(AblationSettings(seeds=[0, 1], runs={"full": "/tmp"})), ValueError, r"--run reuses one run per variant, so it takes one seed"),
    case("MotivationSettings group 0", lambda: run_motivation(MotivationSettings(group=0)), ValueError, "group must be >= 1, got 0"),
    case("MotivationSettings progress 'no'", lambda: run_motivation(MotivationSettings(progress="no")), TypeError, "progress must be True or False, got str: 'no'"),
]


@pytest.mark.parametrize("call,error,match", KERNEL_CASES + HELPER_CASES + PROBED_CASES +
                         PRUNE_CASES + PROFILING_CASES + EXPERIMENT_CASES)
def test_bad_input_is_refused_naming_the_argument(call, error, match):
    raises(call, error, match)


EXACT_CASES = [  # were answered in float64
    exact("num_kept(1.0, 2**62 + 1)", lambda: int(num_kept(1.0, 2**62 + 1)), 2**62 + 1),
    exact("num_kept(0.5, [2**62 + 1, 5])", lambda: num_kept(0.5, torch.tensor([2**62 + 1, 5])).tolist(), [2**61 + 1, 3]),
    exact("num_kept(1.0, 2**53 + 1)", lambda: int(num_kept(1.0, torch.tensor(2**53 + 1))), 2**53 + 1),
]


@pytest.mark.parametrize("call,expected", EXACT_CASES)
def test_edge_input_is_answered_exactly(call, expected):
    assert call() == expected


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("call,error,match", BACKEND_CASES)
def test_bad_kernel_input_is_refused_alike_by_both_backends(backend, call, error, match):
    raises(lambda: call(backend), error, match)


@pytest.mark.parametrize("call,error,match", GENERATE_CASES)
def test_bad_generate_input_is_refused_before_transformers(model, call, error, match):
    raises(lambda: call(model), error, match)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("k", [3, torch.tensor(2)], ids=["int", "0-d tensor"])
def test_gumbel_topk_on_an_empty_batch_returns_k_columns(backend, k):
    indices, log_prob = gumbel_topk(torch.empty(0, 5), k, backend=backend, seed=1)
    assert indices.shape == (0, int(k)) and log_prob.shape == (0,)


def test_prune_inputs_names_the_right_row_after_a_row_without_av_tokens():
    # sample 0 has no AV token (K = 0) and is skipped by the kernel; the error still says 1
    with pytest.raises(ValueError, match="sample 1 has 0 audio-visual tokens"):
        prune_inputs(EMBEDS, MODALITY, scores=scores_with(((1, 1), -INF), ((1, 2), -INF),
                                                          ((1, 3), -INF)), retention=0.5)


def captioner_dir(root, info: str):
    root.mkdir()
    (root / "config.json").write_text("{}")
    (root / CAPTIONER_FILE).write_text(info)
    return root


CAPTIONER_FILE_CASES = [
    case("captioner.json not JSON", "{oops", ValueError, r"captioner\.json: corrupt or truncated"),
    case("captioner.json other format", '{"format": "x"}', ValueError, r"captioner\.json: 'format' must be"),
    case("captioner.json feature_dim '4'", '{"format": "avex-captioner", "feature_dim": "4"}', ValueError, r"captioner\.json: 'feature_dim' must be a positive int, got '4'"),
]


@pytest.mark.parametrize("info,error,match", CAPTIONER_FILE_CASES)
def test_corrupt_captioner_file_is_named_before_the_model_loads(tmp_path, info, error, match):
    raises(lambda: FrozenCaptioner.load(captioner_dir(tmp_path / "cap", info)), error, match)


CAPTIONER_CASES = [
    case("embed([1, 2])", lambda c: c.embed([1, 2]), TypeError, r"clips\[0\] must be a Clip \(from a FeatureCache\), got int"),
    case("embed('clip')", lambda c: c.embed("clip"), TypeError, "clips must be a sequence of Clip, got str"),
    case("caption('clip')", lambda c: c.caption("clip"), TypeError, "inputs must be an AVBatch or a sequence of Clip, got str"),
    case("caption batch_size 0", lambda c: c.caption([], batch_size=0), ValueError, "batch_size must be >= 1, got 0"),
    case("caption num_beams 0", lambda c: c.caption([], num_beams=0), ValueError, "num_beams must be an int >= 1, got 0"),
]


@pytest.mark.parametrize("call,error,match", CAPTIONER_CASES)
def test_bad_captioner_input_is_refused(tiny_captioner, call, error, match):
    raises(lambda: call(FrozenCaptioner.load(tiny_captioner, device="cpu")), error, match)


LOAD_CASES = [
    case("load device 'cuda:x'", lambda path: FrozenCaptioner.load(path, device="cuda:x"), ValueError, r"device must be .* got 'cuda:x'"),
    case("load device 'cuda:9'", lambda path: FrozenCaptioner.load(path, device="cuda:9"), ValueError, r"device is 'cuda:9' but (CUDA is not available|this machine has \d+ CUDA device)"),
    case("load_policy checkpoint '../x'", lambda path: load_policy(path, None, checkpoint="../x"), ValueError, r"checkpoint must be 'latest', 'warmup' or a step-N directory name, got '\.\./x'"),
    case("train(a dict)", lambda path: train({"epochs": 1}), TypeError, "cfg must be a TrainConfig, got dict"),
    case("train(resume='no')", lambda path: train(TrainConfig(), resume="no"), TypeError, "resume must be True or False, got str: 'no'"),
]


@pytest.mark.parametrize("call,error,match", LOAD_CASES)
def test_bad_loader_argument_is_refused(tmp_path, call, error, match):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    raises(lambda: call(run), error, match)
