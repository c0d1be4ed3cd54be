"""webdataset's API beyond the basic chain, against webdataset 1.0.2 itself:
the methods and filters code written for webdataset calls, the composable
DataPipeline style, decoders, handler scopes, epochs made of several passes."""

from __future__ import annotations

import gc
import gzip
import io
import random
import tarfile
import threading
import warnings
from itertools import islice
from pathlib import Path
from typing import Any

import chute
import chute.wds as wds
import numpy as np
import pytest
import torch
import webdataset
from conftest import image_samples, jpeg_bytes, tiny_samples, write_shards
from helpers import assert_same


def both(urls: Any, build: Any, **kw: Any) -> tuple[list[Any], list[Any]]:
    ref = list(build(webdataset.WebDataset(urls, shardshuffle=False, **kw)))
    got = list(build(chute.WebDataset(urls, shardshuffle=False, **kw)))
    return ref, got


def chute_threads() -> int:
    import os

    count = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                count += f.read().startswith("chute-")
        except OSError:
            pass
    return count


def wait_for(condition: Any, limit: float = 10.0) -> bool:
    """Polls `condition` until it holds or `limit` seconds pass (a hang
    detector, not a timing assertion)."""
    import time

    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_shards(tmp_path_factory.mktemp("small"), tiny_samples(90, seed=2), per_shard=30)


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_shards(
        tmp_path_factory.mktemp("imgs"), image_samples(24, png_every=5), per_shard=12
    )


# ---------------------------------------------------------------- methods


def test_repeat_method_and_repeat_argument(small: list[str]) -> None:
    ref, got = both(small, lambda ds: ds.to_tuple("__key__").repeat(2))
    assert len(got) == 180 and assert_same(ref, got) is None
    ref, got = both(small, lambda ds: ds.to_tuple("__key__").batched(40).repeat(nbatches=5))
    assert [len(b[0]) for b in got] == [40, 40, 10, 40, 40]
    assert_same(ref, got)
    # chute's repeat=True (webdataset ignores it): one endless pass.
    endless = chute.WebDataset(small, shardshuffle=False, repeat=True).to_tuple("__key__")
    keys = [k for (k,) in islice(endless, 200)]
    assert keys[90:180] == keys[:90] and len(keys) == 200


def test_with_epoch_and_with_length_change_the_pipeline_itself(small: list[str]) -> None:
    ds = chute.WebDataset(small, shardshuffle=False).to_tuple("__key__")
    assert ds.with_epoch(7) is ds and len(list(ds)) == 7
    with pytest.warns(UserWarning, match="with_length"):
        assert ds.with_length(3) is ds
    assert len(ds) == 3 and ds.with_length(5, silent=True) is ds and len(ds) == 5
    with pytest.raises(TypeError):
        len(chute.WebDataset(small, shardshuffle=False))


def test_with_epoch_unbatched_and_python_stages_restart_per_pass(small: list[str]) -> None:
    def build(ds: Any) -> Any:
        return ds.to_tuple("__key__", "cls").map_tuple(None, int).batched(25).with_epoch(6)

    ref, got = both(small[:1], build)
    assert [len(b[0]) for b in got] == [25, 5, 25, 5, 25, 5]
    assert_same(ref, got)


def test_context_manager_closes_running_iterations(small: list[str]) -> None:
    baseline = chute_threads()
    with chute.WebDataset(small, shardshuffle=False, repeat=True).to_tuple("__key__") as ds:
        it = iter(ds)
        next(it)
        assert chute_threads() > baseline
    assert wait_for(lambda: chute_threads() == baseline)
    with pytest.raises(StopIteration):
        next(it)


@pytest.mark.parametrize(
    "build",
    [
        lambda ds: ds.slice(10),
        lambda ds: ds.slice(3, 40, 4),
        lambda ds: ds.listed(7),
        lambda ds: ds.decode().to_tuple("cls").listed(8).unlisted(),
        lambda ds: ds.rename_keys(label="cls", vector="np*"),
        lambda ds: ds.rename_keys(("label", "c?s"), keep_unselected=True),
        lambda ds: ds.extract_keys("*.cls", "*.npy"),
        lambda ds: ds.extract_keys("*.cls;*.txt"),
        lambda ds: ds.xdecode(cls=lambda s: int(s.read()), must_decode=False),
        lambda ds: ds.decode(only=["cls"]),
        lambda ds: ds.decode(only="npy"),
        lambda ds: ds.decode(post=[]),
        lambda ds: ds.decode(partial=True),
        lambda ds: ds.decode(wds.handle_extension("cls", lambda b: b"#" + b)),
        lambda ds: ds.decode().to_tuple("npy", "cls").batched(20).unbatched(),
        lambda ds: ds.decode().batched(20).unbatched(),
        lambda ds: ds.to_tuple("__key__", "nope", missing_is_error=False),
        lambda ds: ds.map(lambda s: None if s["__key__"].endswith("3") else s),
        lambda ds: ds.compose(wds.decode(), wds.to_tuple("cls")),
    ],
)
def test_methods_equal_webdataset(small: list[str], build: Any) -> None:
    ref, got = both(small, build)
    assert got
    for sample in ref + got:
        if isinstance(sample, dict):
            sample.pop("__local_path__", None)
    assert_same(ref, got)


