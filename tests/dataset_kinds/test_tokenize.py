"""chute.tokenize_shards: text shards (tar .txt/.json members, JSON Lines;
local and remote) into Megatron .bin/.idx token files, checked against the
tokenizers library's own encode_batch and read back by a numpy reading of
Megatron's documented .idx layout; the cache is reused, invalidated and
refused as documented."""

from __future__ import annotations

import gzip
import json
import logging
import os
import struct
import tarfile
from pathlib import Path

import chute
import chute.tokenize.build as tokenize_build
import chute.tokenize.cache_entries as cache_entries
import chute.tokenize.text_shards as text_shards
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import webdataset as wds
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

WORDS = (
    "the a of loader shard token pack window epoch resume batch rank worker seed order "
    "mix weight café naïve 東京 données ß µ"
).split()


def make_documents(rng: np.random.Generator, n: int) -> list[str]:
    documents = []
    for i in range(n):
        length = 0 if i == 3 else int(rng.integers(1, 60))
        words = rng.choice(WORDS, size=length)
        documents.append(" ".join(words) + ("\n" if i % 5 == 0 else ""))
    return documents


def train_tokenizer(vocab_size: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = make_documents(np.random.default_rng(99), 400)
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    return tokenizer


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return train_tokenizer(400)


@pytest.fixture
def encode_calls(monkeypatch) -> list[int]:
    """Counts the batches handed to the tokenizer."""
    calls: list[int] = []
    real = tokenize_build._encode

    def counting(tokenizer, texts, options, dtype):
        calls.append(len(texts))
        return real(tokenizer, texts, options, dtype)

    monkeypatch.setattr(tokenize_build, "_encode", counting)
    return calls


def read_megatron(bin_path: str) -> tuple[np.dtype, list[np.ndarray], np.ndarray]:
    """The documented layout, read with numpy: dtype, each sequence's tokens,
    and the document indices."""
    idx = Path(bin_path[: -len(".bin")] + ".idx").read_bytes()
    assert idx[:9] == b"MMIDIDX\x00\x00"
    version, code, sequences, document_indices = struct.unpack_from("<QBQQ", idx, 9)
    assert version == 1
    dtype = {8: np.dtype(np.uint16), 4: np.dtype(np.int32)}[code]
    offset = 9 + 8 + 1 + 8 + 8
    lengths = np.frombuffer(idx, "<i4", sequences, offset)
    offset += 4 * sequences
    pointers = np.frombuffer(idx, "<i8", sequences, offset)
    offset += 8 * sequences
    documents = np.frombuffer(idx, "<i8", document_indices, offset)
    assert offset + 8 * document_indices == len(idx)
    data = Path(bin_path).read_bytes()
    assert len(data) == int(lengths.sum()) * dtype.itemsize
    tokens = [
        np.frombuffer(data, dtype.newbyteorder("<"), int(n), int(p))
        for n, p in zip(lengths, pointers, strict=True)
    ]
    return dtype, tokens, documents


def expected_tokens(tokenizer: Tokenizer, documents: list[str], eod_id: int | None):
    ids = [e.ids for e in tokenizer.encode_batch(documents)]
    return [i + ([eod_id] if eod_id is not None else []) for i in ids]


def assert_tokens(bin_path: str, tokenizer: Tokenizer, documents: list[str], eod_id=None):
    dtype, tokens, document_indices = read_megatron(bin_path)
    assert dtype == np.uint16
    assert [t.tolist() for t in tokens] == expected_tokens(tokenizer, documents, eod_id)
    assert document_indices.tolist() == list(range(len(documents) + 1))


def write_jsonl(path, documents: list[str], key: str = "text") -> str:
    with open(path, "w", encoding="utf-8") as f:
        for i, text in enumerate(documents):
            f.write(json.dumps({"id": i, key: text}) + "\n")
            if i == 2:
                f.write("\n")  # a blank line is no document
    return str(path)


def jsonl_bytes(documents: list[str]) -> bytes:
    return "".join(json.dumps({"text": t}) + "\n" for t in documents).encode()


def write_tar(path, documents: list[str], member: str, key: str = "text") -> str:
    with wds.TarWriter(str(path)) as sink:
        for i, text in enumerate(documents):
            value = text if member == "txt" else {key: text, "n": i}
            sink.write({"__key__": f"doc{i:04d}", member: value})
    return str(path)


def test_jsonl_shards_equal_encode_batch_with_eod(tmp_path, tokenizer) -> None:
    rng = np.random.default_rng(0)
    shards = [make_documents(rng, n) for n in (40, 1, 25)]
    urls = [write_jsonl(tmp_path / f"part-{i}.jsonl", d) for i, d in enumerate(shards)]
    eod = tokenizer.token_to_id("<|endoftext|>")
    paths = chute.tokenize_shards(urls, tokenizer, tmp_path / "cache", eod_id=eod)
    assert len(paths) == 3
    for path, documents in zip(paths, shards, strict=True):
        assert path.endswith(".bin") and os.path.dirname(path) == str(tmp_path / "cache")
        assert_tokens(path, tokenizer, documents, eod)


def test_small_batches_keep_order_across_shards(tmp_path, tokenizer, monkeypatch) -> None:
    monkeypatch.setattr(text_shards, "BATCH_DOCUMENTS", 3)
    monkeypatch.setattr(text_shards, "READ_CHUNK_BYTES", 64)
    rng = np.random.default_rng(1)
    shards = [make_documents(rng, n) for n in (17, 0, 9)]
    urls = [write_jsonl(tmp_path / f"p{i}.jsonl", d) for i, d in enumerate(shards)]
    paths = chute.tokenize_shards(urls, tokenizer, tmp_path / "c")
    for path, documents in zip(paths, shards, strict=True):
        assert_tokens(path, tokenizer, documents)
    assert chute.tokenize_shards(str(tmp_path / "p*.jsonl"), tokenizer, tmp_path / "c") == paths
    with pytest.raises(FileNotFoundError, match="no text shard matches the pattern"):
        chute.tokenize_shards(str(tmp_path / "q*.jsonl"), tokenizer, tmp_path / "c")


@pytest.mark.parametrize(("member", "gzipped"), [("txt", False), ("json", False), ("txt", True)])
def test_tar_members_equal_encode_batch(tmp_path, tokenizer, member, gzipped) -> None:
    documents = make_documents(np.random.default_rng(2), 30)
    url = write_tar(tmp_path / "shard-000000.tar", documents, member, key="body")
    if gzipped:
        url += ".gz"
        Path(url).write_bytes(gzip.compress(Path(url[:-3]).read_bytes()))
    (path,) = chute.tokenize_shards(url, tokenizer, tmp_path / "cache", text_key="body")
    assert_tokens(path, tokenizer, documents)


def test_remote_jsonl_and_tar(tmp_path, tokenizer, object_server, encode_calls) -> None:
    rng = np.random.default_rng(3)
    lines, samples = make_documents(rng, 20), make_documents(rng, 12)
    object_server.objects["/d/a.jsonl"] = jsonl_bytes(lines)
    tar = write_tar(tmp_path / "b.tar", samples, "txt")
    object_server.objects["/d/b.tar"] = Path(tar).read_bytes()
    object_server.objects["/d/c.tar.gz"] = gzip.compress(Path(tar).read_bytes())
    urls = [f"{object_server.url}/d/{name}" for name in ("a.jsonl", "b.tar", "c.tar.gz")]
    paths = chute.tokenize_shards(urls, tokenizer, tmp_path / "cache")
    assert_tokens(paths[0], tokenizer, lines)
    assert_tokens(paths[1], tokenizer, samples)
    assert_tokens(paths[2], tokenizer, samples)
    manifest = json.loads(Path(paths[0][: -len(".bin")] + ".json").read_text())
    assert manifest["input"]["version"] == object_server.etag("/d/a.jsonl")

    calls = len(encode_calls)
    assert chute.tokenize_shards(urls, tokenizer, tmp_path / "cache") == paths
    assert len(encode_calls) == calls

    lines2 = lines[:5]  # another object under the same url: another ETag and size
    object_server.objects["/d/a.jsonl"] = jsonl_bytes(lines2)
    again = chute.tokenize_shards(urls, tokenizer, tmp_path / "cache")
    assert again == paths and len(encode_calls) == calls + 1
    assert_tokens(again[0], tokenizer, lines2)


def write_parquet(path, documents: list, key: str = "text", rows_per_group: int = 7) -> str:
    table = pa.table({"id": list(range(len(documents))), key: documents})
    pq.write_table(table, str(path), row_group_size=rows_per_group)
    return str(path)


def test_parquet_text_column_equals_encode_batch(tmp_path, tokenizer, object_server) -> None:
    rng = np.random.default_rng(5)
    documents = make_documents(rng, 30)
    local = write_parquet(tmp_path / "a.parquet", documents)
    assert pq.ParquetFile(local).num_row_groups == 5  # documents cross row groups
    eod = tokenizer.token_to_id("<|endoftext|>")
    (path,) = chute.tokenize_shards(local, tokenizer, tmp_path / "cache", eod_id=eod)
    assert_tokens(path, tokenizer, documents, eod)
    object_server.objects["/d/b.parquet"] = Path(local).read_bytes()
    url = f"{object_server.url}/d/b.parquet"
    (remote,) = chute.tokenize_shards(url, tokenizer, tmp_path / "cache", eod_id=eod)
    assert_tokens(remote, tokenizer, documents, eod)


def test_bad_parquet_text_inputs_name_file_and_row(tmp_path, tokenizer) -> None:
    cache = tmp_path / "cache"
    missing = write_parquet(tmp_path / "m.parquet", ["a b"], key="body")
    with pytest.raises(
        chute.DataError, match=r"m\.parquet: no 'text' column \(columns: 'id', 'body'\)"
    ):
        chute.tokenize_shards(missing, tokenizer, cache)
    numbers = tmp_path / "n.parquet"
    pq.write_table(pa.table({"text": [1, 2]}), str(numbers))
    with pytest.raises(
        chute.DataError, match=r"n\.parquet: column 'text' holds int64, not strings"
    ):
        chute.tokenize_shards(str(numbers), tokenizer, cache)
    nulls = write_parquet(tmp_path / "z.parquet", ["a", "b", None, "c"], rows_per_group=2)
    with pytest.raises(chute.DataError, match=r"z\.parquet: row group 1, row 0: 'text' is null"):
        chute.tokenize_shards(nulls, tokenizer, cache)
    junk = tmp_path / "j.parquet"
    junk.write_bytes(b"not parquet at all")
    with pytest.raises(chute.DataError, match=r"j\.parquet: not a readable Parquet file"):
        chute.tokenize_shards(str(junk), tokenizer, cache)


def test_int32_tokens_when_an_id_exceeds_uint16(tmp_path, tokenizer) -> None:
    documents = make_documents(np.random.default_rng(4), 10)
    url = write_jsonl(tmp_path / "a.jsonl", documents)
    (path,) = chute.tokenize_shards(url, tokenizer, tmp_path / "c", eod_id=70_000)
    dtype, tokens, _ = read_megatron(path)
    assert dtype == np.int32
    assert [t.tolist() for t in tokens] == expected_tokens(tokenizer, documents, 70_000)


def test_second_run_reads_the_cache(tmp_path, tokenizer, encode_calls) -> None:
    documents = make_documents(np.random.default_rng(5), 20)
    urls = [
        write_jsonl(tmp_path / "a.jsonl", documents),
        write_tar(tmp_path / "b.tar", documents, "txt"),
    ]
    first = chute.tokenize_shards(urls, tokenizer, tmp_path / "cache")
    assert len(encode_calls) == 2
    stamps = [os.stat(p).st_mtime_ns for p in first]
    assert chute.tokenize_shards(urls, tokenizer, tmp_path / "cache") == first
    assert chute.tokenize_shards(urls, tokenizer, tmp_path / "cache", read_only=True) == first
    assert len(encode_calls) == 2
    assert [os.stat(p).st_mtime_ns for p in first] == stamps


def test_changed_input_is_tokenized_again(tmp_path, tokenizer, encode_calls, caplog) -> None:
    rng = np.random.default_rng(6)
    url = write_jsonl(tmp_path / "a.jsonl", make_documents(rng, 20))
    (path,) = chute.tokenize_shards(url, tokenizer, tmp_path / "cache")
    changed = make_documents(rng, 21)
    write_jsonl(tmp_path / "a.jsonl", changed)
    with pytest.raises(
        ValueError,
        match=r"a\.jsonl: the token cache .* cannot be used "
        r"\(the cache entry was made for input .* and read_only=True",
    ):
        chute.tokenize_shards(url, tokenizer, tmp_path / "cache", read_only=True)
    with caplog.at_level(logging.WARNING, logger="chute"):
        assert chute.tokenize_shards(url, tokenizer, tmp_path / "cache") == [path]
    assert "a.jsonl: tokenizing again: the cache entry was made for input" in caplog.text
    assert len(encode_calls) == 2
    assert_tokens(path, tokenizer, changed)


def test_input_rewritten_with_its_time_set_back_is_tokenized_again(
    tmp_path, tokenizer, encode_calls, caplog
) -> None:
    url = write_jsonl(tmp_path / "a.jsonl", ["the loader"] * 20)
    (path,) = chute.tokenize_shards(url, tokenizer, tmp_path / "cache")
    before = os.stat(url)
    changed = ["the batch!"] * 20  # as many characters: the same size
    write_jsonl(tmp_path / "a.jsonl", changed)
    os.utime(url, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(url)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    with pytest.raises(
        ValueError,
        match=r"a\.jsonl: the token cache .* cannot be used \(the input .*a\.jsonl does not "
        r"match the SHA-256 the manifest records \(it was rewritten with the same size and "
        r"modification time\)\) and read_only=True",
    ):
        chute.tokenize_shards(url, tokenizer, tmp_path / "cache", read_only=True)
    # verify=False compares sizes and times only, as documented.
    assert chute.tokenize_shards(url, tokenizer, tmp_path / "cache", verify=False) == [path]
    assert len(encode_calls) == 1
    with caplog.at_level(logging.WARNING, logger="chute"):
        assert chute.tokenize_shards(url, tokenizer, tmp_path / "cache") == [path]
    assert "does not match the SHA-256 the manifest records" in caplog.text
    assert len(encode_calls) == 2
    assert_tokens(path, tokenizer, changed)
    assert chute.tokenize_shards(url, tokenizer, tmp_path / "cache", read_only=True) == [path]


def test_changed_tokenizer_or_options_are_other_entries(tmp_path, tokenizer, encode_calls) -> None:
    documents = make_documents(np.random.default_rng(7), 20)
    url = write_jsonl(tmp_path / "a.jsonl", documents)
    cache = tmp_path / "cache"
    (plain,) = chute.tokenize_shards(url, tokenizer, cache)
    (with_eod,) = chute.tokenize_shards(url, tokenizer, cache, eod_id=0)
    (no_special,) = chute.tokenize_shards(url, tokenizer, cache, add_special_tokens=False)
    other = train_tokenizer(300)
    (retrained,) = chute.tokenize_shards(url, other, cache)
    assert len({plain, with_eod, no_special, retrained}) == 4
    assert len(encode_calls) == 4
    assert_tokens(with_eod, tokenizer, documents, 0)
    assert_tokens(retrained, other, documents)
    # Each is reused under its own tokenizer and options.
    for kwargs, path in (({}, plain), ({"eod_id": 0}, with_eod)):
        assert chute.tokenize_shards(url, tokenizer, cache, **kwargs) == [path]
    assert chute.tokenize_shards(url, other, cache) == [retrained]
    assert len(encode_calls) == 4


def test_manifest_is_checked_field_by_field(tmp_path, tokenizer) -> None:
    url = write_jsonl(tmp_path / "a.jsonl", make_documents(np.random.default_rng(8), 5))
    (path,) = chute.tokenize_shards(url, tokenizer, tmp_path / "cache", eod_id=0)
    manifest_path = path[: -len(".bin")] + ".json"
    manifest = json.loads(Path(manifest_path).read_text())
    manifest["options"]["eod_id"] = 1
    Path(manifest_path).write_text(json.dumps(manifest))
    with pytest.raises(
        ValueError, match=r"made for options \{.*'eod_id': 1.*\}, not \{.*'eod_id': 0"
    ):
        chute.tokenize_shards(url, tokenizer, tmp_path / "cache", eod_id=0, read_only=True)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("flip_bin", r"\.bin does not match the SHA-256 its manifest records"),
        ("flip_idx", r"\.idx does not match the SHA-256 its manifest records"),
        ("truncate_bin", r"\.bin has \d+ bytes, its manifest says \d+"),
        ("delete_idx", r"\.idx is missing"),
        ("garble_manifest", r"its manifest .*\.json cannot be read"),
    ],
)
def test_damaged_entry_refused_or_rebuilt(tmp_path, tokenizer, caplog, damage, reason) -> None:
    documents = make_documents(np.random.default_rng(9), 30)
    url = write_jsonl(tmp_path / "a.jsonl", documents)
    cache = tmp_path / "cache"
    (path,) = chute.tokenize_shards(url, tokenizer, cache)
    stem = path[: -len(".bin")]
    if damage.startswith("flip"):
        target = stem + (".bin" if damage == "flip_bin" else ".idx")
        data = bytearray(Path(target).read_bytes())
        data[len(data) - 3] ^= 1
        Path(target).write_bytes(data)
    elif damage == "truncate_bin":
        os.truncate(path, os.path.getsize(path) - 2)
    elif damage == "delete_idx":
        os.unlink(stem + ".idx")
    else:
        Path(stem + ".json").write_text("{not json")
    with pytest.raises(ValueError, match=reason):
        chute.tokenize_shards(url, tokenizer, cache, read_only=True)
    with caplog.at_level(logging.WARNING, logger="chute"):
        assert chute.tokenize_shards(url, tokenizer, cache) == [path]
    assert "tokenizing again" in caplog.text
    assert_tokens(path, tokenizer, documents)
    chute.tokenize_shards(url, tokenizer, cache, read_only=True)


