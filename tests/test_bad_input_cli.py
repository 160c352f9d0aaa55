"""Bad flags of every command line: each exits with status 2, a message naming the flag and the
value, and no traceback, before any captioning, training or file writing. One case a line
(tests/badinput.py). ``python -m avex.train``'s flags are in test_bad_input_config.py."""
from pathlib import Path

import pytest

from avex.captioner.__main__ import main as captioner_main
from avex.data.__main__ import main as data_main
from avex.evaluate.__main__ import main as evaluate_main
from avex.policy.__main__ import main as policy_main
from avex.profiling.__main__ import main as profiling_main
from badinput import exits_with_usage_error, usage
from file_module import load_file


def _script(path: Path):
    return load_file(path)


summarize_main = _script(Path(__file__).resolve().parents[1] / "bench" / "summarize.py").main
THIS_FILE, TESTS = str(Path(__file__).resolve()), str(Path(__file__).resolve().parent)
# the message without CUDA, or on a machine with fewer than ten GPUs
NO_CUDA_9 = r"device is 'cuda:9' but (CUDA is not available|this machine has \d+ CUDA device)"

CLI_CASES = [
    usage("evaluate --fastv-layer -5", evaluate_main, ["sweep", "--fastv-layer", "-5"], "fastv_layer must be >= 1, got -5"),
    usage("evaluate --fastv-layer 0", evaluate_main, ["--fastv-layer", "0"], "fastv_layer must be >= 1, got 0"),
    usage("evaluate --split bogus", evaluate_main, ["--split", "bogus"], r"split must be one of .* got 'bogus'"),
    usage("evaluate --transfer-split bogus", evaluate_main, ["--transfer-split", "bogus"], r"transfer_split must be one of .*'none'.* got 'bogus'"),
    usage("evaluate --seeds -1", evaluate_main, ["--seeds", "0,-1"], "seeds must be >= 0, got -1"),
    usage("evaluate --seeds 1,1", evaluate_main, ["--seeds", "1,1"], r"seeds has duplicates: \[1, 1\]"),
    usage("evaluate --qualitative -1", evaluate_main, ["--qualitative", "-1"], "qualitative must be >= 0, got -1"),
    usage("evaluate --device cuda:x", evaluate_main, ["--device", "cuda:x"], r"device must be .* got 'cuda:x'"),
    usage("evaluate --benchmark-preset huge", evaluate_main, ["--benchmark-preset", "huge"], r"benchmark_preset must be one of .* got 'huge'"),
    usage("evaluate --captioner-preset huge", evaluate_main, ["--captioner-preset", "huge"], r"captioner_preset must be one of .* got 'huge'"),
    usage("evaluate --max-clips 0", evaluate_main, ["--max-clips", "0"], "max_clips must be >= 1, got 0"),
    usage("evaluate --num-beams 0", evaluate_main, ["--num-beams", "0"], "num_beams must be >= 1, got 0"),
    usage("evaluate --train-args '--epochs nan'", evaluate_main, ["--train-args", "--epochs nan"], r"--train-args: epochs must be a finite number >= 0, got nan"),
    usage("evaluate --train-args '--bogus'", evaluate_main, ["--train-args", "--bogus 1"], r"--train-args: '--bogus 1' are not python -m avex.train flags"),
    usage("evaluate --data own cache, embedded captioner", evaluate_main, ["--data", "."], "--captioner embedded goes with --data embedded"),
    usage("evaluate --data missing", evaluate_main, ["--data", "/no/such/cache"], "--data: no feature cache at '/no/such/cache'"),
    usage("evaluate --data a file", evaluate_main, ["--data", THIS_FILE, "--captioner", TESTS], r"--data: no feature cache at '.*test_bad_input_cli\.py' \(a file; a feature cache is a directory holding meta\.json\)"),
    usage("evaluate --data a folder without meta.json", evaluate_main, ["--data", TESTS, "--captioner", TESTS], r"--data: no feature cache at '.*tests' \(a directory without meta\.json"),
    usage("evaluate gates --benchmark a file", evaluate_main, ["gates", "--benchmark", THIS_FILE], r"--benchmark: no feature cache at '.*test_bad_input_cli\.py' \(a file"),
    usage("evaluate --device cuda:9", evaluate_main, ["--device", "cuda:9"], NO_CUDA_9),
    usage("evaluate gates --device cuda:9", evaluate_main, ["gates", "--device", "cuda:9"], NO_CUDA_9),
    usage("evaluate motivation --group 0", evaluate_main, ["motivation", "--group", "0"], "group must be >= 1, got 0"),
    usage("evaluate motivation --group -2", evaluate_main, ["motivation", "--group", "-2"], "group must be >= 1, got -2"),
    usage("evaluate motivation --base-sets 0", evaluate_main, ["motivation", "--base-sets", "0"], "base_sets must be >= 1, got 0"),
    usage("evaluate motivation --clips 0", evaluate_main, ["motivation", "--clips", "0"], "clips must be >= 1, got 0"),
    usage("evaluate motivation --base-retention 0", evaluate_main, ["motivation", "--base-retention", "0"], r"base_retention must be in \(0, 1\], got 0"),
    usage("evaluate motivation --seed -1", evaluate_main, ["motivation", "--seed", "-1"], "seed must be >= 0, got -1"),
    usage("evaluate ablation --retention 1.5", evaluate_main, ["ablation", "--retention", "1.5"], r"retention must be in \(0, 1\], got 1.5"),
    usage("evaluate ablation --run bad", evaluate_main, ["ablation", "--run", "nope=/tmp"], "--run must be VARIANT=DIR"),
    usage("evaluate --train-args '--exchange-types vv'", evaluate_main, ["--train-args", "--exchange-types vv"], r"--train-args: exchange_types = \['vv'\] has no effect without the exchange term"),
    usage("evaluate ablation --seeds 0,0", evaluate_main, ["ablation", "--seeds", "0,0"], r"seeds has duplicates: \[0, 0\]"),
    usage("evaluate ablation --seeds -1", evaluate_main, ["ablation", "--seeds", "-1"], "seeds must be >= 0, got -1"),
    usage("evaluate ablation --run with two seeds", evaluate_main, ["ablation", "--seeds", "0,1", "--run", "full=/tmp"], r"--run reuses one run per variant, so it takes one seed; got seeds \[0, 1\]"),
    usage("evaluate ablation --train-args overridden by a variant", evaluate_main, ["ablation", "--variants", "Dc-fid", "--train-args", "--reward cider+fidelity"], r"--train-args: reward='cider\+fidelity' would be overridden: variant 'Dc-fid' is defined with reward='fidelity'"),
    usage("evaluate ablation --train-args '--retention 0.3'", evaluate_main, ["ablation", "--train-args", "--retention 0.3"], r"--train-args: retention = 0.3 has no effect while train_retentions is"),
    usage("evaluate sweep --train-args '--seed 3'", evaluate_main, ["sweep", "--train-args", "--seed 3"], r"--train-args: seed=3 is set by the experiment for each run it trains"),
    usage("evaluate sweep --train-args overridden by CaCoVID-AV", evaluate_main, ["sweep", "--train-args", "--reward cider+fidelity"], r"--train-args: reward='cider\+fidelity' would be overridden: method 'CaCoVID-AV' is defined with reward='cider'"),
    usage("evaluate ablation --variants bogus", evaluate_main, ["ablation", "--variants", "bogus"], r"variants must be one of .* got 'bogus'"),
    usage("evaluate ablation --derive without '='", evaluate_main, ["ablation", "--derive", "Dc-fid --redundancy 2"], r"--derive must be 'NAME=VARIANT FLAGS' .* got 'Dc-fid --redundancy 2'"),
    usage("evaluate ablation --derive without a variant", evaluate_main, ["ablation", "--derive", "x=--redundancy 2"], r"--derive must be 'NAME=VARIANT FLAGS'"),
    usage("evaluate ablation --derive changing nothing", evaluate_main, ["ablation", "--derive", "x=Dc-fid --redundancy 4"], r"--derive x: 'Dc-fid' already trains with redundancy=4\.0; change something else"),
    usage("evaluate ablation --derive with a bad flag", evaluate_main, ["ablation", "--derive", "x=Dc-fid --bogus 1"], r"--derive x: '--bogus 1' are not python -m avex.train flags"),
    usage("evaluate ablation --derive with a bad value", evaluate_main, ["ablation", "--derive", "x=Dc-fid --redundancy nan"], r"--derive x: redundancy must be a finite number >= 0, got nan"),
    usage("evaluate ablation --derive with --preset", evaluate_main, ["ablation", "--derive", "x=Dc-fid --preset paper"], r"--derive x: --preset can't derive a variant"),
    usage("evaluate gates --seeds 0", evaluate_main, ["gates", "--seeds", "0"], "seeds must be >= 1, got 0"),
    usage("evaluate gates --counterfactual-clips 0", evaluate_main, ["gates", "--counterfactual-clips", "0"], "counterfactual_clips must be >= 1, got 0"),
    usage("evaluate gates --base-sets -1", evaluate_main, ["gates", "--base-sets", "-1"], "base_sets must be >= 1, got -1"),
    usage("evaluate gates --benchmark missing", evaluate_main, ["gates", "--benchmark", "/no/such"], "--benchmark: no feature cache at '/no/such'"),
    usage("profiling --runs 0", profiling_main, ["--runs", "0"], "runs must be >= 1, got 0"),
    usage("profiling --runs -3", profiling_main, ["--runs", "-3"], "runs must be >= 1, got -3"),
    usage("profiling --warmup -1", profiling_main, ["--warmup", "-1"], "warmup must be >= 0, got -1"),
    usage("profiling --decode-tokens 0", profiling_main, ["--decode-tokens", "0"], "decode_tokens must be >= 1, got 0"),
    usage("profiling --visual-tokens -1", profiling_main, ["--visual-tokens", "-1"], "visual_tokens must be >= 0, got -1"),
    usage("profiling --policy-hidden-size -1", profiling_main, ["--policy-hidden-size", "-1"], "policy_hidden_size must be >= 0, got -1"),
    usage("profiling --device cuda:x", profiling_main, ["--device", "cuda:x"], r"device must be .* got 'cuda:x'"),
    usage("profiling --name a/b", profiling_main, ["--name", "a/b"], "name is a file stem"),
    usage("profiling --retention nan", profiling_main, ["--retention", "nan"], r"retention must be in \(0, 1\], got nan"),
    usage("data build --train -1", data_main, ["build", "--train", "-1"], r"train \(clips in that split\) must be an int >= 0, got -1"),
    usage("data build --dim 8", data_main, ["build", "--dim", "8"], "dim must be >= 16"),
    usage("data build --seed -1", data_main, ["build", "--seed", "-1"], "seed must be >= 0, got -1"),
    usage("data verify missing", data_main, ["verify", "/no/such/cache"], "/no/such/cache: no such cache directory"),
    usage("data info missing", data_main, ["info", "/no/such/cache"], "/no/such/cache: no such cache directory"),
    usage("captioner install --seed 999 (none shipped)", captioner_main, ["install", "--seed", "999"], r"no shipped reference captioner for embedded-default-seed999 with preset 'default'"),
    usage("captioner install --seed -1", captioner_main, ["install", "--seed", "-1"], "seed must be >= 0, got -1"),
    usage("captioner train --steps 0", captioner_main, ["train", "--steps", "0"], "steps must be a positive int, got 0"),
    usage("captioner train --lr nan", captioner_main, ["train", "--lr", "nan"], "lr must be a finite number > 0, got nan"),
    usage("captioner train --seed -1", captioner_main, ["train", "--seed", "-1"], "seed must be >= 0, got -1"),
    usage("captioner train --device tpu", captioner_main, ["train", "--device", "tpu"], r"device must be .* got 'tpu'"),
    usage("captioner train --device cuda:9", captioner_main, ["train", "--device", "cuda:9"], NO_CUDA_9),
    usage("captioner caption --device cuda:9", captioner_main, ["caption", "--data", ".", "--device", "cuda:9"], NO_CUDA_9),
    usage("profiling --backbone a file that isn't JSON", profiling_main, ["--backbone", THIS_FILE], r"backbone '.*test_bad_input_cli\.py': .* is not a Hugging Face config \(JSONDecodeError"),
    usage("policy --backbone a file that isn't JSON", policy_main, ["--backbone", THIS_FILE], r"backbone '.*test_bad_input_cli\.py': .* is not a Hugging Face config \(JSONDecodeError"),
    usage("policy --backbone a folder without config.json", policy_main, ["--backbone", TESTS], r"backbone '.*tests': .*config\.json is not a Hugging Face config \(FileNotFoundError"),
    usage("captioner train --data missing", captioner_main, ["train", "--data", "/no/such"], "--data: no feature cache at '/no/such'"),
    usage("captioner train --data with --seed", captioner_main, ["train", "--data", "/no/such", "--seed", "3"], r"--seed 3 has no effect with --data"),
    usage("captioner train --data with --benchmark-preset", captioner_main, ["train", "--data", "/no/such", "--benchmark-preset", "tiny"], r"--benchmark-preset tiny has no effect with --data"),
    usage("captioner caption -n 0", captioner_main, ["caption", "--data", ".", "-n", "0"], "n must be >= 1, got 0"),
    usage("captioner caption --retention 2", captioner_main, ["caption", "--data", ".", "--retention", "2"], r"retention must be in \(0, 1\], got 2.0"),
    usage("captioner caption --num-beams 0", captioner_main, ["caption", "--data", ".", "--num-beams", "0"], "num_beams must be >= 1, got 0"),
    usage("captioner caption --split dev", captioner_main, ["caption", "--data", ".", "--split", "dev"], r"split must be one of .* got 'dev'"),
    usage("captioner caption --data missing", captioner_main, ["caption", "--data", "/no/such"], "--data: no feature cache at '/no/such'"),
    usage("policy --hidden-size 0", policy_main, ["--hidden-size", "0"], "hidden_size must be >= 1, got 0"),
    usage("policy --backbone gpt-9", policy_main, ["--backbone", "gpt-9"], r"backbone must be one of .* got 'gpt-9'"),
    usage("bench/summarize.py missing file", summarize_main, ["/no/such.json"], r"/no/such\.json: .*No such file"),
    usage("bench/summarize.py not benchmark JSON", summarize_main, [str(Path(__file__))], r"test_bad_input_cli\.py: .*"),
]