def test_rsample_draws_like_webdataset(small: list[str]) -> None:
    ref_ds = webdataset.WebDataset(small, shardshuffle=False).rsample(0.5).to_tuple("__key__")
    got_ds = chute.WebDataset(small, shardshuffle=False).rsample(0.5).to_tuple("__key__")
    random.seed(17)
    ref = list(ref_ds)
    random.seed(17)
    got = list(got_ds)
    assert 10 < len(got) < 80 and got == ref
    assert len(list(chute.WebDataset(small, shardshuffle=False).rsample(0.0))) == 0


def _extra_of(key: str) -> dict[str, Any]:
    return {"extra": f"about {key}"} if key.endswith("7") else {"extra": None, "cls": -1}


def test_associate_adds_members_by_key_as_webdataset_does(small: list[str]) -> None:
    by_key = {"sample0000003": {"extra": 3.5}, "sample0000042": {"extra": [4, 2]}}
    for associator in (_extra_of, by_key):

        def stages(lib: Any, associator: Any = associator) -> list[Any]:
            return [lib.decode(), lib.associate(associator), lib.map(sorted_sample)]

        ref = list(composable(small, webdataset, *stages(webdataset)))
        got = list(composable(small, wds, *stages(wds)))
        assert len(got) == 90 and assert_same(ref, got) is None
        assert any("extra" in dict(s) for s in got)
        # The same stage after the fluent chain's native prefix.
        ref_fluent = webdataset.WebDataset(small, shardshuffle=False).decode()
        fluent = chute.WebDataset(small, shardshuffle=False).decode()
        assert_same(
            [sorted_sample(s) for s in ref_fluent.compose(webdataset.associate(associator))],
            [sorted_sample(s) for s in fluent.compose(wds.associate(associator))],
        )


def sorted_sample(sample: dict[str, Any]) -> list[tuple[str, Any]]:
    """A dict sample as (name, value) pairs, in name order, without the
    ``__local_path__`` that only chute's DataPipeline samples carry."""
    return sorted((k, v) for k, v in sample.items() if k != "__local_path__")


def test_log_keys_writes_webdataset_lines(small: list[str], tmp_path: Path) -> None:
    for module, name in ((webdataset, "ref.log"), (chute, "got.log")):
        list(module.WebDataset(small, shardshuffle=False).log_keys(str(tmp_path / name)))
    got = (tmp_path / "got.log").read_text()
    assert got == (tmp_path / "ref.log").read_text() and len(got.splitlines()) == 90


def test_mcached_replays_the_first_pass(small: list[str]) -> None:
    ds = chute.WebDataset(small, shardshuffle=False).decode().to_tuple("cls").mcached()
    first = list(ds)
    assert list(ds) == first and len(first) == 90


# ---------------------------------------------------------------- decoders


def test_failing_custom_decoder_raises_decoding_error(small: list[str]) -> None:
    def fails(key: str, data: bytes) -> Any:
        if key.endswith("cls"):
            raise KeyError("boom")
        return None

    with pytest.raises(wds.DecodingError) as info:
        list(chute.WebDataset(small, shardshuffle=False).decode(fails))
    assert isinstance(info.value.__cause__, KeyError)
    assert info.value.k == "cls" and info.value.key == "sample0000000"
    with pytest.raises(webdataset.DecodingError):
        list(webdataset.WebDataset(small, shardshuffle=False).decode(fails))
    # Under a handler the sample is skipped, as in webdataset.
    ref, got = both(small, lambda ds: ds.decode(fails, handler=wds.ignore_and_continue))
    assert ref == got == []


def test_native_decode_failures_are_decoding_errors_too(tmp_path: Path) -> None:
    samples = image_samples(6)
    samples[2]["jpg"] = b"\xff\xd8 not really a jpeg"
    urls = write_shards(tmp_path, samples, 6)
    with pytest.raises(wds.DecodingError) as info:
        list(chute.WebDataset(urls, shardshuffle=False).decode("rgb8").to_tuple("jpg"))
    err = info.value
    assert isinstance(err, chute.DataError) and isinstance(err, ValueError)
    assert (err.key, err.k) == ("img000002", "jpg") and err.url == urls[0]
    assert ": :" not in str(err) and "[" not in str(err) and err.where