def test_size_only_check_still_catches_a_truncated_file(tmp_path, tokenizer, encode_calls) -> None:
    url = write_jsonl(tmp_path / "a.jsonl", make_documents(np.random.default_rng(10), 10))
    (path,) = chute.tokenize_shards(url, tokenizer, tmp_path / "c")
    assert chute.tokenize_shards(url, tokenizer, tmp_path / "c", verify=False) == [path]
    os.truncate(path, os.path.getsize(path) - 2)
    with pytest.raises(ValueError, match=r"\.bin has \d+ bytes"):
        chute.tokenize_shards(url, tokenizer, tmp_path / "c", verify=False, read_only=True)


def test_read_only_without_an_entry_refuses(tmp_path, tokenizer) -> None:
    url = write_jsonl(tmp_path / "a.jsonl", ["hello"])
    with pytest.raises(
        ValueError, match=r"a\.jsonl: the token cache .* cannot be used \(no cache entry\)"
    ):
        chute.tokenize_shards(url, tokenizer, tmp_path / "cache", read_only=True)
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("killed_at", [".bin", ".idx", ".json"])
def test_interrupted_run_leaves_no_entry(tmp_path, tokenizer, monkeypatch, killed_at) -> None:
    rng = np.random.default_rng(11)
    old, new = make_documents(rng, 40), make_documents(rng, 41)
    url = write_jsonl(tmp_path / "a.jsonl", old)
    cache = tmp_path / "cache"
    (path,) = chute.tokenize_shards(url, tokenizer, cache)
    write_jsonl(tmp_path / "a.jsonl", new)
    # A kill while the new entry's files are renamed into place: nothing is cleaned up.
    real_replace = os.replace
    monkeypatch.setattr(cache_entries.EntryWriter, "abort", lambda self: None)

    def killed(src, dst):
        if str(dst).endswith(killed_at):
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(cache_entries.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        chute.tokenize_shards(url, tokenizer, cache)
    monkeypatch.undo()
    with pytest.raises(ValueError, match=r"\(no cache entry\)"):
        chute.tokenize_shards(url, tokenizer, cache, read_only=True, verify=False)
    assert chute.tokenize_shards(url, tokenizer, cache) == [path]
    assert_tokens(path, tokenizer, new)


def test_failed_run_removes_its_temporary_files(tmp_path, tokenizer) -> None:
    good = write_jsonl(tmp_path / "a.jsonl", ["one", "two"])
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"text": "x"}\n{"body": "y"}\n')
    with pytest.raises(chute.DataError):
        chute.tokenize_shards([good, str(bad)], tokenizer, tmp_path / "cache")
    names = os.listdir(tmp_path / "cache")
    assert not [n for n in names if ".tmp-" in n]
    assert not [n for n in names if n.startswith("b-")]
    # The shard read whole before the failure was written.
    (path,) = chute.tokenize_shards(good, tokenizer, tmp_path / "cache", read_only=True)
    assert_tokens(path, tokenizer, ["one", "two"])


