"""Bad training settings, config files, run files and resumes: each is refused, naming the
setting or file and the value, before any file is written or model loaded. One case a line
(tests/badinput.py); ``python -m avex.train`` turns each into a usage error (exit 2)."""
import json
import shutil
from pathlib import Path

import pytest
import torch

from avex.train import main as train_main
from avex.training.loop import prepare_run
from avex.training.checkpoint import save_checkpoint
from avex.training.config import TrainConfig, load_config_file
from badinput import INF, NAN, case, exits_with_usage_error, raises, usage


def cfg(**settings):
    return lambda: TrainConfig(**settings).validate()


CONFIG_CASES = [
    case("epochs nan", cfg(epochs=NAN), ValueError, r"epochs must be a finite number >= 0, got nan"),
    case("epochs inf", cfg(epochs=INF), ValueError, r"epochs must be a finite number >= 0, got inf"),
    case("warmup_epochs nan", cfg(warmup_epochs=NAN), ValueError, r"warmup_epochs .* got nan"),
    case("warmup_epochs inf", cfg(warmup_epochs=INF), ValueError, r"warmup_epochs .* got inf"),
    case("lambda_ex nan", cfg(lambda_ex=NAN), ValueError, r"lambda_ex .* got nan"),
    case("lambda_ex inf", cfg(lambda_ex=INF), ValueError, r"lambda_ex .* got inf"),
    case("weight_decay nan", cfg(weight_decay=NAN), ValueError, r"weight_decay .* got nan"),
    case("weight_decay inf", cfg(weight_decay=INF), ValueError, r"weight_decay .* got inf"),
    case("grad_clip nan", cfg(grad_clip=NAN), ValueError, r"grad_clip .* got nan"),
    case("grad_clip inf", cfg(grad_clip=INF), ValueError, r"grad_clip .* got inf"),
    case("grad_clip 0", cfg(grad_clip=0.0), ValueError, r"grad_clip must be a finite number > 0, got 0.0"),
    case("checkpoint_every 0", cfg(checkpoint_every=0), ValueError, "checkpoint_every must be >= 1, got 0"),
    case("checkpoint_every -5", cfg(checkpoint_every=-5), ValueError, "checkpoint_every must be >= 1, got -5"),
    case("max_eval_clips 0", cfg(max_eval_clips=0), ValueError, "max_eval_clips must be >= 1, got 0"),
    case("max_eval_clips -3", cfg(max_eval_clips=-3), ValueError, "max_eval_clips must be >= 1, got -3"),
    case("policy_hidden 0", cfg(policy_hidden=0), ValueError, "policy_hidden must be >= 1, got 0"),
    case("policy_hidden -8", cfg(policy_hidden=-8), ValueError, "policy_hidden must be >= 1, got -8"),
    case("eval_split bogus", cfg(eval_split="bogus"), ValueError, r"eval_split must be one of .* got 'bogus'"),
    case("device cuda:abc", cfg(device="cuda:abc"), ValueError, r"device must be .* got 'cuda:abc'"),
    case("device gpu", cfg(device="gpu"), ValueError, r"device must be .* got 'gpu'"),
    case("exchanges 'no'", cfg(exchanges="no"), TypeError, r"exchanges must be True or False, got str: 'no'"),
    case("rl 'yes'", cfg(rl="yes"), TypeError, r"rl must be True or False, got str: 'yes'"),
    case("progress 1", cfg(progress=1), TypeError, r"progress must be True or False, got int: 1"),
    case("normalize_rl 'false'", cfg(normalize_rl="false"), TypeError, "normalize_rl must be True or False"),
    case("epochs '3' (str)", cfg(epochs="3"), TypeError, r"epochs must be a number, got str: '3'"),
    case("epochs -1", cfg(epochs=-1.0), ValueError, "epochs must be a finite number >= 0, got -1.0"),
    case("lr_warmup nan", cfg(lr_warmup=NAN), ValueError, r"lr_warmup must be a finite number in \[0, 1\), got nan"),
    case("lr_warmup 1", cfg(lr_warmup=1.0), ValueError, r"lr_warmup .* in \[0, 1\), got 1.0"),
    case("lr inf", cfg(lr=INF), ValueError, "lr must be a finite number > 0, got inf"),
    case("tau -1", cfg(tau=-1.0), ValueError, "tau must be a finite number > 0, got -1.0"),
    case("seed -1", cfg(seed=-1), ValueError, "seed must be >= 0, got -1"),
    case("seed 1.5", cfg(seed=1.5), TypeError, r"seed must be an int, got float: 1.5"),
    case("batch_size True", cfg(batch_size=True), TypeError, "batch_size must be an int, got bool"),
    case("retention nan", cfg(retention=NAN), ValueError, r"retention must be in \(0, 1\], got nan"),
    case("eval_retentions a float", cfg(eval_retentions=0.4), TypeError, "eval_retentions must be a list"),
    case("eval_retentions [0.4, 0]", cfg(eval_retentions=[0.4, 0]), ValueError, r"eval_retentions\[1\] must be in \(0, 1\], got 0"),
    case("exchange_types a str", cfg(exchange_types="vv"), TypeError, "exchange_types must be a list of str, got str"),
    case("exchange_anchors 'every'", cfg(exchange_anchors="every"), ValueError, r"exchange_anchors must be one of .* got 'every'"),
    case("exchange_saturation 0", cfg(exchange_saturation=0.0), ValueError, "exchange_saturation must be a finite number > 0, got 0.0"),
    case("exchange_saturation nan", cfg(exchange_saturation=NAN), ValueError, "exchange_saturation must be a finite number > 0, got nan"),
    case("normalize_exchange 'yes'", cfg(normalize_exchange="yes"), TypeError, "normalize_exchange must be True or False"),
    case("normalize_exchange without rl", cfg(exchanges=True, rl=False), ValueError, "normalize_exchange scales L_ex's gradient to L_RL's, but rl is off"),
    case("lambda_best -1", cfg(lambda_best=-1.0), ValueError, "lambda_best must be a finite number >= 0, got -1.0"),
    case("diagnostics_every -1", cfg(diagnostics_every=-1), ValueError, "diagnostics_every must be >= 0, got -1"),
    case("rl_estimator 'grpo'", cfg(rl_estimator="grpo"), ValueError, r"rl_estimator must be one of .* got 'grpo'"),
    case("group estimator, one anchor", cfg(rl_estimator="group", anchors=1), ValueError, r"anchors must be >= 2 with rl_estimator='group'"),
    case("exchange_selection unhashable", cfg(exchange_selection=["random"]), ValueError, r"exchange_selection must be one of .* got \['random'\]"),
    case("data 7", cfg(data=7), TypeError, "data must be a non-empty str, got int: 7"),
    case("run_dir empty", cfg(run_dir=""), TypeError, "run_dir must be a non-empty str or None, got str: ''"),
    case("captioner_preset huge", cfg(captioner_preset="huge"), ValueError, r"captioner_preset must be one of .* got 'huge'"),
    case("own cache, embedded captioner", cfg(data="."), ValueError, "captioner='embedded' goes with data='embedded'"),
    case("epochs 0 without warmup_only", cfg(epochs=0.0), ValueError, "epochs is 0: the run would take no RL step"),
    case("warmup_only with warmup_epochs 0", cfg(warmup_only=True, warmup_epochs=0.0), ValueError, "warmup_only with warmup_epochs 0 trains nothing"),
    case("eval_retentions duplicated", cfg(eval_retentions=[0.4, 0.4]), ValueError, r"eval_retentions has duplicates: \[0.4, 0.4\]"),
    case("eval_retentions empty", cfg(eval_retentions=[]), ValueError, "eval_retentions is empty: the table would score no retention"),
    case("train_retentions with 1.0", cfg(train_retentions=[0.5, 1.0]), ValueError, "train_retentions holds 1.0, which keeps every token"),
    case("retention 1.0 alone", cfg(train_retentions=[], retention=1.0), ValueError, "retention holds 1.0, which keeps every token"),
]