def raw_tar(path: Path, members: list[tuple[str, bytes]]) -> str:
    """A tar with exactly these members (webdataset's TarWriter would
    compress ``.gz`` members itself)."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return str(path)


def test_gz_members_are_inflated_before_decoding(tmp_path: Path) -> None:
    members = []
    for i in range(4):
        members += [
            (f"s{i}.txt.gz", gzip.compress(f"hello {i}\n".encode())),
            (f"s{i}.json.gz", gzip.compress(b'{"a": 1}')),
            (f"s{i}.npy.gz", gzip.compress(_npy(np.arange(i + 1)))),
            (f"s{i}.cls", b"%d" % i),
        ]
    urls = [raw_tar(tmp_path / "gz.tar", members)]
    ref, got = both(urls, lambda ds: ds.decode())
    for s in ref + got:
        s.pop("__local_path__")
    assert got[1]["txt.gz"] == "hello 1\n" and got[2]["json.gz"] == {"a": 1}
    assert_same(ref, got)
    ref, got = both(urls, lambda ds: ds.decode().to_tuple("txt.gz", "npy.gz", "cls"))
    assert_same(ref, got)


def _npy(a: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, a)
    return out.getvalue()


def test_tenbin_members(tmp_path: Path) -> None:
    from webdataset import tenbin

    rng = np.random.default_rng(0)
    samples = [
        {
            "__key__": f"t{i}",
            "ten": bytes(
                tenbin.encode_buffer(
                    [rng.standard_normal((3, 4)), rng.integers(0, 9, 5).astype(np.int16)]
                )
            ),
        }
        for i in range(3)
    ]
    urls = write_shards(tmp_path, samples, 3)
    ref, got = both(urls, lambda ds: ds.decode().to_tuple("ten"))
    assert [a.dtype for a in got[0][0]] == [np.float64, np.int16]
    assert_same(ref, got)


@pytest.mark.parametrize(
    ("ext", "module"), [("mp", "msgpack"), ("msg", "msgpack"), ("cbor", "cbor")]
)
def test_msgpack_and_cbor_need_their_packages_as_in_webdataset(
    tmp_path: Path, ext: str, module: str
) -> None:
    try:
        __import__(module)
    except ImportError:
        urls = write_shards(tmp_path, [{"__key__": "a", ext: b"\x01"}], 1)
        for lib in (webdataset, wds):
            with pytest.raises(lib.DecodingError) as info:
                list(lib.WebDataset(urls, shardshuffle=False).decode())
            assert isinstance(info.value.__cause__, ImportError)
        return
    encoded = __import__(module).dumps({"x": [1, 2]}) if module == "cbor" else None
    if module == "msgpack":
        import msgpack

        encoded = msgpack.packb({"x": [1, 2]})
    urls = write_shards(tmp_path, [{"__key__": "a", ext: encoded}], 1)
    ref, got = both(urls, lambda ds: ds.decode().to_tuple(ext))
    assert got == ref == [({"x": [1, 2]},)]


# ---------------------------------------------------------------- empty_check


def test_empty_check_raises_like_webdataset_while_iterating(tmp_path: Path) -> None:
    empty = tmp_path / "empty.tar"
    with tarfile.open(empty, "w"):
        pass
    messages = []
    for lib in (webdataset, chute):
        it = iter(lib.WebDataset(str(empty), shardshuffle=False))  # raises only when read
        with pytest.raises(ValueError) as info:
            next(it)
        messages.append(str(info.value))
    assert messages[0] == messages[1] and messages[1].startswith("No samples found")
    assert list(chute.WebDataset(str(empty), shardshuffle=False, empty_check=False)) == []


# ---------------------------------------------------------------- handler scopes


def _missing_field_shard(tmp_path: Path) -> list[str]:
    samples: list[dict[str, object]] = [{"__key__": f"m{i}", "cls": i} for i in range(6)]
    for i in (1, 4):
        samples[i]["txt"] = f"t{i}"
    return write_shards(tmp_path, samples, 6)


@pytest.mark.parametrize(
    "build",
    [
        lambda ds: ds.to_tuple("__key__", "txt", handler=wds.ignore_and_continue),
        lambda ds: ds.rename(t="txt", handler=wds.ignore_and_continue).to_tuple("__key__", "t"),
        lambda ds: ds.decode().to_tuple("txt", "cls", handler=wds.ignore_and_continue).batched(2),
    ],
)
def test_field_handlers_skip_samples_missing_the_field(tmp_path: Path, build: Any) -> None:
    urls = _missing_field_shard(tmp_path)
    ref, got = both(urls, build)
    for s in ref + got:
        if isinstance(s, dict):
            s.pop("__local_path__", None)
    assert got and assert_same(ref, got) is None
    with pytest.raises(ValueError, match="txt"):
        list(chute.WebDataset(urls, shardshuffle=False).to_tuple("__key__", "txt"))


def _build_missing_field(lib: Any, urls: list[str], stage: str, python: bool, **kw: Any) -> Any:
    ds = lib.WebDataset(urls, shardshuffle=False, handler=kw.pop("dataset_handler"))
    if python:
        ds = ds.map(dict)  # every later stage runs in Python
    if stage == "to_tuple":
        return ds.to_tuple("__key__", "txt", **kw)
    if stage == "rename":
        return ds.rename(t="txt", **kw).to_tuple("__key__", "t")
    return ds.decode().to_tuple("txt", "cls", **kw).batched(2)


@pytest.mark.parametrize("python", [False, True], ids=["native", "python"])
@pytest.mark.parametrize("stage", ["to_tuple", "rename", "batched"])
@pytest.mark.parametrize("dataset_handler", [wds.ignore_and_continue, wds.warn_and_continue])
def test_a_missing_field_raises_whatever_the_datasets_handler(
    tmp_path: Path, stage: str, python: bool, dataset_handler: Any
) -> None:
    """webdataset's to_tuple/rename raise ValueError for a sample without the
    field unless their own handler says otherwise; the dataset's handler
    does not cover them."""
    urls = _missing_field_shard(tmp_path)
    with pytest.raises(ValueError, match=r"didn't find \['txt'\]"):
        list(_build_missing_field(webdataset, urls, stage, python, dataset_handler=dataset_handler))
    ds = _build_missing_field(wds, urls, stage, python, dataset_handler=dataset_handler)
    with pytest.raises(ValueError) as info:
        list(ds)
    message = str(info.value)
    assert "txt" in message and "'m0'" in message and "shard-000000.tar" in message, message


@pytest.mark.parametrize("python", [False, True], ids=["native", "python"])
@pytest.mark.parametrize("stage", ["to_tuple", "rename", "batched"])
@pytest.mark.parametrize("handler", [wds.ignore_and_continue, wds.warn_and_continue])
def test_a_missing_field_follows_its_stages_handler(
    tmp_path: Path, stage: str, python: bool, handler: Any
) -> None:
    urls = _missing_field_shard(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = list(
            _build_missing_field(
                webdataset,
                urls,
                stage,
                python,
                dataset_handler=wds.reraise_exception,
                handler=handler,
            )
        )
        got = list(
            _build_missing_field(
                wds, urls, stage, python, dataset_handler=wds.reraise_exception, handler=handler
            )
        )
    assert len(got) == (1 if stage == "batched" else 2)
    assert_same(ref, got)
    for lib in (webdataset, wds):
        build = _build_missing_field(
            lib,
            urls,
            stage,
            python,
            dataset_handler=wds.reraise_exception,
            handler=wds.reraise_exception,
        )
        with pytest.raises(ValueError, match="txt"):
            list(build)


def test_a_missing_field_in_a_cut_pipe_raises_as_webdatasets_own_test(tmp_path: Path) -> None:
    """webdataset's test_dataset_missing_{totuple,rename}_raises: a shard cut
    inside a sample's second member, read under ignore_and_stop, still hands
    the partial sample to to_tuple/rename, which raise."""
    rng = np.random.default_rng(5)
    shard = tmp_path / "cut.tar"
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(3):
            for ext, data in (("cls", str(i).encode()), ("bin", rng.bytes(20_000))):
                info = tarfile.TarInfo(f"k{i}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    url = f"pipe:head -c 4000 {shard}"
    for lib in (webdataset, wds):
        for stage in (lib.to_tuple("foo", "bar"), lib.rename(x="foo", y="bar")):
            ds = lib.DataPipeline(
                lib.SimpleShardList(url),
                lib.tarfile_to_samples(handler=wds.ignore_and_stop),
                stage,
            )
            with pytest.raises(ValueError, match="foo"):
                list(ds)


def test_decode_handler_does_not_cover_a_truncated_archive(
    images: list[str], tmp_path: Path
) -> None:
    data = Path(images[0]).read_bytes()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[: len(data) // 2 + 700])
    for lib in (webdataset, chute):
        ds = (
            lib.WebDataset([str(cut)], shardshuffle=False)
            .decode("rgb8", handler=wds.warn_and_continue)
            .to_tuple("jpg;png", "cls")
        )
        with warnings.catch_warnings():
            # webdataset leaves the shard's file open when it raises.
            warnings.simplefilter("ignore", ResourceWarning)
            with pytest.raises(tarfile.ReadError):
                list(ds)
            del ds
            gc.collect()


def test_decode_handler_skips_bad_images_like_webdataset(tmp_path: Path) -> None:
    samples = image_samples(10)
    samples[3]["jpg"] = b"garbage"
    samples[7]["jpg"] = jpeg_bytes(np.random.default_rng(1), 20, 20)[:60]
    urls = write_shards(tmp_path, samples, 10)

    def build(ds: Any) -> Any:
        return ds.decode("rgb8", handler=wds.ignore_and_continue).to_tuple("__key__", "jpg")

    ref, got = both(urls, build)
    assert [k for k, _ in got] == [f"img{i:06d}" for i in range(10) if i not in (3, 7)]
    assert_same(ref, got)


def test_a_truncated_first_sample_follows_the_handler(small: list[str], tmp_path: Path) -> None:
    data = Path(small[0]).read_bytes()
    cut = tmp_path / "first.tar"
    cut.write_bytes(data[:700])  # inside the first sample's first member
    urls = [str(cut), small[1]]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        keys = [
            s["__key__"]
            for s in chute.WebDataset(
                urls, shardshuffle=False, handler=wds.warn_and_continue
            ).decode()
        ]
    assert keys == [f"sample{i:07d}" for i in range(30, 60)]
    assert any("truncated tar archive" in str(w.message) for w in caught)
    with pytest.raises(tarfile.ReadError):
        list(chute.WebDataset(urls, shardshuffle=False).decode())


# ---------------------------------------------------------------- pipe: once per epoch


def test_pipe_command_runs_once_per_shard_per_epoch(small: list[str], tmp_path: Path) -> None:
    log = tmp_path / "runs.log"
    urls = [f"pipe:echo {i} >> {log}; cat {path}" for i, path in enumerate(small)]
    ds = chute.WebDataset(urls, shardshuffle=False).decode()  # dict samples
    assert len(list(ds)) == 90
    assert sorted(log.read_text().split()) == ["0", "1", "2"]
    assert len(list(ds)) == 90
    assert sorted(log.read_text().split()) == ["0", "0", "1", "1", "2", "2"]


# ---------------------------------------------------------------- names


def test_non_utf8_member_names_give_webdataset_keys(tmp_path: Path) -> None:
    path = tmp_path / "names.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT, errors="surrogateescape") as tf:
        for name, data in [
            ("good.cls", b"1"),
            ("k\udcff1.cls", b"2"),
            ("k\udcff1.txt", b"x"),
            ("x.j\udcc4g", b"z"),
            ("z.cls", b"3"),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    ref, got = both(str(path), lambda ds: ds.decode())
    for s in ref + got:
        s.pop("__local_path__")
    assert got[1]["__key__"] == "k\udcff1"
    assert_same(ref, got)
    # A failure naming such a member is an error naming the shard, and skippable.
    with pytest.raises(ValueError, match=r"names\.tar.*sample 'x'.*j\\xc4g"):
        list(chute.WebDataset(str(path), shardshuffle=False).to_tuple("__key__", "cls"))
    skipped = chute.WebDataset(str(path), shardshuffle=False).to_tuple(
        "__key__", "cls", handler=wds.ignore_and_continue
    )
    assert [k for k, _ in skipped] == ["good", "k\udcff1", "z"]


# ---------------------------------------------------------------- composable pipelines


def composable(urls: list[str], lib: Any, *stages: Any) -> Any:
    return lib.DataPipeline(
        lib.SimpleShardList(urls),
        lib.split_by_node,
        lib.split_by_worker,
        lib.tarfile_to_samples(),
        *stages,
    )


def test_data_pipeline_runs_natively_like_the_fluent_chain(images: list[str]) -> None:
    def stages(lib: Any) -> list[Any]:
        return [
            lib.decode("torchrgb8"),
            lib.to_tuple("jpg;png", "cls", "__key__"),
            lib.batched(5),
        ]

    ref = list(composable(images, webdataset, *stages(webdataset)))
    pipeline = composable(images, wds, *stages(wds))
    got = list(pipeline)
    assert_same(ref, got)
    assert pipeline.native() is not None and pipeline.stats()["python_items"] == 0
    fluent = chute.WebDataset(images, shardshuffle=False).decode("torchrgb8")
    assert_same(got, list(fluent.to_tuple("jpg;png", "cls", "__key__").batched(5)))


def test_data_pipeline_with_a_custom_stage_goes_to_python_from_there(small: list[str]) -> None:
    def double(src: Any) -> Any:
        for cls in src:
            yield (cls[0] * 2,)

    def stages(lib: Any) -> list[Any]:
        return [lib.decode(), lib.to_tuple("cls"), double, lib.batched(16)]

    ref = list(composable(small, webdataset, *stages(webdataset)))
    pipeline = composable(small, wds, *stages(wds))
    assert_same(ref, list(pipeline))
    native = pipeline.native()
    assert native is not None
    assert [s.kind for s in native.stages] == ["decode", "to_tuple", "compose", "batched"]


def test_a_pipeline_stage_with_only_a_run_method_runs(small: list[str]) -> None:
    """webdataset's PipelineStage objects (LMDBCached among them) have
    ``run(source)`` and need not be callable."""

    class EveryOther(webdataset.filters.PipelineStage):  # type: ignore[misc]
        def run(self, source: Any) -> Any:
            return islice(source, 0, None, 2)

    stages = [EveryOther(), wds.to_tuple("__key__")]
    ref = list(composable(small, webdataset, *stages))
    assert len(ref) == 45
    assert_same(ref, list(composable(small, wds, *stages)))


def _cls_as_txt(name: str) -> str:
    return name[: -len(".cls")] + ".txt" if name.endswith(".cls") else name


def _not_npy(name: str) -> bool:
    return not name.endswith(".npy")


@pytest.mark.parametrize(
    "member_functions",
    [
        {"select_files": _not_npy},
        {"rename_files": _cls_as_txt},
        {"rename_files": _cls_as_txt, "select_files": lambda n: n.endswith(".txt")},
        # Renamed keys regroup the members: ten samples' members under one key.
        {"rename_files": lambda n: n.split(".")[0][:-1] + "." + n.split(".")[1] + n[-5]},
    ],
    ids=["select", "rename", "rename then select", "regroup"],
)
def test_select_and_rename_files_equal_webdataset(
    small: list[str], member_functions: dict[str, Any]
) -> None:
    def build(lib: Any, urls: Any) -> Any:
        return lib.WebDataset(urls, shardshuffle=False, **member_functions).decode()

    for urls in (small, [f"pipe:cat {small[0]}"]):
        ref = list(build(webdataset, urls))
        ds = build(wds, urls)
        got = list(ds)
        assert len(got) == len(ref) > 0
        assert_same(ref, got)
        assert ds.stats()["python_items"] >= len(got)


def test_tarfile_to_samples_select_and_rename_files_equal_webdataset(small: list[str]) -> None:
    def pipeline(lib: Any) -> Any:
        return lib.DataPipeline(
            lib.SimpleShardList(small),
            lib.tarfile_to_samples(select_files=_not_npy, rename_files=_cls_as_txt),
            lib.decode(),
            lib.to_tuple("__key__", "txt"),
        )

    ref = list(pipeline(webdataset))
    got_pipeline = pipeline(wds)
    assert got_pipeline.native() is None
    got = list(got_pipeline)
    assert len(got) == 90 and isinstance(got[0][1], str)
    assert_same(ref, got)


@pytest.mark.parametrize("handler", [wds.ignore_and_continue, wds.ignore_and_stop])
def test_select_files_on_a_cut_shard_equal_webdataset(tmp_path: Path, handler: Any) -> None:
    """The Python reader hands a cut shard to the handler as webdataset's does:
    the members read before the cut are delivered, and the next shard follows."""
    good = write_shards(tmp_path, tiny_samples(6), per_shard=6, prefix="good")[0]
    cut = tmp_path / "cut.tar"
    cut.write_bytes(Path(good).read_bytes()[:7000])
    urls = [str(cut), good]

    def build(lib: Any) -> Any:
        return lib.WebDataset(urls, shardshuffle=False, handler=handler, select_files=_not_npy)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = list(build(webdataset))
        got = list(build(wds))
    assert len(got) == (8 if handler is wds.ignore_and_continue else 2)
    assert_same(ref, got)
    with pytest.raises(tarfile.ReadError):
        list(wds.WebDataset(urls, shardshuffle=False, select_files=_not_npy))


def test_select_files_datasets_batch_in_a_loader_and_keep_no_state(small: list[str]) -> None:
    ds = chute.WebDataset(small, shardshuffle=False, select_files=_not_npy).decode()
    loader = chute.DataLoader(ds.to_tuple("cls"), batch_size=8)
    reference = torch.utils.data.DataLoader(
        webdataset.WebDataset(small, shardshuffle=False, select_files=_not_npy)
        .decode()
        .to_tuple("cls"),
        batch_size=8,
    )
    assert_same(list(reference), list(loader))
    with pytest.raises(ValueError, match="reads its shards in Python and keeps no state"):
        ds.state_dict()
    with pytest.raises(ValueError, match="takes no resampled=, repeat= or elastic="):
        chute.WebDataset(small, resampled=True, rename_files=_cls_as_txt)


def test_lmdb_cached_is_refused_with_what_to_use_instead() -> None:
    with pytest.raises(NotImplementedError) as info:
        wds.LMDBCached("cache.lmdb")
    assert str(info.value) == (
        "chute.wds.LMDBCached is not implemented: cache samples in memory with "
        "wds.Cached(), or put webdataset.LMDBCached(fname) in a wds.DataPipeline "
        "(chute runs a stage it does not know in Python)"
    )


def test_loader_workers_beyond_the_shards_fail_the_empty_check(small: list[str]) -> None:
    """webdataset's workers split the shards: with more workers than shards
    one gets none, and its empty_check raises."""

    def loader(lib: Any, urls: list[str], workers: int, **kw: Any) -> Any:
        ds = lib.WebDataset(urls, shardshuffle=False, **kw).to_tuple("cls")
        return lib.WebLoader(ds, num_workers=workers, batch_size=3)

    for lib in (webdataset, wds):
        with pytest.raises(ValueError, match="No samples found in dataset; perhaps you have "):
            list(loader(lib, small[:1], 2))
    for workers, urls, kw in [
        (2, small[:2], {}),
        (2, small[:1], {"empty_check": False}),
        (0, small[:1], {}),
    ]:
        ref = list(loader(webdataset, urls, workers, **kw))
        got = list(loader(wds, urls, workers, **kw))
        assert sorted(int(x) for b in got for x in b[0]) == sorted(
            int(x) for b in ref for x in b[0]
        )
    # chute.DataLoader's workers are threads over one shard list: none is
    # left without a shard, so nothing is empty.
    threads = chute.DataLoader(
        chute.WebDataset(small[:1], shardshuffle=False).to_tuple("cls"), num_workers=2
    )
    assert len(list(threads)) == 30


def test_data_pipeline_sources(small: list[str]) -> None:
    pattern = small[0].replace("000000", "{000000..000002}")
    keys = [s["__key__"] for s in wds.DataPipeline(wds.shardspec(pattern), wds.tarfile_samples)]
    assert keys == [f"sample{i:07d}" for i in range(90)]
    # A seeded shard list: the same order as webdataset's, every epoch.
    ref = [
        s["__key__"]
        for s in webdataset.DataPipeline(
            webdataset.SimpleShardList(small, seed=3), webdataset.tarfile_to_samples()
        )
    ]
    got_pipeline = wds.DataPipeline(wds.SimpleShardList(small, seed=3), wds.tarfile_to_samples())
    assert [s["__key__"] for s in got_pipeline] == ref != keys
    assert [s["__key__"] for s in got_pipeline] == ref
    # A shard-level shuffle stage runs on the urls before the engine.
    shuffled = wds.DataPipeline(
        wds.SimpleShardList(small), wds.shuffle(10, seed=1), wds.tarfile_to_samples()
    )
    assert sorted(s["__key__"] for s in shuffled) == keys
    resampled = wds.DataPipeline(wds.ResampledShards(small), wds.tarfile_to_samples())
    assert len(list(islice(resampled, 200))) == 200
    finite = wds.DataPipeline(wds.ResampledShards(small, nshards=2), wds.tarfile_to_samples())
    assert len(list(finite)) == 60


def test_data_pipeline_python_only(small: list[str]) -> None:
    assert list(wds.DataPipeline(lambda: iter([1, 2, 3]), wds.map(lambda x: x + 1))) == [2, 3, 4]
    assert list(wds.DataPipeline(wds.MockDataset((1, 2), 3))) == [(1, 2)] * 3
    assert list(wds.DataPipeline(lambda: iter([5, 6]), wds.slice(1))) == [5]
    samples = list(wds.tarfile_to_samples()(iter([{"url": small[0]}])))
    assert len(samples) == 30 and samples[0]["cls"] == b"%d" % tiny_samples(1, seed=2)[0]["cls"]


def test_data_pipeline_epochs_state_and_dataloader(small: list[str]) -> None:
    pipeline = composable(small, wds, wds.decode(), wds.to_tuple("__key__", "cls"), wds.batched(8))
    loader = chute.DataLoader(pipeline, batch_size=None, num_workers=2)
    full = [list(b[0]) for b in loader]
    it = iter(loader)
    head = [list(next(it)[0]) for _ in range(3)]
    state = loader.state_dict()
    del it
    again = chute.DataLoader(pipeline, batch_size=None, num_workers=2)
    again.load_state_dict(state)
    assert head + [list(b[0]) for b in again] == full
    assert len(list(pipeline.with_epoch(20))) == 20
    torch_batches = list(torch.utils.data.DataLoader(pipeline, batch_size=None, num_workers=0))
    assert len(torch_batches) == 20


# ---------------------------------------------------------------- independent iterations


def test_nested_peek_does_not_disturb_the_outer_loop(small: list[str]) -> None:
    ds = chute.WebDataset(small, shardshuffle=False, seed=5).decode().to_tuple("__key__", "cls")
    expected = [k for k, _ in ds]
    got = []
    for i, (key, _) in enumerate(ds):
        got.append(key)
        if i == 10:
            peeked = next(iter(ds))
            assert peeked[0] == expected[0]
            state = ds.state_dict()
            assert state["rows"] == 11 or state["batches"] > 0
    assert got == expected


def test_two_threads_iterate_one_dataset(small: list[str]) -> None:
    ds = chute.WebDataset(small, shardshuffle=False).decode().to_tuple("__key__", "cls")
    expected = [k for k, _ in ds]
    results: list[list[str]] = [[], []]

    def run(i: int) -> None:
        results[i] = [k for k, _ in ds]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results == [expected, expected]


def test_two_loaders_over_one_dataset(small: list[str]) -> None:
    ds = chute.WebDataset(small, shardshuffle=False).decode().to_tuple("cls").batched(10)
    a, b = iter(chute.DataLoader(ds, batch_size=None)), iter(chute.DataLoader(ds, batch_size=None))
    pairs = list(zip(a, b, strict=True))
    assert len(pairs) == 9 and all(np.array_equal(x[0], y[0]) for x, y in pairs)


def test_state_dict_of_a_loader_is_its_own_iteration(small: list[str]) -> None:
    ds = chute.WebDataset(small, shardshuffle=False).decode().to_tuple("__key__").batched(10)
    loader = chute.DataLoader(ds, batch_size=None)
    it = iter(loader)
    next(it), next(it)
    list(ds)  # a whole other iteration of the same dataset, finished meanwhile
    peek = iter(ds)
    next(peek)
    assert loader.state_dict()["dataset"]["batches"] == 2
    del peek
    fresh = chute.DataLoader(
        chute.WebDataset(small, shardshuffle=False).decode().to_tuple("__key__").batched(10),
        batch_size=None,
    )
    fresh.load_state_dict(loader.state_dict())
    assert [b[0][0] for b in fresh] == [f"sample{i:07d}" for i in range(20, 90, 10)]


def test_a_dataset_pickles_while_it_is_iterated(small: list[str]) -> None:
    import pickle

    ds = chute.WebDataset(small, shardshuffle=False).decode().to_tuple("cls").batched(10)
    it = iter(ds)
    next(it)
    copy = pickle.loads(pickle.dumps(ds))
    assert len(list(copy)) == 9
    assert len(list(it)) == 8


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_torch_workers_with_spawn_and_forkserver(small: list[str], method: str) -> None:
    ds = chute.WebDataset(small, shardshuffle=False).decode().to_tuple("__key__", "cls")
    outer = iter(ds)
    next(outer)  # the parent iterates it while the workers start
    loader = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=2, multiprocessing_context=method, timeout=120
    )
    keys = sorted(k for k, _ in loader)
    assert keys == [f"sample{i:07d}" for i in range(90)]


@pytest.mark.parametrize(
    "build",
    [
        lambda ds, h: ds.decode(handler=h),
        lambda ds, h: ds.decode(handler=h).to_tuple("__key__", "json", "cls"),
        lambda ds, h: ds.decode(handler=h).to_tuple("json", "cls").batched(3),
        lambda ds, h: ds.decode(handler=h).batched(3),
    ],
)
def test_members_decoded_in_python_follow_the_decode_handler(tmp_path: Path, build: Any) -> None:
    samples: list[dict[str, object]] = [
        {"__key__": f"j{i}", "json": b'{"i": %d}' % i, "cls": i} for i in range(8)
    ]
    samples[2]["json"] = b"{not json"
    samples[5]["json"] = b"[1,"
    urls = write_shards(tmp_path, samples, 8)
    for lib in (webdataset, chute):
        with pytest.raises(wds.DecodingError if lib is chute else webdataset.DecodingError):
            list(build(lib.WebDataset(urls, shardshuffle=False), wds.reraise_exception))
    ref = list(build(webdataset.WebDataset(urls, shardshuffle=False), wds.ignore_and_continue))
    ds = build(chute.WebDataset(urls, shardshuffle=False), wds.ignore_and_continue)
    got = list(ds)
    for s in ref + got:
        if isinstance(s, dict):
            s.pop("__local_path__")
    if isinstance(got[0], tuple) and isinstance(got[0][0], list):
        # A batch loses the rows that failed (webdataset decodes before it
        # batches, so its batches stay full): compare the rows.
        ref = [(j, int(c)) for b in ref for j, c in zip(*b, strict=True)]
        got = [(j, int(c)) for b in got for j, c in zip(*b, strict=True)]
    elif isinstance(got[0], dict) and isinstance(got[0]["__key__"], list):
        ref = [r for b in ref for r in zip(b["__key__"], b["json"], b["cls"], strict=True)]
        got = [r for b in got for r in zip(b["__key__"], b["json"], b["cls"], strict=True)]
    assert_same(ref, got)
    assert ds.stats()["samples_skipped"] == 2


def test_webloader_repeat_and_with_epoch_like_webdataset(small: list[str]) -> None:
    def run(module: Any, build: Any) -> list[int]:
        ds = module.WebDataset(small, shardshuffle=False).decode().to_tuple("cls").batched(20)
        loader = build(module.WebLoader(ds, batch_size=None, num_workers=0))
        return [len(b[0]) for b in loader]

    for build in (
        lambda loader: loader.repeat(nepochs=2),
        lambda loader: loader.unbatched().batched(25).repeat(nepochs=2),
        lambda loader: loader.repeat(2, nbatches=7),
        lambda loader: loader.unbatched().batched(40).with_epoch(5),
    ):
        assert run(wds, build) == run(webdataset, build)
    assert run(wds, lambda loader: loader.repeat(nepochs=2)) == [20, 20, 20, 20, 10] * 2


def test_an_unknown_image_spec_lists_the_valid_ones() -> None:
    expected = (
        "Unknown imagespec: nonsense (valid specs: l8, rgb8, rgba8, l, rgb, rgba, torchl8, "
        "torchrgb8, torchrgba8, torchl, torchrgb, torch, torchrgba, pill, pil, pilrgb, "
        "pilrgba; or a handler callable f(key, data))"
    )
    for make in (
        lambda: chute.WebDataset("x.tar", shardshuffle=False).decode("nonsense"),
        lambda: wds.decode("nonsense"),
        lambda: wds.autodecode.ImageHandler("nonsense"),
    ):
        with pytest.raises(ValueError) as info:
            make()
        assert str(info.value) == expected


@pytest.mark.parametrize("combine_tensors", [True, False])
@pytest.mark.parametrize("combine_scalars", [True, False])
def test_default_collation_fn_switches_equal_webdatasets(
    combine_tensors: bool, combine_scalars: bool
) -> None:
    flags = {"combine_tensors": combine_tensors, "combine_scalars": combine_scalars}
    for rows in (
        [{"a": 1, "b": 2.5}, {"a": 2, "b": 3.5}],
        [(1, "x"), (2, "y")],
        [{"a": np.array([1, 2])}, {"a": np.array([3, 4])}],
        [(torch.tensor([1.0]),), (torch.tensor([2.0]),)],
    ):
        ref = webdataset.filters.default_collation_fn(rows, **flags)
        got = wds.default_collation_fn(rows, **flags)
        assert_same(ref, got)