def test_bad_jsonl_lines_name_file_and_line(tmp_path, tokenizer) -> None:
    cases = [
        (
            b'{"text": "a"}\n\n{"body": "b", "id": 2}\n',
            r"bad\.jsonl: line 3: no 'text' key \(keys: 'body', 'id'\)",
        ),
        (
            b'{"text": "a"}\n{"text": "caf\xe9"}\n',
            r"bad\.jsonl: line 2: not UTF-8 text \(byte 13: invalid continuation byte\)",
        ),
        (b'{"text": "a"}\n{"text": \n', r"bad\.jsonl: line 2: not JSON \(Expecting value"),
        (b'{"text": 7}\n', r"bad\.jsonl: line 1: 'text' is a int, not a string"),
        (b'["text"]\n', r"bad\.jsonl: line 1: a JSON list, not an object"),
    ]
    for data, message in cases:
        (tmp_path / "bad.jsonl").write_bytes(data)
        with pytest.raises(chute.DataError, match=message):
            chute.tokenize_shards(str(tmp_path / "bad.jsonl"), tokenizer, tmp_path / "cache")


def test_bad_tar_members_name_the_member(tmp_path, tokenizer) -> None:
    path = str(tmp_path / "bad.tar")
    with wds.TarWriter(path) as sink:
        sink.write({"__key__": "ok", "txt": "fine"})
        sink.write({"__key__": "latin", "txt": b"caf\xe9"})
    with tarfile.open(path) as archive:
        offset = archive.getmember("latin.txt").offset
    message = rf"bad\.tar: member latin\.txt \(offset {offset}\): not UTF-8 text \(byte 3"
    with pytest.raises(chute.DataError, match=message):
        chute.tokenize_shards(path, tokenizer, tmp_path / "cache")
    with wds.TarWriter(path) as sink:
        sink.write({"__key__": "k", "json": {"title": "t"}})
    with pytest.raises(
        chute.DataError,
        match=r"bad\.tar: member k\.json \(offset 0\): no 'text' key \(keys: 'title'\)",
    ):
        chute.tokenize_shards(path, tokenizer, tmp_path / "cache")
    with wds.TarWriter(path) as sink:
        sink.write({"__key__": "k", "cls": 3, "npy": np.zeros(2)})
    with pytest.raises(
        chute.DataError,
        match=r"bad\.tar: member k \(offset 0\): "
        r"no \.txt or \.json member to tokenize \(has: cls, npy\)",
    ):
        chute.tokenize_shards(path, tokenizer, tmp_path / "cache")


