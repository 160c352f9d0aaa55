"""``python -m avex.data build`` reports an existing benchmark as built only when it was built
with the settings asked for; a cache's meta.json must record the one token order the reader
reads."""
import json
import re
import shutil

import pytest

from avex.data.__main__ import main as data_main
from avex.data.cache import CacheError, FeatureCache
from avex.data.embedded import ensure_benchmark
from badinput import exits_with_usage_error


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("build") / "tiny"
    assert data_main(["build", "--preset", "tiny", "--out", str(out), "--no-progress"]) == 0
    return out


def test_the_same_build_is_reported_as_built(built, capsys):
    assert data_main(["build", "--preset", "tiny", "--out", str(built), "--no-progress"]) == 0
    assert "benchmark already built at" in capsys.readouterr().out


@pytest.mark.parametrize("flags, match", [
    (["--preset", "tiny", "--seed", "1"], r"seed 0 there, 1 asked"),
    (["--preset", "tiny", "--dim", "48"], r"dim 32 there, 48 asked"),
    ([], r"preset 'tiny' there, 'default' asked\).*dim 32 there, 64 asked"),
], ids=["seed", "dim", "preset"])
def test_a_build_with_other_settings_is_refused(built, flags, match, capsys):
    before = (built / "meta.json").read_bytes()
    exits_with_usage_error(
        data_main, ["build", *flags, "--out", str(built), "--no-progress"],
        r"--out: '.*tiny' holds an embedded benchmark built with other settings .*" + match
        + r".*pass --overwrite to replace it, or choose another --out", capsys)
    assert (built / "meta.json").read_bytes() == before


def test_a_folder_with_some_meta_json_is_refused(tmp_path, capsys):
    (tmp_path / "meta.json").write_text('{"x": 1}', encoding="utf-8")
    exits_with_usage_error(
        data_main, ["build", "--preset", "tiny", "--out", str(tmp_path), "--no-progress"],
        r"--out: .* holds a meta.json that records no embedded benchmark .*not an embedded "
        r"benchmark; choose another --out", capsys)


def test_the_default_path_holding_other_settings_is_refused(built, tmp_path, capsys):
    # a default path that holds another build (a hand-copied folder): never reported as built
    path = ensure_benchmark("tiny", cache_dir=str(tmp_path), progress=False)
    shutil.rmtree(path)
    shutil.copytree(built, path)
    meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
    meta["source"]["config"]["noise"] = 0.5
    (path / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    exits_with_usage_error(
        data_main, ["build", "--preset", "tiny", "--cache-dir", str(tmp_path), "--no-progress"],
        r"--cache-dir: .*noise 0.5 there, 0.06 asked", capsys)
    with pytest.raises(ValueError, match=r"noise 0.5 there, 0.06 asked"):
        ensure_benchmark("tiny", cache_dir=str(tmp_path), progress=False)
    # other split sizes only (an earlier build's 200 val / test clips): the same world, which
    # training keeps using; the build command, asked for these sizes, says it differs
    meta["source"]["config"].update(noise=0.06, test=3)
    (path / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    assert ensure_benchmark("tiny", cache_dir=str(tmp_path), progress=False) == path
    exits_with_usage_error(
        data_main, ["build", "--preset", "tiny", "--cache-dir", str(tmp_path), "--no-progress"],
        r"test 3 there, \d+ asked", capsys)


@pytest.mark.parametrize("order", [["audio", "video"], None, "video,audio", ["video"]],
                         ids=["audio-first", "null", "a string", "video only"])
def test_a_token_order_the_reader_does_not_read_is_refused(built, tmp_path, order, capsys):
    cache = tmp_path / "cache"
    shutil.copytree(built, cache)
    meta = json.loads((cache / "meta.json").read_text(encoding="utf-8"))
    assert meta["token_order"] == ["video", "audio"]
    meta["token_order"] = order
    (cache / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    match = r"meta\.json: 'token_order' must be \['video', 'audio'\].*got " + re.escape(
        repr(order))
    with pytest.raises(CacheError, match=match):
        FeatureCache(cache)
    exits_with_usage_error(data_main, ["verify", str(cache)], match, capsys)


def test_the_size_estimate_is_what_a_build_writes(built):
    """The estimate the disk check uses is within 15% of the tiny build's bytes on disk."""
    from avex.data.embedded import estimated_bytes, resolve_config
    written = sum(p.stat().st_size for p in built.rglob("*") if p.is_file())
    assert abs(estimated_bytes(resolve_config("tiny")) - written) < 0.15 * written, written


def test_a_build_that_would_not_fit_on_the_disk_is_refused_before_any_file(tmp_path, capsys,
                                                                          monkeypatch):
    import types

    import avex.data.__main__ as data_cli
    monkeypatch.setattr(data_cli.shutil, "disk_usage",
                        lambda path: types.SimpleNamespace(total=10**9, used=10**9, free=1000))
    out = tmp_path / "a" / "big"
    exits_with_usage_error(
        data_main, ["build", "--preset", "tiny", "--train", "100000", "--out", str(out),
                    "--no-progress"],
        r"--out: the build writes about \d+\.\d\d GB \(100\d+ clips of \d+ tokens x 32 "
        r"float32\) under .*big, whose disk has 0\.00 GB free; build fewer clips \(--train, "
        r"--val, --test, --transfer\), or choose another --out", capsys)
    assert not (tmp_path / "a").exists()