@pytest.mark.parametrize("call,error,match", CONFIG_CASES)
def test_bad_training_setting_is_refused(call, error, match):
    raises(call, error, match)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


CONFIG_FILE_CASES = [
    case("YAML syntax error", lambda d: load_config_file(write(d, "run.yaml", "g: [4\n")), ValueError, r"(?s)config .*run\.yaml: cannot be read as YAML: .*line 1, column 4"),
    case("YAML tab indent", lambda d: load_config_file(write(d, "run.yml", "a:\n\t- 1\n")), ValueError, r"run\.yml: cannot be read as YAML"),
    case("JSON syntax error", lambda d: load_config_file(write(d, "run.json", "{g: 4}")), ValueError, r"config .*run\.json: cannot be read as JSON"),
    case("YAML list, not a mapping", lambda d: load_config_file(write(d, "run.yaml", "- 1\n")), ValueError, r"run\.yaml: expected a mapping of settings, got list"),
    case("not UTF-8", lambda d: load_config_file(write(d, "run.json", "") and (d / "run.json").write_bytes(b"\xff\xfe") and d / "run.json"), ValueError, r"run\.json: cannot be read as JSON"),
    case("no such file", lambda d: load_config_file(d / "missing.yaml"), FileNotFoundError, r"config: no file at .*missing\.yaml"),
    case("a directory", lambda d: load_config_file(d), FileNotFoundError, "config: no file at"),
]