def test_file_changed_while_read_is_refused(tmp_path, tokenizer, monkeypatch) -> None:
    url = write_jsonl(tmp_path / "a.jsonl", make_documents(np.random.default_rng(12), 30))
    monkeypatch.setattr(text_shards, "READ_CHUNK_BYTES", 256)
    real_chunks = text_shards.TextShard.chunks

    def appending(self):
        for i, chunk in enumerate(real_chunks(self)):
            if i == 1:
                with open(url, "a") as f:
                    f.write(json.dumps({"text": "late"}) + "\n")
            yield chunk

    monkeypatch.setattr(text_shards.TextShard, "chunks", appending)
    with pytest.raises(chute.DataError, match=r"a\.jsonl: the file changed while it was tokenized"):
        chute.tokenize_shards(url, tokenizer, tmp_path / "cache")
    assert not [n for n in os.listdir(tmp_path / "cache") if not n.startswith(".")]


def test_refused_tokenizers_and_inputs(tmp_path, tokenizer) -> None:
    url = write_jsonl(tmp_path / "a.jsonl", ["x"])
    padded = Tokenizer.from_str(tokenizer.to_str())
    padded.enable_padding()
    with pytest.raises(ValueError, match=r"the tokenizer pads its encodings.*no_padding\(\)"):
        chute.tokenize_shards(url, padded, tmp_path / "cache")
    with pytest.raises(TypeError, match=r"tokenizer must be a tokenizers.Tokenizer.* not dict"):
        chute.tokenize_shards(url, {}, tmp_path / "cache")
    with pytest.raises(ValueError, match=r"cannot tokenize '.*a\.csv': expected a tar shard"):
        chute.tokenize_shards(str(tmp_path / "a.csv"), tokenizer, tmp_path / "cache")


