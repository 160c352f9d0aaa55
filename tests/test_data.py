"""The feature-cache format (round trip, corruption errors) and the embedded benchmark
(determinism, layout, statistics)."""
import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from avex.data import (CacheError, CacheWriter, FeatureCache, build_benchmark, ensure_benchmark,
                       resolve_config)
from avex.data import world
from avex.data.__main__ import main as data_cli
from avex.data.embedded import (IN_DOMAIN, TRANSFER, Backbone, build_tokenizer, sample_clip,
                                 synthesize)
from badinput import exits_with_usage_error


# ------------------------------------------------------------------------------------------------
# a hand-written cache
# ------------------------------------------------------------------------------------------------

def write_cache(root, *, dim=8, dtype=torch.float32, clips_per_shard=2, n=5):
    """A small cache with every optional piece (annotations, prompt embeddings, info)."""
    gen = torch.Generator().manual_seed(0)
    expected = {}
    with CacheWriter(root, dim=dim, n_frames=4, dtype=dtype, tokenizer="my/tokenizer",
                     source={"kind": "test"}, clips_per_shard=clips_per_shard) as writer:
        for i in range(n):
            split = ["train", "train", "val", "test", "transfer"][i % 5]
            nv, na = 4 + i, 2 + (i % 3)
            visual = torch.randn(nv, dim, generator=gen).to(dtype)
            audio = torch.randn(na, dim, generator=gen).to(dtype)
            kwargs = dict(refs_av=[f"clip {i} av {j}" for j in range(5)],
                          refs_v=[f"v {i}"] if i % 2 == 0 else [],
                          refs_a=[f"a {i}", "another"],
                          prompt_prefix_ids=torch.arange(i + 1),
                          info={"index": i, "nested": {"x": [1, 2]}},
                          annotations={"visual_role": torch.arange(nv) % 3})
            if i == 3:
                kwargs["prompt_suffix_embeds"] = torch.randn(3, 16, generator=gen)
            else:
                kwargs["prompt_suffix_ids"] = [7, 8, 9]
            writer.add(f"clip-{i}", split, visual, audio, **kwargs)
            expected[f"clip-{i}"] = (split, visual, audio, kwargs)
    return expected


def test_round_trip_is_exact(tmp_path):
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        root = tmp_path / str(dtype)
        expected = write_cache(root, dtype=dtype)
        cache = FeatureCache(root, verify="hash")
        cache.verify_all()
        assert cache.meta.dim == 8 and cache.meta.n_frames == 4
        assert cache.meta.tokenizer == "my/tokenizer" and cache.tokenizer_path() == "my/tokenizer"
        assert sorted(cache.clip_ids) == sorted(expected)
        for clip_id, (split, visual, audio, kwargs) in expected.items():
            clip = cache.get(clip_id)
            assert clip.split == split
            assert clip.visual.dtype == dtype and torch.equal(clip.visual, visual)
            assert torch.equal(clip.audio, audio)
            assert clip.refs_av == kwargs["refs_av"] and clip.refs_v == kwargs["refs_v"]
            assert clip.refs_a == kwargs["refs_a"] and clip.info == kwargs["info"]
            assert torch.equal(clip.prompt_prefix_ids, kwargs["prompt_prefix_ids"])
            if "prompt_suffix_embeds" in kwargs:
                assert clip.prompt_suffix_ids is None
                assert torch.equal(clip.prompt_suffix_embeds,
                                   kwargs["prompt_suffix_embeds"].to(dtype))
            else:
                assert clip.prompt_suffix_ids.tolist() == [7, 8, 9]
            assert torch.equal(clip.annotations["visual_role"],
                               kwargs["annotations"]["visual_role"].to(torch.int8))
    split = cache.split("train")
    assert len(split) == 2 and [c.clip_id for c in split] == split.clip_ids
    assert split.references("a")[0] == ["a 0", "another"]


