"""Bad input to the feature cache, one case a line (tests/badinput.py): a cache whose
meta.json, manifest or shards can't be right is refused naming the file, row and clip; the
writer refuses what the reader would; the reader's own arguments are checked."""
import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from avex.data import CacheError, CacheWriter, FeatureCache
from badinput import INF, NAN, case, raises

DIM = 4


def build(root, *, dtype=torch.float32):
    """Three clips (train, train, test), one shard per split, roles on the visual tokens."""
    with CacheWriter(root, dim=DIM, n_frames=2, dtype=dtype, clips_per_shard=4) as writer:
        for i, split in enumerate(["train", "train", "test"]):
            writer.add(f"clip-{i}", split, torch.randn(3, DIM), torch.randn(2, DIM),
                       refs_av=[f"a dog barks {i}"], prompt_prefix_ids=[1, 2],
                       prompt_suffix_ids=[3], annotations={"visual_role": [0, 1, 2]})
    return root


@pytest.fixture
def cache_root(tmp_path):
    return build(tmp_path / "cache")


def edit_meta(root, **changes):
    meta = json.loads((root / "meta.json").read_text())
    for key, value in changes.items():
        if callable(value):
            value(meta)
        else:
            meta[key] = value
    (root / "meta.json").write_text(json.dumps(meta))