def test_tokenizer_json_path_and_transformers_wrapper(tmp_path, tokenizer) -> None:
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    documents = ["some text", "more text"]
    url = write_jsonl(tmp_path / "a.jsonl", documents)
    (path,) = chute.tokenize_shards(url, str(tmp_path / "tokenizer.json"), tmp_path / "cache")
    assert_tokens(path, tokenizer, documents)

    class FastTokenizer:  # what a transformers PreTrainedTokenizerFast exposes
        backend_tokenizer = tokenizer

    assert chute.tokenize_shards(url, FastTokenizer(), tmp_path / "cache") == [path]


def reference_windows(stream: list[int], seq_len: int) -> list[tuple[list[int], list[int]]]:
    """nanoGPT's windows: seq_len + 1 tokens every seq_len tokens."""
    count = (len(stream) - 1) // seq_len if len(stream) > seq_len else 0
    windows = [stream[i * seq_len : (i + 1) * seq_len + 1] for i in range(count)]
    return [(w[:-1], w[1:]) for w in windows]


def test_token_dataset_from_text_packs_the_tokens(tmp_path, tokenizer, encode_calls) -> None:
    rng = np.random.default_rng(13)
    lines, samples = make_documents(rng, 30), make_documents(rng, 20)
    urls = [
        write_jsonl(tmp_path / "a.jsonl", lines),
        write_tar(tmp_path / "b.tar", samples, "json"),
    ]
    eod = tokenizer.token_to_id("<|endoftext|>")
    ds = chute.TokenDataset.from_text(urls, tokenizer, 16, cache_dir=tmp_path / "c", eod_id=eod)
    documents = expected_tokens(tokenizer, lines + samples, eod)
    expected = reference_windows([t for d in documents for t in d], 16)
    assert len(ds) == len(expected) > 10
    got = []
    for batch in chute.DataLoader(ds, batch_size=4, num_workers=2):
        got += list(zip(batch["input_ids"].tolist(), batch["labels"].tolist(), strict=True))
    assert got == expected
    assert len(encode_calls) == 2

    packed = chute.TokenDataset.from_text(
        urls, tokenizer, 16, cache_dir=tmp_path / "c", eod_id=eod, pack="documents"
    )
    assert packed.document_lengths().tolist() == [len(d) for d in documents]
    assert len(encode_calls) == 2  # the cache served the second dataset