def test_writer_rejects_bad_input(tmp_path):
    with CacheWriter(tmp_path / "c", dim=4) as writer:
        ok = dict(refs_av=["a"], prompt_prefix_ids=[1], prompt_suffix_ids=[2])
        with pytest.raises(ValueError, match=r"visual for clip 'x' must be a float tensor \[N, 4\]"
                                             r", got \[3, 5\]"):
            writer.add("x", "train", torch.zeros(3, 5), torch.zeros(2, 4), **ok)
        with pytest.raises(ValueError, match="split must be one of"):
            writer.add("x", "dev", torch.zeros(3, 4), torch.zeros(2, 4), **ok)
        with pytest.raises(ValueError, match="clip_id must match"):
            writer.add("a/b", "train", torch.zeros(3, 4), torch.zeros(2, 4), **ok)
        with pytest.raises(ValueError, match=r"refs_av for clip 'x' must be a list of "
                                             r"non-empty strings, got \[''\]"):
            writer.add("x", "train", torch.zeros(3, 4), torch.zeros(2, 4),
                       **{**ok, "refs_av": [""]})
        with pytest.raises(ValueError, match="refs_av for clip 'x' must be a list of non-empty"):
            writer.add("x", "train", torch.zeros(3, 4), torch.zeros(2, 4),
                       **{**ok, "refs_av": "a dog"})
        with pytest.raises(ValueError, match="exactly one of prompt_suffix_ids"):
            writer.add("x", "train", torch.zeros(3, 4), torch.zeros(2, 4), refs_av=["a"],
                       prompt_prefix_ids=[1])
        writer.add("x", "train", torch.zeros(3, 4), torch.zeros(2, 4), **ok)
        with pytest.raises(ValueError, match="clip_id 'x' was already added"):
            writer.add("x", "train", torch.zeros(3, 4), torch.zeros(2, 4), **ok)
    with pytest.raises(FileExistsError, match="already exists"):
        CacheWriter(tmp_path / "c", dim=4)
    with pytest.raises(ValueError, match="dim must be a positive int, got 0"):
        CacheWriter(tmp_path / "d", dim=0)


def test_overwrite_replaces_only_a_cache(tmp_path, monkeypatch):
    """overwrite=True replaces a feature cache, and nothing else: a folder of other files, the
    working directory and the home directory (or a folder holding them) are refused before
    anything is written, and left as they were."""
    def write(root, overwrite=True):
        with CacheWriter(root, dim=4, overwrite=overwrite) as writer:
            writer.add("x", "train", torch.zeros(3, 4), torch.zeros(2, 4), refs_av=["a"],
                       prompt_prefix_ids=[1], prompt_suffix_ids=[2])

    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match=r"'.*notes' exists and is not a feature cache"):
        write(notes)
    assert (notes / "todo.txt").read_text() == "keep me"
    monkeypatch.chdir(notes)
    with pytest.raises(FileExistsError, match=r"cache directory '\.' is the working directory"):
        write(Path("."))
    monkeypatch.chdir(tmp_path.parent)
    monkeypatch.setenv("HOME", str(notes))
    with pytest.raises(FileExistsError, match=r"is the home directory or holds it"):
        write(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes"]
    assert (notes / "todo.txt").read_text() == "keep me"

    write(tmp_path / "cache")
    write(tmp_path / "cache")                    # a cache is replaced
    with pytest.raises(FileExistsError,
                       match=r"already exists \(a feature cache\); pass overwrite=True"):
        write(tmp_path / "cache", overwrite=False)
    (tmp_path / "empty").mkdir()
    write(tmp_path / "empty", overwrite=False)   # an empty folder is no loss
    assert FeatureCache(tmp_path / "empty").clip_ids == ["x"]


def test_a_failed_close_leaves_no_staging_folder(tmp_path):
    """A folder that appears at root while the cache is written is not replaced, and the
    writer's temporary folder goes with the error."""
    with pytest.raises(FileExistsError, match="appeared while writing: .* is not a feature cache"):
        with CacheWriter(tmp_path / "c", dim=4) as writer:
            writer.add("x", "train", torch.zeros(3, 4), torch.zeros(2, 4), refs_av=["a"],
                       prompt_prefix_ids=[1], prompt_suffix_ids=[2])
            (tmp_path / "c").mkdir()
            (tmp_path / "c" / "mine.txt").write_text("mine")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]
    assert [p.name for p in (tmp_path / "c").iterdir()] == ["mine.txt"]