def sandbox(main, sub, root):
    """Flags that keep a command away from the shared cache and the working directory, should
    a check ever let one through."""
    if main is evaluate_main:
        out = root / "out" / "gates.md" if sub == "gates" else root / "out"
        return ["--cache-dir", str(root), "--out", str(out)]
    if main is profiling_main:
        return ["--out-dir", str(root / "out")]
    if (main, sub) in ((data_main, "build"), (captioner_main, "train")):
        return ["--cache-dir", str(root), "--out", str(root / "out")]
    if (main, sub) == (captioner_main, "install"):
        return ["--cache-dir", str(root)]
    return []


@pytest.mark.parametrize("main,argv,match", CLI_CASES)
def test_bad_flag_is_a_usage_error_before_any_work(tmp_path, capsys, main, argv, match):
    sub = argv[0] if argv and not argv[0].startswith("-") else None
    exits_with_usage_error(main, argv + sandbox(main, sub, tmp_path), match, capsys)
    assert not (tmp_path / "out").exists() and not (tmp_path / "benchmarks").exists()


# Output paths that can't be written: a file where a folder must go. Refused before any work,
# not after it (which would lose a training or profiling run); the stand-in file is untouched.
OUTPUT_CASES = [
    (evaluate_main, ["sweep", "--out", "{file}/out"], r"out can't be made: '.*afile' is a file"),
    (evaluate_main, ["ablation", "--out", "{file}"], "out must be a directory, got '.*afile', which is a file"),
    (evaluate_main, ["motivation", "--out", "{file}/out"], r"out can't be made: '.*afile' is a file"),
    (evaluate_main, ["gates", "--out", "{file}/gates.md"], "out's folder must be a directory, got '.*afile', which is a file"),
    (evaluate_main, ["gates", "--out", "{dir}"], "out must be a file path, got '.*', which is a directory"),
    (evaluate_main, ["sweep", "--cache-dir", "{file}", "--out", "{dir}/out"], "cache_dir must be a directory, got '.*afile', which is a file"),
    (evaluate_main, ["gates", "--cache-dir", "{file}/cache", "--out", "{dir}/g.md"], r"cache_dir can't be made: '.*afile' is a file"),
    (profiling_main, ["--out-dir", "{file}/out"], r"out_dir can't be made: '.*afile' is a file"),
    (data_main, ["build", "--preset", "tiny", "--out", "{file}/bench"], r"out can't be made: '.*afile' is a file"),
    (data_main, ["build", "--preset", "tiny", "--cache-dir", "{file}"], r"cache_dir can't be made: '.*afile' is a file"),
    (captioner_main, ["train", "--preset", "tiny", "--benchmark-preset", "tiny", "--cache-dir", "{dir}", "--out", "{file}/model"], r"out can't be made: '.*afile' is a file"),
    (captioner_main, ["train", "--preset", "tiny", "--benchmark-preset", "tiny", "--cache-dir", "{file}"], "cache_dir must be a directory, got '.*afile', which is a file"),
]