def test_from_text_checks_the_vocabulary_with_the_recorded_ids(
    tmp_path, tokenizer, monkeypatch
) -> None:
    import chute.datasets.tokens

    documents = make_documents(np.random.default_rng(15), 30)
    url = write_jsonl(tmp_path / "a.jsonl", documents)
    eod = tokenizer.token_to_id("<|endoftext|>")
    (path,) = chute.tokenize_shards(url, tokenizer, tmp_path / "c", eod_id=eod)
    ids = np.concatenate(read_megatron(path)[1])
    manifest = json.loads(Path(path[: -len(".bin")] + ".json").read_text())
    assert (manifest["min_token_id"], manifest["max_token_id"]) == (ids.min(), ids.max())

    reads: list[str] = []
    real = chute.datasets.tokens._tokens_of
    monkeypatch.setattr(
        chute.datasets.tokens, "_tokens_of", lambda f: reads.append(f.path) or real(f)
    )
    ds = chute.TokenDataset.from_text(url, tokenizer, 8, cache_dir=tmp_path / "c", eod_id=eod)
    assert len(ds) > 0 and reads == []  # the manifest's ids, not a read of the file
    first = int(np.argmax(ids == ids.max()))
    with pytest.raises(
        chute.DataError,
        match=rf"{path}': token id {ids.max()} at byte offset {2 * first} is outside the"
        rf" vocabulary \(vocab_size {ids.max()}\)",
    ):
        chute.TokenDataset.from_text(
            url, tokenizer, 8, cache_dir=tmp_path / "c", eod_id=eod, vocab_size=int(ids.max())
        )