def test_failed_write_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with CacheWriter(tmp_path / "c", dim=4) as writer:
            writer.add("x", "train", torch.zeros(3, 4), torch.zeros(2, 4), refs_av=["a"],
                       prompt_prefix_ids=[1], prompt_suffix_ids=[2])
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_writer_owns_what_it_is_given(tmp_path):
    """The same prompt tensor for every clip, features sliced from one tensor, and a tensor the
    caller changes after add: the writer keeps its own copies (safetensors refuses entries that
    share memory, which used to fail at close and write nothing)."""
    prompt, suffix = torch.tensor([1, 2, 3]), torch.tensor([4])
    features = torch.randn(10, 4)
    with CacheWriter(tmp_path / "c", dim=4, clips_per_shard=8) as writer:
        for i in range(3):
            writer.add(f"clip-{i}", "train", features[i:i + 2], features[5:8],
                       refs_av=["a"], prompt_prefix_ids=prompt, prompt_suffix_ids=suffix)
        writer.add_merged("merged", "train", features[:4], torch.tensor([2, 0, 1, 2]),
                          refs_av=["a"])
        expected = features.clone()
        features.zero_()   # after add: what was added is what is written
    cache = FeatureCache(tmp_path / "c", verify="hash")
    for i in range(3):
        clip = cache.get(f"clip-{i}")
        assert torch.equal(clip.visual, expected[i:i + 2])
        assert torch.equal(clip.prompt_prefix_ids, prompt)
    assert torch.equal(cache.get("merged").merged["inputs_embeds"], expected[:4])


# ------------------------------------------------------------------------------------------------
# corruption: every case names the file and, where a row is at fault, the row
# ------------------------------------------------------------------------------------------------

@pytest.fixture
def cache_root(tmp_path):
    root = tmp_path / "cache"
    write_cache(root)
    return root


def manifest_rows(root):
    return [json.loads(line) for line in (root / "manifest.jsonl").read_text().splitlines()]