@pytest.mark.parametrize("call,error,match", CONFIG_FILE_CASES)
def test_bad_config_file_is_refused_naming_it(tmp_path, call, error, match):
    raises(lambda: call(tmp_path), error, match)


TRAIN_CLI_CASES = [
    usage("--g 4 without --exchanges", train_main, ["--g", "4"], r"g = 4 has no effect without the exchange term \(off by default\); add --exchanges"),
    usage("--lambda-ex 1 without --exchanges", train_main, ["--lambda-ex", "1"], r"lambda_ex = 1.0 has no effect without the exchange term"),
    usage("--exchange-anchors all without --exchanges", train_main, ["--exchange-anchors", "all"], r"exchange_anchors = 'all' has no effect without the exchange term"),
    usage("--g 4 while g is a share of K", train_main, ["--exchanges", "--g", "4"], r"g = 4 has no effect while g_fraction is 0.125 \(g = g_fraction x K\); add --g-fraction 0"),
    usage("--exchange-saturation 0", train_main, ["--exchanges", "--exchange-saturation", "0"], "exchange_saturation must be a finite number > 0, got 0.0"),
    usage("--epochs nan", train_main, ["--epochs", "nan"], r"error: epochs must be a finite number >= 0, got nan"),
    usage("--eval-split bogus", train_main, ["--eval-split", "bogus"], r"error: eval_split must be one of"),
    usage("--device cuda:abc", train_main, ["--device", "cuda:abc"], r"error: device must be"),
    usage("--checkpoint-every 0", train_main, ["--checkpoint-every", "0"], "checkpoint_every must be >= 1, got 0"),
    usage("--max-eval-clips -1", train_main, ["--max-eval-clips", "-1"], "max_eval_clips must be >= 1, got -1"),
    usage("--policy-hidden 0", train_main, ["--policy-hidden", "0"], "policy_hidden must be >= 1, got 0"),
    usage("--policy-init-layers -1", train_main, ["--policy-init-layers", "-1"], "policy_init_layers must be >= 0, got -1"),
    usage("--policy-init-layers 3", train_main, ["--policy-init-layers", "3"], r"policy_init_layers must be at most 2 \(the policy's encoder blocks\), got 3"),
    usage("--policy-init-layers 2 --policy-hidden 64", train_main, ["--policy-init-layers", "2", "--policy-hidden", "64"], r"policy_init_layers = 2 copies the LLM's decoder layers, which a policy of its own width \(policy_hidden = 64\) can't take"),
    usage("--grad-clip inf", train_main, ["--grad-clip", "inf"], "grad_clip must be a finite number > 0, got inf"),
    usage("--lambda-ex nan", train_main, ["--lambda-ex", "nan"], "lambda_ex must be a finite number >= 0, got nan"),
    usage("--epochs abc", train_main, ["--epochs", "abc"], r"argument --epochs: invalid float value: 'abc'"),
    usage("--g 2.5", train_main, ["--g", "2.5"], r"argument --g: invalid int value: '2.5'"),
    usage("--eval-retentions 0.4,x", train_main, ["--eval-retentions", "0.4,x"], r"argument --eval-retentions: invalid comma-separated float value"),
    usage("--eval-retentions 2", train_main, ["--eval-retentions", "2"], r"eval_retentions\[0\] must be in \(0, 1\], got 2"),
    usage("--preset huge", train_main, ["--preset", "huge"], r"argument --preset: invalid choice: 'huge'"),
    usage("--config missing", train_main, ["--config", "/no/such/run.yaml"], "config: no file at '/no/such/run.yaml'"),
    usage("--data missing", train_main, ["--data", "/no/such/cache"], "data: no feature cache at '/no/such/cache'"),
    usage("--micro-batch-size 0", train_main, ["--micro-batch-size", "0"], "micro_batch_size must be >= 1, got 0"),
    usage("--tau 0", train_main, ["--tau", "0"], "tau must be a finite number > 0, got 0.0"),
    usage("--warmup-lr nan", train_main, ["--warmup-lr", "nan"], "warmup_lr must be a finite number > 0, got nan"),
    usage("--lr-warmup 1", train_main, ["--lr-warmup", "1"], r"lr_warmup must be a finite number in \[0, 1\), got 1.0"),
    usage("--seed -1", train_main, ["--seed", "-1"], "seed must be >= 0, got -1"),
    usage("--num-beams 0", train_main, ["--num-beams", "0"], "num_beams must be >= 1, got 0"),
    usage("--max-new-tokens 0", train_main, ["--max-new-tokens", "0"], "max_new_tokens must be >= 1, got 0"),
    usage("--exchange-selection greedy", train_main, ["--exchange-selection", "greedy"], r"exchange_selection must be one of .* got 'greedy'"),
    usage("--exchange-types vv,vv", train_main, ["--exchange-types", "vv,vv"], r"exchange_types has duplicates: \['vv', 'vv'\]"),
    usage("--epochs 0", train_main, ["--epochs", "0"], "epochs is 0: the run would take no RL step"),
    usage("--retention beside the draw", train_main, ["--retention", "0.9"], r"retention = 0.9 has no effect while train_retentions is \[0.5, 0.4, 0.3, 0.2, 0.1\].*--train-retentions 0.9"),
    usage("--warmup-only with an RL setting", train_main, ["--warmup-only", "--lr", "0.5"], r"lr = 0.5 has no effect in a warmup-only run"),
    usage("--warmup-only with --anchors", train_main, ["--warmup-only", "--anchors", "3"], r"anchors = 3 has no effect in a warmup-only run"),
    usage("--warmup-only with CaCoVID-AV asked", train_main, ["--warmup-only", "--eval-methods", "random,cacovid"], r"eval_methods = \['random', 'cacovid'\] has no effect in a warmup-only run"),
    usage("--no-evaluate with a table setting", train_main, ["--no-evaluate", "--eval-retentions", "0.3"], r"eval_retentions = \[0.3\] has no effect with --no-evaluate"),
    usage("--normalize-rl with rloo", train_main, ["--normalize-rl"], r"normalize_rl = True has no effect with rl_estimator 'rloo' and no exchange term"),
    usage("--no-rl without exchanges", train_main, ["--no-rl"], r"rl = False has no effect without the exchange term"),
    usage("--exchange-search with --anchors", train_main, ["--exchange-search", "--selection", "topk", "--anchors", "4"], r"anchors = 4 has no effect with the exchange search"),
    usage("--eval-retentions empty", train_main, ["--eval-retentions", ""], r"eval_retentions is empty|invalid comma-separated"),
    pytest.param(train_main, ["--device", "cuda:1"], "CUDA is not available|this machine has 1 CUDA", id="--device cuda:1 on a machine without it", marks=pytest.mark.skipif(torch.cuda.device_count() > 1, reason="this machine has a cuda:1")),
]