def test_remote_object_replaced_while_read_is_refused(
    tmp_path, tokenizer, object_server, monkeypatch
) -> None:
    lines = make_documents(np.random.default_rng(14), 30)
    object_server.objects["/d/a.jsonl"] = jsonl_bytes(lines)
    monkeypatch.setattr(text_shards, "READ_CHUNK_BYTES", 256)
    real_chunks = text_shards.TextShard.chunks

    def replacing(self):
        for i, chunk in enumerate(real_chunks(self)):
            if i == 1:
                object_server.objects["/d/a.jsonl"] = jsonl_bytes(lines[::-1])
            yield chunk

    monkeypatch.setattr(text_shards.TextShard, "chunks", replacing)
    with pytest.raises(chute.ReadError, match=r"/d/a\.jsonl"):
        chute.tokenize_shards(f"{object_server.url}/d/a.jsonl", tokenizer, tmp_path / "cache")
    assert not [n for n in os.listdir(tmp_path / "cache") if not n.startswith(".")]


def test_remote_gzip_that_does_not_inflate(tmp_path, tokenizer, object_server) -> None:
    object_server.objects["/d/bad.tar.gz"] = b"\x1f\x8b\x08\x00" + bytes(40)
    with pytest.raises(chute.DataError, match=r"bad\.tar\.gz: the gzip stream does not inflate"):
        chute.tokenize_shards(f"{object_server.url}/d/bad.tar.gz", tokenizer, tmp_path / "c")