@pytest.mark.parametrize("main,argv,match", OUTPUT_CASES,
                         ids=[" ".join(a) for _, a, _ in OUTPUT_CASES])
def test_unwritable_output_is_refused_before_any_work(tmp_path, capsys, main, argv, match):
    blocker = tmp_path / "afile"
    blocker.write_text("not a folder")
    argv = [a.format(file=blocker, dir=tmp_path) for a in argv]
    exits_with_usage_error(main, argv, match, capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
    assert blocker.read_text() == "not a folder"


@pytest.mark.parametrize("flags,match", [
    (["sweep", "--avex-run", "{empty}"], r"--avex-run: .*empty has no config.json \(not a `python -m avex.train` run\)"),
    (["sweep", "--cacovid-run", "{unfinished}"], r"--cacovid-run: .*unfinished has no checkpoints/latest"),
    (["ablation", "--run", "full={empty}"], r"--run full: .*empty has no config.json"),
    (["ablation", "--run", "warmup={unfinished}"], r"--run warmup: no policy weights at .*warmup_policy.safetensors"),
    (["sweep", "--avex-run", "{truncated}"], r"--avex-run: .*policy\.safetensors: corrupt or truncated weights"),
    (["ablation", "--run", "full={truncated}"], r"--run full: .*policy\.safetensors: corrupt or truncated weights"),
], ids=["sweep --avex-run not a run", "sweep --cacovid-run unfinished",
        "ablation --run not a run", "ablation --run warmup without its weights",
        "sweep --avex-run with a 1-byte weights file", "ablation --run with a 1-byte weights file"])
def test_given_run_is_checked_before_any_training(tmp_path, capsys, flags, match):
    # a run that can't be loaded used to fail only after every other method had been trained
    (tmp_path / "empty").mkdir()
    (tmp_path / "unfinished").mkdir()
    (tmp_path / "unfinished" / "config.json").write_text("{}")
    step = tmp_path / "truncated" / "checkpoints" / "step-4"
    step.mkdir(parents=True)
    (tmp_path / "truncated" / "config.json").write_text("{}")
    (tmp_path / "truncated" / "checkpoints" / "latest").write_text("step-4")
    (step / "policy.safetensors").write_bytes(b"x")  # its message used to come after --out
    (step / "state.pt").write_bytes(b"")
    argv = [f.format(empty=tmp_path / "empty", unfinished=tmp_path / "unfinished",
                     truncated=tmp_path / "truncated") for f in flags]
    exits_with_usage_error(evaluate_main, argv + sandbox(evaluate_main, flags[0], tmp_path),
                           match, capsys)
    assert not (tmp_path / "out").exists() and not (tmp_path / "benchmarks").exists()


def test_fastv_layer_past_the_captioners_depth_is_refused_before_captioning(tiny_cache_dir,
                                                                             tmp_path, capsys):
    """The tiny captioner has 1 layer; its config.json says so before anything is loaded."""
    exits_with_usage_error(evaluate_main, [
        "sweep", "--benchmark-preset", "tiny", "--captioner-preset", "tiny", "--cache-dir",
        str(tiny_cache_dir), "--methods", "fastv", "--fastv-layer", "5", "--out",
        str(tmp_path / "out")], "fastv_layer must be <= the captioner's 1 layers, got 5", capsys)
    assert not (tmp_path / "out").exists()