@pytest.mark.parametrize("main,argv,match", TRAIN_CLI_CASES)
def test_bad_train_flag_is_a_usage_error(tmp_path, capsys, main, argv, match):
    exits_with_usage_error(main, argv + ["--run-dir", str(tmp_path / "run")], match, capsys)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flag,where,match", [
    ("--run-dir", "{file}/run", r"run_dir can't be made: '.*afile' is a file"),
    ("--run-dir", "{file}", "run_dir must be a directory, got '.*afile', which is a file"),
    ("--cache-dir", "{file}/cache", r"cache_dir can't be made: '.*afile' is a file"),
])
def test_unwritable_train_output_is_a_usage_error(tmp_path, capsys, flag, where, match):
    blocker = tmp_path / "afile"
    blocker.write_text("not a folder")
    argv = [flag, where.format(file=blocker)]
    if flag != "--run-dir":
        argv += ["--run-dir", str(tmp_path / "run")]
    exits_with_usage_error(train_main, argv, match, capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


USER_CACHE_CASES = [
    case("meta.json not JSON", lambda d: (d / "meta.json").write_text("{"), SystemExit, r"cache/meta\.json: not valid JSON"),
    case("no manifest", lambda d: (d / "meta.json").write_text('{"format": "avex-feature-cache", "version": 1, "dim": 4, "dtype": "F32"}'), SystemExit, r"cache/manifest\.jsonl: missing"),
]


@pytest.mark.parametrize("damage,error,match", USER_CACHE_CASES)
def test_broken_user_cache_is_a_usage_error_before_any_model(tmp_path, capsys, damage, error,
                                                             match):
    (tmp_path / "cache").mkdir()
    (tmp_path / "lm").mkdir()
    damage(tmp_path / "cache")
    assert error is SystemExit
    exits_with_usage_error(train_main, ["--data", str(tmp_path / "cache"), "--captioner",
                                        str(tmp_path / "lm"), "--run-dir", str(tmp_path / "run")],
                           match, capsys)
    assert not (tmp_path / "run").exists()


def test_yaml_error_in_train_config_names_the_file(tmp_path, capsys):
    config = write(tmp_path, "bad.yaml", "epochs: [1\n")
    exits_with_usage_error(train_main, ["--config", str(config), "--run-dir", str(tmp_path / "r")],
                           r"config .*bad\.yaml: cannot be read as YAML", capsys)


# ---- runs: resume, run files -------------------------------------------------------------

def make_run(run_dir: Path, **settings) -> Path:
    """A run directory as avex.train leaves it after its first checkpoint (a stand-in policy)."""
    run_dir.mkdir(parents=True)
    config = TrainConfig(run_dir=str(run_dir), benchmark_preset="tiny", captioner_preset="tiny",
                         **settings).to_dict()
    (run_dir / "config.json").write_text(json.dumps(config))
    state = {"phase": "rl", "step": 0, "optimizer": {}, "scheduler": None, "rng": {},
             "config": config}
    save_checkpoint(run_dir, 3, torch.nn.Linear(2, 2), state)
    return run_dir


def step_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / "step-00000003"


def truncate(path: Path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def other_runs_checkpoint(run: Path):
    other = make_run(run.parent / "other", g=4)
    shutil.rmtree(step_dir(run))
    shutil.copytree(step_dir(other), step_dir(run))


RESUME_CASES = [
    case("config.json not JSON", lambda r: (r / "config.json").write_text("{not json"), SystemExit, r"config\.json: corrupt or truncated run settings"),
    case("config.json truncated", lambda r: truncate(r / "config.json"), SystemExit, r"config\.json: corrupt or truncated run settings"),
    case("config.json a list", lambda r: (r / "config.json").write_text("[]"), SystemExit, r"config\.json: expected a JSON object of settings, got list"),
    case("config.json unknown setting", lambda r: (r / "config.json").write_text('{"gg": 1}'), SystemExit, r"config\.json: unknown settings \['gg'\]"),
    case("config.json bad value", lambda r: (r / "config.json").write_text('{"epochs": "nan"}'), SystemExit, r"epochs must be a number, got str: 'nan'"),
    case("state.pt corrupt", lambda r: (step_dir(r) / "state.pt").write_bytes(b"garbage"), SystemExit, r"step-00000003/state\.pt: corrupt or truncated checkpoint state"),
    case("state.pt truncated", lambda r: truncate(step_dir(r) / "state.pt"), SystemExit, r"state\.pt: corrupt or truncated checkpoint state"),
    case("state.pt not a state", lambda r: torch.save([1, 2], step_dir(r) / "state.pt"), SystemExit, r"state\.pt: not a training checkpoint state"),
    case("policy.safetensors truncated", lambda r: truncate(step_dir(r) / "policy.safetensors"), SystemExit, r"policy\.safetensors: corrupt or truncated weights"),
    case("policy.safetensors garbage", lambda r: (step_dir(r) / "policy.safetensors").write_bytes(b"\x00" * 9), SystemExit, r"policy\.safetensors: corrupt or truncated"),
    case("latest points outside the run", lambda r: (r / "checkpoints" / "latest").write_text("../../other/checkpoints/step-00000003\n"), SystemExit, r"names '\.\./\.\./other/.*', not a step-N checkpoint of this run"),
    case("latest points at a missing step", lambda r: (r / "checkpoints" / "latest").write_text("step-00000099\n"), SystemExit, r"points at .*step-00000099, which is missing or incomplete"),
    case("checkpoint of another run", other_runs_checkpoint, SystemExit, r"step-00000003 belongs to a run with other settings .* \['g'\]"),
    case("no checkpoints", lambda r: shutil.rmtree(r / "checkpoints"), SystemExit, r"--resume: no checkpoint under .*; start the run without --resume"),
]


@pytest.mark.parametrize("damage,error,match", RESUME_CASES)
def test_damaged_run_is_refused_naming_the_file(tmp_path, capsys, damage, error, match):
    run = make_run(tmp_path / "run")
    damage(run)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert error is SystemExit  # python -m avex.train: a usage error
    exits_with_usage_error(train_main, ["--resume", "--run-dir", str(run)], match, capsys)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


RESUME_FLAG_CASES = [
    usage("--epochs differs from the run's", train_main, ["--epochs", "5"], r"asks for epochs=5\.0 \(the run has 3\.0\); drop those flags"),
    usage("--g differs from the run's", train_main, ["--g", "2"], r"asks for g=2 \(the run has 8\)"),
]


@pytest.mark.parametrize("main,argv,match", RESUME_FLAG_CASES)
def test_resume_refuses_flags_that_contradict_the_run(tmp_path, capsys, main, argv, match):
    run = make_run(tmp_path / "run")
    exits_with_usage_error(main, ["--resume", "--run-dir", str(run)] + argv, match, capsys)


@pytest.mark.parametrize("move", [shutil.copytree, shutil.move], ids=["copied", "moved"])
def test_copied_or_moved_run_resumes_where_it_is_now(tmp_path, move):
    original = make_run(tmp_path / "runD")
    saved = (original / "config.json").read_text() if move is shutil.copytree else None
    move(original, tmp_path / "runE")
    run = prepare_run(TrainConfig(run_dir=str(tmp_path / "runE")), resume=True)
    assert run.run_dir == tmp_path / "runE" and run.cfg.run_dir == str(tmp_path / "runE")
    assert run.books.checkpoint == step_dir(tmp_path / "runE")
    assert json.loads((tmp_path / "runE" / "config.json").read_text())["run_dir"] == \
        str(tmp_path / "runE")
    assert run.cfg.benchmark_preset == "tiny"  # the run's own settings, not the defaults
    if saved is not None:  # the original is untouched
        assert (original / "config.json").read_text() == saved


def warmup_run(path, **settings):
    """A run directory with a warmup policy file and the settings ``settings``."""
    path.mkdir(parents=True)
    (path / "warmup_policy.safetensors").write_bytes(b"")
    (path / "config.json").write_text(json.dumps(settings))
    return path


def test_a_warmup_from_a_run_with_another_captioner_is_refused_before_any_file(tmp_path,
                                                                                capsys):
    other = warmup_run(tmp_path / "b1", data="/c/benchmarks/embedded-default-seed1",
                       captioner="/c/captioners/embedded-default-seed1-default")
    exits_with_usage_error(
        train_main, ["--warmup-from", str(other), "--run-dir", str(tmp_path / "run")],
        r"warmup_from: .*b1 was trained with captioner 'embedded-default-seed1-default' \(on "
        r"'embedded-default-seed1'\), this run with 'embedded-default-seed0-default' \(on "
        r"'embedded-default-seed0'\); its warmup policy scored the other captioner's", capsys)
    assert not (tmp_path / "run").exists()
    # the same captioner, wherever it lies now (or named by its preset), on any cache: passes
    for name, settings in (("moved", {"data": "/x/embedded-default-seed0",
                                      "captioner": "/x/embedded-default-seed0-default"}),
                           ("presets", {"data": "embedded", "captioner": "embedded"}),
                           ("other-cache", {"data": "/mine/cache",
                                            "captioner": "/x/embedded-default-seed0-default"})):
        run = prepare_run(TrainConfig(warmup_from=str(warmup_run(tmp_path / name, **settings)),
                                      run_dir=str(tmp_path / f"run-{name}")))
        assert run.cfg.warmup_from == str(tmp_path / name)


def _fake_warmup_run(path: Path) -> Path:
    path.mkdir()
    (path / "warmup_policy.safetensors").write_bytes(b"")  # only its presence is checked here
    return path


@pytest.mark.parametrize("extra,match", [
    (["--warmup-only"], "warmup_only with warmup_from=.* trains nothing"),
    (["--warmup-epochs", "2"], r"warmup_epochs = 2.0 has no effect with warmup_from"),
    (["--warmup-lr", "1e-3"], r"warmup_lr = 0.001 has no effect with warmup_from"),
    (["--policy-init-layers", "2"], r"policy_init_layers = 2 has no effect with warmup_from"),
])
def test_warmup_settings_beside_a_read_warmup_are_refused(tmp_path, capsys, extra, match):
    """--warmup-from reads the warmup, so warmup-only trains nothing and the warmup's own
    settings would be dropped: refused before any file is written."""
    source = _fake_warmup_run(tmp_path / "source")
    exits_with_usage_error(train_main, ["--warmup-from", str(source), *extra,
                                         "--run-dir", str(tmp_path / "run")], match, capsys)
    assert not (tmp_path / "run").exists()