def edit_row(root, line, **changes):
    rows = [json.loads(x) for x in (root / "manifest.jsonl").read_text().splitlines()]
    rows[line - 1].update(changes)
    (root / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def edit_shard(root, key, value):
    """Replace one tensor of the train shard; meta.json's size and SHA-256 are updated to match,
    so only what the shard holds is wrong."""
    path = root / "shards" / "train-00000.safetensors"
    tensors = load_file(str(path))
    tensors[key] = value
    save_file(tensors, str(path), metadata={"format": "avex-feature-cache/1"})
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    edit_meta(root, shards=lambda m: m["shards"]["shards/train-00000.safetensors"].update(
        bytes=path.stat().st_size, sha256=digest))


def bad_value(tensor_shape, value, at=(1, 2)):
    t = torch.randn(*tensor_shape)
    t[at] = value
    return t


def flip_bit(root, shard="train-00000"):
    """One bit of a shard's tensor data flipped: header, size and meta.json stay as they were."""
    path = root / "shards" / f"{shard}.safetensors"
    data = bytearray(path.read_bytes())
    data[8 + int.from_bytes(data[:8], "little") + 5] ^= 1
    path.write_bytes(bytes(data))
    return root


def shard_record(meta, value):
    meta["shards"]["shards/train-00000.safetensors"] = value


def read_all(root, **kwargs):
    return lambda: [clip for clip in FeatureCache(root, **kwargs)]


READER_CASES = [
    case("NaN feature in a shard", lambda r: (edit_shard(r, "clip-1/visual", bad_value((3, DIM), NAN)), read_all(r)()), CacheError, r"manifest\.jsonl row 2 \(clip 'clip-1'\): visual in .*train-00000\.safetensors holds NaN or inf \(token 1\)"),
    case("inf feature in a shard", lambda r: (edit_shard(r, "clip-0/audio", bad_value((2, DIM), INF, (0, 0))), read_all(r)()), CacheError, r"row 1 \(clip 'clip-0'\): audio in .* holds NaN or inf \(token 0\)"),
    case("meta.json says F16, shard holds F32", lambda r: (edit_meta(r, dtype="F16"), FeatureCache(r)), CacheError, r"row 1 \(clip 'clip-0'\): clip-0/visual in .* has dtype F32 but meta\.json 'dtype' is F16"),
    case("meta.json says F16, read unverified", lambda r: (edit_meta(r, dtype="F16"), FeatureCache(r, verify="none")[0]), CacheError, r"row 1 \(clip 'clip-0'\): visual in .* has dtype torch\.float32 but meta\.json 'dtype' is F16"),
    case("meta.json split size", lambda r: (edit_meta(r, splits={"train": 5, "test": 1}), FeatureCache(r)), CacheError, r"meta\.json: splits\['train'\] is 5 but manifest\.jsonl has 2 train rows"),
    case("meta.json split missing", lambda r: (edit_meta(r, splits={"train": 2}), FeatureCache(r)), CacheError, r"splits\['test'\] is 0 but manifest\.jsonl has 1 test rows"),
    case("meta.json unknown split", lambda r: (edit_meta(r, splits={"train": 2, "test": 1, "dev": 0}), FeatureCache(r)), CacheError, r"meta\.json: 'splits' must map split names"),
    case("meta.json clip count", lambda r: (edit_meta(r, shards=lambda m: m["shards"]["shards/train-00000.safetensors"].update(clips=7)), FeatureCache(r)), CacheError, r"meta\.json: shards\['shards/train-00000\.safetensors'\] records 7 clips but manifest\.jsonl names it in 2 rows"),
    case("meta.json n_frames -7", lambda r: (edit_meta(r, n_frames=-7), FeatureCache(r)), CacheError, r"meta\.json: 'n_frames' must be a positive int or null, got -7"),
    case("meta.json n_frames '2'", lambda r: (edit_meta(r, n_frames="2"), FeatureCache(r)), CacheError, r"'n_frames' must be a positive int or null, got '2'"),
    case("shard record not an object", lambda r: (edit_meta(r, shards=lambda m: shard_record(m, "big")), FeatureCache(r)), CacheError, r"meta\.json: shards\['shards/train-00000\.safetensors'\] must be an object .* got 'big'"),
    case("shard record bytes -1", lambda r: (edit_meta(r, shards=lambda m: m["shards"]["shards/train-00000.safetensors"].update(bytes=-1)), FeatureCache(r)), CacheError, r"\['bytes'\] must be an int >= 0, got -1"),
    case("shard record sha256 short", lambda r: (edit_meta(r, shards=lambda m: m["shards"]["shards/train-00000.safetensors"].update(sha256="abc")), FeatureCache(r)), CacheError, r"\['sha256'\] must be 64 hex digits, got 'abc'"),
    case("meta.json tokenizer 5", lambda r: (edit_meta(r, tokenizer=5), FeatureCache(r)), CacheError, r"'tokenizer' must be a string or null, got 5"),
    case("empty AV reference", lambda r: (edit_row(r, 2, refs_av=["a dog", ""]), FeatureCache(r)), CacheError, r"manifest\.jsonl row 2 \(clip 'clip-1'\): refs_av must be a list of non-empty strings, got \['a dog', ''\]"),
    case("blank visual reference", lambda r: (edit_row(r, 3, refs_v=["  "]), FeatureCache(r)), CacheError, r"row 3 \(clip 'clip-2'\): refs_v must be a list of non-empty strings"),
    case("row info not an object", lambda r: (edit_row(r, 1, info="x"), FeatureCache(r)), CacheError, r"row 1 \(clip 'clip-0'\): info must be an object, got 'x'"),
    case("role annotation longer than the tokens", lambda r: (edit_shard(r, "clip-0/visual_role", torch.zeros(5, dtype=torch.int8)), FeatureCache(r)), CacheError, r"row 1 \(clip 'clip-0'\): clip-0/visual_role in .* must be an I8 tensor \[3\] \(one role per token\), got I8 \[5\]"),
    case("role annotation int64 in a shard", lambda r: (edit_shard(r, "clip-1/visual_role", torch.zeros(3, dtype=torch.int64)), FeatureCache(r, verify="none")[1]), CacheError, r"row 2 \(clip 'clip-1'\): visual_role in .* must be int8 \[3\], got torch\.int64"),
    case("cache[True]", lambda r: FeatureCache(r)[True], TypeError, "clip index must be an int, got bool: True"),
    case("cache[1.0]", lambda r: FeatureCache(r)[1.0], TypeError, "clip index must be an int, got float: 1.0"),
    case("cache['clip-0']", lambda r: FeatureCache(r)["clip-0"], TypeError, r"clip index must be an int, got str: 'clip-0' \(use \.get\(clip_id\)"),
    case("cache[3]", lambda r: FeatureCache(r)[3], IndexError, "clip index 3 out of range for 3 clips"),
    case("split[False]", lambda r: FeatureCache(r).split("train")[False], TypeError, r"index into split 'train' must be an int, got bool"),
    case("max_open_shards=0", lambda r: FeatureCache(r, max_open_shards=0), ValueError, "max_open_shards must be >= 1, got 0"),
    case("max_open_shards=-1", lambda r: FeatureCache(r, max_open_shards=-1), ValueError, "max_open_shards must be >= 1, got -1"),
    case("expected_dim='4'", lambda r: FeatureCache(r, expected_dim="4"), TypeError, r"expected_dim must be an int, got str: '4'"),
    case("expected_dim=0", lambda r: FeatureCache(r, expected_dim=0), ValueError, "expected_dim must be >= 1, got 0"),
    case("expected_dim=8", lambda r: FeatureCache(r, expected_dim=8), CacheError, r"meta\.json: feature dim is 4 but 8 was expected \(expected_dim\)"),
    case("verify='full'", lambda r: FeatureCache(r, verify="full"), ValueError, r"verify must be one of \['hash', 'header', 'none'\], got 'full'"),
    case("split 'dev'", lambda r: FeatureCache(r).split("dev"), ValueError, r"split must be one of .* got 'dev'"),
    case("split with no rows", lambda r: FeatureCache(r).split("val"), CacheError, r"no rows with split 'val'"),
    case("get unknown clip", lambda r: FeatureCache(r).get("clip-9"), KeyError, r"clip_id 'clip-9' is not in"),
    case("a flipped bit in a shard", lambda r: FeatureCache(flip_bit(r)).verify_shards(), CacheError, r"train-00000\.safetensors: corrupted shard, SHA-256 differs from meta\.json \(named by .*row 1 \(clip 'clip-0'\)\)"),
    case("a flipped bit in a shard the clips read", lambda r: FeatureCache(flip_bit(r, "test-00000")).verify_shards([2]), CacheError, r"test-00000\.safetensors: corrupted shard, SHA-256 differs"),
    case("verify_shards of clip 3 of 3", lambda r: FeatureCache(r).verify_shards([3]), IndexError, "clip index 3 out of range for 3 clips"),
    case("FeatureCache(None)", lambda r: FeatureCache(None), TypeError, r"root must be the path of a feature cache directory \(a str or Path\), got NoneType: None"),
    case("meta.json names a tokenizer folder that is missing", lambda r: (edit_meta(r, tokenizer="tokenizer"), FeatureCache(r).check_tokenizer()), CacheError, r"meta\.json names tokenizer 'tokenizer', but the cache has no tokenizer/ \(.*tokenizer is missing\), and it is not a local path or a model in the Hugging Face cache either"),
    case("meta.json names a tokenizer folder that is broken", lambda r: (edit_meta(r, tokenizer="shards"), FeatureCache(r).check_tokenizer()), CacheError, r"meta\.json: tokenizer 'shards' can't be loaded from the cache"),
]


@pytest.mark.parametrize("call,error,match", READER_CASES)
def test_bad_cache_is_refused_naming_file_row_and_clip(cache_root, call, error, match):
    raises(lambda: call(cache_root), error, match)


def add(root, **overrides):
    """One CacheWriter.add with ``overrides``; the writer is aborted, nothing is written."""
    def call():
        writer = CacheWriter(root, dim=DIM)
        kwargs = dict(clip_id="c", split="train", visual=torch.randn(3, DIM),
                      audio=torch.randn(2, DIM), refs_av=["a dog barks"],
                      prompt_prefix_ids=[1], prompt_suffix_ids=[2])
        kwargs.update(overrides)
        try:
            writer.add(**kwargs)
        finally:
            writer.abort()
    return call


WRITER_CASES = [
    case("NaN visual feature", lambda r: add(r, visual=bad_value((3, DIM), NAN))(), ValueError, r"visual for clip 'c' holds NaN or inf once stored as torch\.float32 \(token 1\)"),
    case("inf audio feature", lambda r: add(r, audio=bad_value((2, DIM), -INF, (0, 1)))(), ValueError, r"audio for clip 'c' holds NaN or inf .*\(token 0\)"),
    case("float32 past float16's range", lambda r: (CacheWriter(r, dim=DIM, dtype=torch.float16).add("c", "train", torch.full((1, DIM), 1e6), torch.randn(1, DIM), refs_av=["x"], prompt_prefix_ids=[1], prompt_suffix_ids=[2])), ValueError, r"holds NaN or inf once stored as torch\.float16"),
    case("NaN prompt embedding", lambda r: add(r, prompt_suffix_ids=None, prompt_suffix_embeds=bad_value((2, 6), NAN, (0, 0)))(), ValueError, r"prompt_suffix_embeds for clip 'c' holds NaN or inf"),
    case("role 300 overflows int8", lambda r: add(r, annotations={"visual_role": [0, 300, 1]})(), ValueError, r"annotation visual_role for clip 'c' is stored as int8 and must lie in \[-128, 127\], got 300"),
    case("role -129", lambda r: add(r, annotations={"audio_role": [-129, 0]})(), ValueError, r"audio_role .* got -129"),
    case("more roles than tokens", lambda r: add(r, annotations={"visual_role": [0, 1, 2, 3]})(), ValueError, r"annotation visual_role for clip 'c' must have one value per token \(\[3\]\), got shape \[4\]"),
    case("float roles", lambda r: add(r, annotations={"audio_role": [0.5, 1.0]})(), TypeError, r"annotation audio_role for clip 'c' must hold integers, got torch\.float32"),
    case("empty reference", lambda r: add(r, refs_av=["ok", ""])(), ValueError, "refs_av for clip 'c' must be a list of non-empty strings"),
    case("negative prompt id", lambda r: add(r, prompt_prefix_ids=[3, -1])(), ValueError, r"prompt_prefix_ids for clip 'c' must be token ids >= 0, got -1"),
    case("bool prompt ids", lambda r: add(r, prompt_prefix_ids=torch.tensor([True]))(), ValueError, r"prompt_prefix_ids for clip 'c' must be a 1-D integer sequence, got torch\.bool"),
    case("info a list", lambda r: add(r, info=[1])(), TypeError, "info for clip 'c' must be a dict, got list"),
    case("n_frames -7", lambda r: CacheWriter(r, dim=DIM, n_frames=-7), ValueError, "n_frames must be a positive int or None, got -7"),
    case("n_frames 2.0", lambda r: CacheWriter(r, dim=DIM, n_frames=2.0), ValueError, "n_frames must be a positive int or None, got 2.0"),
    case("tokenizer a Path-less int", lambda r: CacheWriter(r, dim=DIM, tokenizer=3), TypeError, "tokenizer must be a str or None, got int"),
    case("source a list", lambda r: CacheWriter(r, dim=DIM, source=["x"]), TypeError, "source must be a dict or None, got list"),
    case("dim '4'", lambda r: CacheWriter(r, dim="4"), ValueError, "dim must be a positive int, got '4'"),
]


@pytest.mark.parametrize("call,error,match", WRITER_CASES)
def test_writer_refuses_what_the_reader_would(tmp_path, call, error, match):
    raises(lambda: call(tmp_path / "new"), error, match)
    assert not (tmp_path / "new").exists()


def test_data_verify_fails_where_the_named_tokenizer_is_missing(cache_root, capsys):
    """``python -m avex.data verify`` used to report success without the tokenizer folder."""
    from avex.data.__main__ import main as data_main
    from badinput import exits_with_usage_error
    assert data_main(["verify", str(cache_root)]) == 0  # no tokenizer named: embeddings or ids
    assert "no tokenizer" in capsys.readouterr().out
    edit_meta(cache_root, tokenizer="tokenizer")
    exits_with_usage_error(data_main, ["verify", str(cache_root)],
                           r"names tokenizer 'tokenizer', but the cache has no tokenizer/",
                           capsys)


def test_data_verify_loads_the_tokenizer_inside_the_cache(tiny_benchmark, capsys):
    from avex.data.__main__ import main as data_main
    assert data_main(["verify", str(tiny_benchmark)]) == 0
    assert f"tokenizer {tiny_benchmark / 'tokenizer'} loads" in capsys.readouterr().out


def test_shards_are_hashed_once_per_cache_and_version(cache_root, monkeypatch):
    from avex.data.cache import reader as cache_module
    hashed = []
    real = cache_module.file_sha256
    monkeypatch.setattr(cache_module, "file_sha256", lambda path: hashed.append(path.name) or
                        real(path))
    line = FeatureCache(cache_root).verify_shards([0])  # clip 0: the train shard only
    assert hashed == ["train-00000.safetensors"] and "1 hashed now, 0 checked before" in line
    assert (cache_root / cache_module.STAMP_FILE).is_file()
    line = FeatureCache(cache_root).verify_shards()  # a new reader: only the test shard
    assert hashed[1:] == ["test-00000.safetensors"] and "1 hashed now, 1 checked before" in line
    assert "checked before" in FeatureCache(cache_root).verify_shards() and len(hashed) == 2
    # a shard rewritten since (a new mtime) is hashed again, and so is all under another version
    path = cache_root / "shards" / "test-00000.safetensors"
    path.write_bytes(path.read_bytes())
    FeatureCache(cache_root).verify_shards()
    assert hashed[2:] == ["test-00000.safetensors"]
    monkeypatch.setattr("avex.__version__", "0.0.0-other")
    FeatureCache(cache_root).verify_shards()
    assert len(hashed) == 5


def test_a_read_only_cache_is_verified_in_memory_and_says_so(cache_root, monkeypatch):
    from avex.data.cache import reader as cache_module

    def read_only(*args):
        raise PermissionError("read-only file system")
    monkeypatch.setattr(cache_module.os, "replace", read_only)
    cache = FeatureCache(cache_root)
    assert "in memory only: the cache can't be written" in cache.verify_shards()
    assert not list(cache_root.glob(".avex-verified*"))
    assert "checked before" in cache.verify_shards()  # the same reader doesn't hash again


def test_shards_without_a_recorded_hash_are_said_unverified(cache_root):
    edit_meta(cache_root, shards=lambda m: m["shards"]["shards/test-00000.safetensors"].pop(
        "sha256"))
    line = FeatureCache(cache_root).verify_shards()
    assert "1 shard(s) NOT verified: meta.json records no sha256 for shards/test-00000" in line


def test_sweep_on_a_flipped_bit_stops_before_it_writes(tiny_benchmark, tiny_captioner,
                                                      tmp_path):
    """It used to run to the end: its default check reads only the shards' headers."""
    import shutil
    from avex.evaluate.__main__ import main as evaluate_main
    data = flip_bit(shutil.copytree(tiny_benchmark, tmp_path / "bench"), "test-00000")
    with pytest.raises(CacheError, match=r"test-00000\.safetensors: corrupted shard, SHA-256"):
        evaluate_main(["sweep", "--data", str(data), "--captioner", str(tiny_captioner),
                       "--methods", "random", "--retentions", "0.5", "--max-clips", "2",
                       "--transfer-split", "none", "--no-progress", "--out",
                       str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