def rewrite_manifest(root, rows):
    (root / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_shard_lists_its_tensors_once_however_many_clips_are_read(cache_root, monkeypatch):
    """The reader keeps each open shard's tensor names: listing them per lookup made reading a
    split quadratic in the clips a shard holds (4.9 s for benchmark 0's 1661 train clips)."""
    from avex.data.cache import reader

    listed = Counter()
    opener = reader.safe_open

    class Counting:
        def __init__(self, path, **kwargs):
            self.path, self.inner = path, opener(path, **kwargs)

        def keys(self):
            listed[self.path] += 1
            return self.inner.keys()

        def get_tensor(self, name):
            return self.inner.get_tensor(name)

    monkeypatch.setattr(reader, "safe_open", Counting)
    cache = FeatureCache(cache_root)
    clips = [cache.get(clip_id) for clip_id in cache.clip_ids for _ in range(3)]
    assert len(clips) == 3 * len(cache.clip_ids) and listed
    assert set(listed.values()) == {1}


def test_missing_shard(cache_root):
    (cache_root / "shards" / "val-00000.safetensors").unlink()
    with pytest.raises(CacheError, match=r"shards/val-00000\.safetensors: shard missing \(named "
                                         r"by .*manifest\.jsonl row 3 \(clip 'clip-2'\)\)"):
        FeatureCache(cache_root)


def test_truncated_shard(cache_root):
    path = cache_root / "shards" / "train-00000.safetensors"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(CacheError, match=r"train-00000\.safetensors: shard is \d+ bytes but "
                                         r"meta\.json records \d+ .*row 1 \(clip 'clip-0'\)"):
        FeatureCache(cache_root)


def test_garbage_shard_not_listed_in_meta(cache_root):
    meta = json.loads((cache_root / "meta.json").read_text())
    meta["shards"] = {}  # listing shards is optional, so only the header check can catch this
    (cache_root / "meta.json").write_text(json.dumps(meta))
    (cache_root / "shards" / "test-00000.safetensors").write_bytes(b"\x10\x00" + b"x" * 40)
    with pytest.raises(CacheError, match=r"test-00000\.safetensors: corrupted shard, header .*"
                                         r"row 4 \(clip 'clip-3'\)"):
        FeatureCache(cache_root)


def test_flipped_data_byte_is_caught_by_hash(cache_root):
    path = cache_root / "shards" / "transfer-00000.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # inside the tensor data: headers and sizes still agree
    path.write_bytes(bytes(data))
    cache = FeatureCache(cache_root)  # the default check reads headers only
    assert cache.get("clip-0").n_visual == 4
    with pytest.raises(CacheError, match=r"transfer-00000\.safetensors: corrupted shard, SHA-256 "
                                         r"differs .*row 5 \(clip 'clip-4'\)"):
        FeatureCache(cache_root, verify="hash").get("clip-4")


def test_row_disagreeing_with_its_shard(cache_root):
    rows = manifest_rows(cache_root)
    rows[1]["n_audio"] = 9
    rewrite_manifest(cache_root, rows)
    with pytest.raises(CacheError, match=r"manifest\.jsonl row 2 \(clip 'clip-1'\): manifest says "
                                         r"n_audio=9 but clip-1/audio in .* has 3 tokens"):
        FeatureCache(cache_root)


def test_row_pointing_at_the_wrong_shard(cache_root):
    rows = manifest_rows(cache_root)
    rows[2]["shard"] = rows[0]["shard"]
    rewrite_manifest(cache_root, rows)
    with pytest.raises(CacheError, match=r"row 3 \(clip 'clip-2'\): shard .*train-00000"
                                         r"\.safetensors has no tensor 'clip-2/visual'"):
        FeatureCache(cache_root)


def test_wrong_feature_dim(cache_root):
    path = cache_root / "shards" / "test-00000.safetensors"
    save_file({"clip-3/visual": torch.zeros(7, 5), "clip-3/audio": torch.zeros(2, 5),
               "clip-3/prompt_prefix_ids": torch.zeros(4, dtype=torch.int64),
               "clip-3/prompt_suffix_embeds": torch.zeros(3, 16)}, str(path))
    meta = json.loads((cache_root / "meta.json").read_text())
    meta["shards"].pop("shards/test-00000.safetensors")
    (cache_root / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(CacheError, match=r"row 4 \(clip 'clip-3'\): clip-3/visual in .*test-00000"
                                         r"\.safetensors has shape \[7, 5\] but the feature dim "
                                         r"is 8"):
        FeatureCache(cache_root)
    with pytest.raises(CacheError, match=r"meta\.json: feature dim is 8 but 64 was expected"):
        FeatureCache(cache_root, verify="none", expected_dim=64)


@pytest.mark.parametrize("mutate,match", [
    (lambda rows: rows.__setitem__(2, "{not json"), r"manifest\.jsonl row 3: not valid JSON"),
    (lambda rows: rows[1].pop("refs_av"),
     r"row 2 \(clip 'clip-1'\): missing field\(s\) \['refs_av'\]"),
    (lambda rows: rows[4].__setitem__("split", "dev"),
     r"row 5 \(clip 'clip-4'\): split must be one of"),
    (lambda rows: rows[3].__setitem__("clip_id", "clip-0"),
     r"row 4 \(clip 'clip-0'\): duplicate clip_id \(first on row 1\)"),
    (lambda rows: rows[0].__setitem__("shard", "../elsewhere.safetensors"),
     r"row 1 \(clip 'clip-0'\): shard must be a path inside the cache"),
])
def test_bad_manifest_rows(cache_root, mutate, match):
    rows = manifest_rows(cache_root)
    mutate(rows)
    (cache_root / "manifest.jsonl").write_text(
        "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    with pytest.raises(CacheError, match=match):
        FeatureCache(cache_root)


def test_missing_meta_and_bad_version(tmp_path, cache_root):
    with pytest.raises(CacheError, match="no such cache directory"):
        FeatureCache(tmp_path / "nowhere")
    meta = json.loads((cache_root / "meta.json").read_text())
    (cache_root / "meta.json").write_text(json.dumps({**meta, "version": 99}))
    with pytest.raises(CacheError, match=r"meta\.json: format version 99 is not supported"):
        FeatureCache(cache_root)
    (cache_root / "meta.json").unlink()
    with pytest.raises(CacheError, match=r"meta\.json: missing"):
        FeatureCache(cache_root)


def test_verify_cli_reports_the_file(cache_root, capsys):
    # meta.json names "my/tokenizer": neither inside the cache nor anywhere, until it is saved
    exits_with_usage_error(data_cli, ["verify", str(cache_root)],
                           r"names tokenizer 'my/tokenizer', but the cache has no my/tokenizer/ "
                           r"\(.* is missing\)", capsys)
    assert "internet" not in capsys.readouterr().err
    build_tokenizer().save_pretrained(str(cache_root / "my" / "tokenizer"))
    assert data_cli(["verify", str(cache_root)]) == 0
    (cache_root / "shards" / "val-00000.safetensors").unlink()
    exits_with_usage_error(data_cli, ["verify", str(cache_root)],
                           "val-00000.safetensors: shard missing", capsys)


# ------------------------------------------------------------------------------------------------
# the embedded benchmark
# ------------------------------------------------------------------------------------------------

def all_bytes(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_build_is_byte_identical_for_a_seed(tmp_path):
    cfg = resolve_config("tiny")
    a = build_benchmark(tmp_path / "a", cfg, preset="tiny", progress=False)
    b = build_benchmark(tmp_path / "b", cfg, preset="tiny", progress=False)
    files_a, files_b = all_bytes(a), all_bytes(b)
    assert files_a == files_b and any(k.startswith("shards/") for k in files_a)
    c = build_benchmark(tmp_path / "c", resolve_config("tiny", seed=1), preset="tiny",
                        progress=False)
    assert all_bytes(c)["shards/train-00000.safetensors"] != files_a[
        "shards/train-00000.safetensors"]


def test_tiny_benchmark_layout(tmp_path):
    from transformers import AutoTokenizer

    path = ensure_benchmark("tiny", cache_dir=tmp_path, progress=False)
    assert path == tmp_path / "benchmarks" / "embedded-tiny-seed0"
    assert ensure_benchmark("tiny", cache_dir=tmp_path, progress=False) == path  # no rebuild
    cfg = resolve_config("tiny")
    cache = FeatureCache(path, verify="hash")
    cache.verify_all()
    assert cache.meta.splits == {"train": cfg.train, "val": cfg.val, "test": cfg.test,
                                 "transfer": cfg.transfer}
    tokenizer = AutoTokenizer.from_pretrained(cache.tokenizer_path())
    for clip in cache:
        assert clip.visual.shape == (cfg.n_visual, cfg.dim)
        assert clip.audio.shape == (cfg.n_audio, cfg.dim)
        assert len(clip.refs_av) == len(clip.refs_v) == len(clip.refs_a) == 5
        assert tokenizer.decode(clip.prompt_suffix_ids) == world.PROMPT_SUFFIX
        for ref in clip.refs_av + clip.refs_v + clip.refs_a:  # every word is in the vocabulary
            assert tokenizer.unk_token_id not in tokenizer(ref)["input_ids"]
    assert not list(tmp_path.glob("benchmarks/.*"))  # no staging directory left behind


def test_bad_benchmark_settings():
    with pytest.raises(ValueError, match=r"unknown benchmark setting\(s\) \['frames'\]"):
        resolve_config("tiny", frames=3)
    with pytest.raises(ValueError, match="preset must be one of"):
        resolve_config("huge")
    with pytest.raises(ValueError, match="grid must be a positive int, got 0"):
        resolve_config("tiny", grid=0)


def sample_specs(stats, n=600, seed=5):
    cfg = resolve_config("default")
    bb = Backbone(seed, cfg.dim, cfg.grid, cfg.n_frames, cfg.n_audio)
    out = []
    for i in range(n):
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, i])))
        spec = sample_clip(rng, cfg, stats)
        out.append((spec, *synthesize(rng, cfg, stats, bb, spec)))
    return cfg, out