def _tokenize_as_rank(rank: int, urls: list[str], tokenizer_path: str, work: str, barrier) -> None:
    """One rank of test_ranks_tokenize_into_one_cache_at_once, in its own
    process: logs each entry it writes, then saves its dataset's sequences."""
    real_finish = cache_entries.EntryWriter.finish

    def logged(self, description):
        real_finish(self, description)
        with open(os.path.join(work, "written.log"), "a") as f:
            f.write(os.path.basename(self.entry.stem) + "\n")

    cache_entries.EntryWriter.finish = logged
    tokenizer = Tokenizer.from_file(tokenizer_path)
    eod = tokenizer.token_to_id("<|endoftext|>")
    barrier.wait(timeout=120)
    ds = chute.TokenDataset.from_text(
        urls, tokenizer, 16, cache_dir=os.path.join(work, "cache"), eod_id=eod
    )
    np.save(os.path.join(work, f"rank{rank}.npy"), np.stack([s["input_ids"] for s in ds]))


def test_ranks_tokenize_into_one_cache_at_once(tmp_path, tokenizer) -> None:
    import multiprocessing

    rng = np.random.default_rng(16)
    shards = [make_documents(rng, 150) for _ in range(6)]
    urls = [write_jsonl(tmp_path / f"part-{i}.jsonl", d) for i, d in enumerate(shards)]
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(3)
    ranks = [
        context.Process(
            target=_tokenize_as_rank,
            args=(rank, urls, str(tmp_path / "tokenizer.json"), str(tmp_path), barrier),
        )
        for rank in range(3)
    ]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout=300)
    assert [p.exitcode for p in ranks] == [0, 0, 0]

    # Each entry was written once, by one of the ranks; the others used it.
    eod = tokenizer.token_to_id("<|endoftext|>")
    paths = chute.tokenize_shards(urls, tokenizer, tmp_path / "cache", eod_id=eod, read_only=True)
    written = (tmp_path / "written.log").read_text().split()
    assert sorted(written) == sorted(os.path.basename(p)[: -len(".bin")] for p in paths)
    for path, documents in zip(paths, shards, strict=True):
        assert_tokens(path, tokenizer, documents, eod)
    assert sorted(os.listdir(tmp_path / "cache")) == sorted(
        os.path.basename(p)[: -len(".bin")] + suffix
        for p in paths
        for suffix in (".bin", ".idx", ".json")
    )
    sequences = [np.load(tmp_path / f"rank{rank}.npy") for rank in range(3)]
    tokens = [t for d in expected_tokens(tokenizer, [x for s in shards for x in s], eod) for t in d]
    expected = [inputs for inputs, _ in reference_windows(tokens, 16)]
    for rank_sequences in sequences:
        assert rank_sequences.tolist() == expected


def test_entry_left_by_a_dead_process_is_built_by_the_next(tmp_path, tokenizer) -> None:
    import multiprocessing

    documents = make_documents(np.random.default_rng(17), 40)
    url = write_jsonl(tmp_path / "a.jsonl", documents)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    dying = multiprocessing.get_context("fork").Process(
        target=_die_while_writing, args=(url, str(tmp_path / "tokenizer.json"), str(tmp_path))
    )
    dying.start()
    dying.join(timeout=300)
    assert dying.exitcode == 3
    left = os.listdir(tmp_path / "cache")
    assert any(n.endswith(".lock") for n in left) and any(".tmp-" in n for n in left)
    # The lock died with its holder: the next call builds the entry.
    (path,) = chute.tokenize_shards(url, tokenizer, tmp_path / "cache")
    assert_tokens(path, tokenizer, documents)
    assert not [n for n in os.listdir(tmp_path / "cache") if n.endswith(".lock")]


def _die_while_writing(url: str, tokenizer_path: str, work: str) -> None:
    def die(self, tokens, lengths):
        os._exit(3)

    cache_entries.EntryWriter.add = die
    chute.tokenize_shards(url, Tokenizer.from_file(tokenizer_path), os.path.join(work, "cache"))