def test_generated_statistics():
    """Silent and music-heavy clips occur; audio events are short and sparse; the subject
    persists across frames; the transfer split's statistics differ."""
    cfg, clips = sample_specs(IN_DOMAIN)
    kinds = Counter(spec.audio_kind for spec, *_ in clips)
    assert 0.06 < kinds["silent"] / len(clips) < 0.2 and kinds["music"] / len(clips) > 0.1
    event_share = np.mean([float((a_role == 1).float().mean()) for *_, a_role in clips])
    assert 0.05 < event_share < 0.3
    for spec, visual, audio, v_role, a_role in clips:
        if spec.audio_kind == "silent":
            assert not (a_role == 1).any() and spec.events == []
        frames_with_subject = (v_role.reshape(cfg.n_frames, -1) == 1).any(1).sum()
        assert frames_with_subject >= 2
    _, shifted = sample_specs(TRANSFER)
    shifted_kinds = Counter(spec.audio_kind for spec, *_ in shifted)
    assert shifted_kinds["music"] > 1.5 * kinds["music"]
    assert np.mean([float(v.norm(dim=1).mean()) for _, v, *_ in shifted]) != pytest.approx(
        np.mean([float(v.norm(dim=1).mean()) for _, v, *_ in clips]), rel=0.01)


def test_own_sound_fuses_the_verb_phrase():
    """Non-additivity in the references: the subject's own sound changes the verb phrase,
    the same sound from elsewhere becomes a background clause."""
    rng = np.random.Generator(np.random.PCG64(0))
    own = world.ClipSpec("park", "dog", "brown", "run", "events",
                         [world.EventSpan("bark", 2, 2, 1.0, True)])
    elsewhere = world.ClipSpec("park", "cat", "black", "sit", "events",
                               [world.EventSpan("bark", 2, 2, 1.0, False)])
    own_refs = [world.av_reference(own, rng) for _ in range(30)]
    other_refs = [world.av_reference(elsewhere, rng) for _ in range(30)]
    assert any("runs and barks" in r for r in own_refs)
    assert not any("a dog barks" in r for r in own_refs)
    assert any("while a dog barks" in r or "as a dog barks" in r for r in other_refs)
    assert len(set(own_refs)) > 5  # varied wording


def test_build_cli(tmp_path, capsys):
    out = tmp_path / "bench"
    assert data_cli(["build", "--preset", "tiny", "--train", "6", "--val", "2", "--test", "2",
                     "--transfer", "0", "--out", str(out), "--no-progress"]) == 0
    assert FeatureCache(out).meta.splits == {"train": 6, "val": 2, "test": 2}
    assert "built embedded-tiny-seed0-" in capsys.readouterr().out
    sizes = ["--train", "6", "--val", "2", "--test", "2", "--transfer", "0"]
    assert data_cli(["build", "--preset", "tiny", *sizes, "--out", str(out)]) == 0
    assert "already built" in capsys.readouterr().out
    # the default sizes are another build: not "already built" (it isn't)
    exits_with_usage_error(data_cli, ["build", "--preset", "tiny", "--out", str(out)],
                           r"train 6 there, 48 asked", capsys)
    shutil.rmtree(out)
    exits_with_usage_error(data_cli, ["info", str(out)], "no such cache directory", capsys)


def test_a_clip_without_references_is_a_legal_row(tmp_path):
    """A label-free clip (exported without captions) has refs_av [] in the manifest: written
    and read back as it is."""
    with CacheWriter(tmp_path / "c", dim=4) as writer:
        writer.add("x", "train", torch.zeros(3, 4), torch.zeros(2, 4), refs_av=[],
                   prompt_prefix_ids=[1], prompt_suffix_ids=[2])
    assert FeatureCache(tmp_path / "c")[0].refs_av == []


def clip_content(clip) -> tuple:
    """Everything a clip is made of, for a byte-for-byte comparison."""
    return (clip.clip_id, clip.visual.numpy().tobytes(), clip.audio.numpy().tobytes(),
            clip.refs_av, clip.refs_v, clip.refs_a, clip.prompt_prefix_ids.tolist(),
            clip.prompt_suffix_ids.tolist(), json.dumps(clip.info, sort_keys=True),
            {k: v.numpy().tobytes() for k, v in clip.annotations.items()})


def test_growing_the_scored_splits_keeps_their_first_clips_and_the_train_split(tmp_path):
    """Clips are seeded by (seed, split, index): a benchmark built with more val and test clips
    starts each split with the smaller build's clips, byte for byte, and has the same train
    split (so a captioner trained on the smaller one's train split is valid for both). This is
    what lets the default grow from 200 to 1000 scored clips without a new judge."""
    small = FeatureCache(build_benchmark(tmp_path / "small", resolve_config("tiny"),
                                         preset="tiny", progress=False))
    large = FeatureCache(build_benchmark(tmp_path / "large", resolve_config(
        "tiny", test=20, val=13), preset="tiny", progress=False))
    for split in ("train", "val", "test", "transfer"):
        before, after = small.split(split), large.split(split)
        assert [clip_content(c) for c in before] == \
            [clip_content(after[i]) for i in range(len(before))], split
    assert (len(large.split("test")), len(large.split("val"))) == (20, 13)
    assert len(large.split("train")) == len(small.split("train"))


def test_the_scored_splits_hold_1000_clips():
    for preset in ("default", "paper"):
        cfg = resolve_config(preset)
        assert (cfg.train, cfg.val, cfg.test, cfg.transfer) == (1661, 1000, 1000, 200)
