"""ChunkStore and Manifest: round trips and the exact errors of bad manifests."""

from __future__ import annotations

import json
import mmap

import numpy as np
import pytest

from llmframe_ray.errors import IndexLoadError
from llmframe_ray.index.manifest import FORMAT_VERSION, Manifest, describe_file
from llmframe_ray.index.store import ChunkStore
from llmframe_ray.types import Chunk

CHUNKS = [
    Chunk("a#0", "doc-a", 0, "Plain ASCII text.", "Title A", start=0, end=17, n_tokens=5),
    Chunk("a#1", "doc-a", 1, 'Quotes " \\ and\nnewlines', "Title A", start=15, end=42, n_tokens=9),
    Chunk("b#0", "doc-b", 0, "Ünïcödé: 日本語のテキスト, emoji 🚀, RTL שלום", start=0, end=33, n_tokens=20),
    Chunk("a#2", "doc-a", 2, "", title="", start=40, end=40, n_tokens=0),
    Chunk("c#0", "doc-ç", 0, "zero-width\u200bjoiner and \u0000 nul", start=3, end=30, n_tokens=7),
]


@pytest.mark.parametrize("mmap", [True, False])
def test_store_round_trip_keeps_every_field(tmp_path, mmap):
    ChunkStore.from_chunks(CHUNKS).save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "chunks.bin",
        "chunks.doc_index.npy",
        "chunks.docs.json",
        "chunks.offsets.npy",
    ]
    store = ChunkStore.load(tmp_path, mmap=mmap)
    assert len(store) == 5
    assert [store.get(i) for i in range(5)] == CHUNKS
    assert list(store) == CHUNKS
    assert store.get_many([4, 0, 4]) == [CHUNKS[4], CHUNKS[0], CHUNKS[4]]
    assert store.doc_ids == ["doc-a", "doc-a", "doc-b", "doc-a", "doc-ç"]
    assert store.doc_id(2) == "doc-b"
    assert store.doc_table == ("doc-a", "doc-b", "doc-ç")
    assert store.doc_index.tolist() == [0, 0, 1, 0, 2]
    assert (store.n_documents, store.max_chunks_per_doc) == (3, 3)


def test_store_files_are_concatenated_json_and_offsets(tmp_path):
    ChunkStore.from_chunks(CHUNKS[:2]).save(tmp_path)
    data = (tmp_path / "chunks.bin").read_bytes()
    offsets = np.load(tmp_path / "chunks.offsets.npy")
    assert offsets.dtype == np.int64 and offsets.tolist()[0] == 0 and offsets[-1] == len(data)
    first = json.loads(data[offsets[0] : offsets[1]].decode("utf-8"))
    assert first == {
        "chunk_id": "a#0",
        "doc_id": "doc-a",
        "position": 0,
        "text": "Plain ASCII text.",
        "title": "Title A",
        "start": 0,
        "end": 17,
        "n_tokens": 5,
    }


def test_store_memory_maps_its_files(tmp_path):
    ChunkStore.from_chunks(CHUNKS).save(tmp_path)
    store = ChunkStore.load(tmp_path, mmap=True)
    assert _mapped(store.doc_index) and _mapped(store._data) and _mapped(store._offsets)
    assert not _mapped(ChunkStore.load(tmp_path, mmap=False).doc_index)
    assert store.get(2) == CHUNKS[2]


def _mapped(array: np.ndarray) -> bool:
    """Whether the array's memory is a memory-mapped file (its base chain ends in an mmap)."""
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, mmap.mmap)


def test_store_rejects_rows_out_of_range():
    store = ChunkStore.from_chunks(CHUNKS)
    for row in (5, -1):
        with pytest.raises(IndexError, match=f"row {row} is out of range for a store of 5 chunks"):
            store.get(row)
        with pytest.raises(IndexError, match=f"row {row} is out of range for a store of 5 chunks"):
            store.get_many([0, row])


def test_a_damaged_record_fails_a_read_of_many_as_it_fails_a_read_of_one(tmp_path):
    ChunkStore.from_chunks(CHUNKS).save(tmp_path)
    path = tmp_path / "chunks.bin"
    data = bytearray(path.read_bytes())
    first_end = int(np.load(tmp_path / "chunks.offsets.npy")[1])
    data[first_end - 1 : first_end] = b","  # the first record's closing brace, same length
    path.write_bytes(bytes(data))
    store = ChunkStore.load(tmp_path, mmap=False)
    with pytest.raises(ValueError) as one:
        store.get(0)
    with pytest.raises(ValueError) as many:
        store.get_many([0, 1, 2])
    assert str(many.value) == str(one.value)
    assert store.get_many([1, 2]) == CHUNKS[1:3]  # the others still read


def test_store_detects_a_truncated_bin_file(tmp_path):
    ChunkStore.from_chunks(CHUNKS).save(tmp_path)
    path = tmp_path / "chunks.bin"
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(ValueError, match="chunks.bin has .* bytes but its offsets end at"):
        ChunkStore.load(tmp_path)


def make_manifest() -> Manifest:
    return Manifest(
        model={"name": "all-MiniLM-L6-v2", "provider": "local", "dim": 384, "max_length": 256},
        parameters={
            "chunking": {"chunk_size": 256, "chunk_overlap": 32},
            "dense": {"kind": "flat", "ivf_nlist": None},
            "sparse": {"k1": 1.5, "b": 0.75, "stopwords": "en"},
        },
        counts={"documents": 3, "chunks": 5},
        max_chunks_per_doc=3,
        files={"dense.faiss": {"bytes": 12, "sha256": "ab" * 32}},
        created_at="2025-01-31T12:00:00+00:00",
    )


def test_manifest_round_trip(tmp_path):
    manifest = make_manifest()
    manifest.save(tmp_path / "manifest.json")
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]
    loaded = Manifest.load(tmp_path / "manifest.json")
    assert loaded == manifest
    assert loaded.format_version == FORMAT_VERSION == 1
    assert Manifest.from_json(manifest.to_json()) == manifest
    assert loaded.to_dict()["parameters"]["chunking"] == {"chunk_size": 256, "chunk_overlap": 32}
    assert loaded.model["dim"] == 384
    with pytest.raises(TypeError):
        loaded.model["dim"] = 3  # nested values are read-only


def test_manifest_created_at_defaults_to_utc_now():
    manifest = Manifest(model={}, parameters={}, counts={}, max_chunks_per_doc=0)
    assert manifest.created_at.endswith("+00:00")


def write_manifest(tmp_path, **changes) -> str:
    data = make_manifest().to_dict()
    for key, value in changes.items():
        if value is None:
            del data[key]
        else:
            data[key] = value
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("version", [0, 2, "1", None])
def test_manifest_rejects_unknown_format_versions(tmp_path, version):
    path = write_manifest(tmp_path, format_version=version)
    with pytest.raises(IndexLoadError) as err:
        Manifest.load(path)
    assert str(err.value) == (
        f"{path}: unsupported index format version {version!r}; this release reads version 1"
    )


def test_manifest_names_missing_keys(tmp_path):
    path = write_manifest(tmp_path, counts=None, files=None)
    with pytest.raises(IndexLoadError) as err:
        Manifest.load(path)
    assert str(err.value) == f"{path}: manifest is missing keys: counts, files"


def test_manifest_missing_or_not_json(tmp_path):
    path = tmp_path / "manifest.json"
    with pytest.raises(IndexLoadError) as err:
        Manifest.load(path)
    assert str(err.value) == f"{path}: manifest file is missing"
    path.write_text('{"format_version": 1,', encoding="utf-8")
    with pytest.raises(IndexLoadError, match=r"manifest\.json: manifest is not valid JSON \("):
        Manifest.load(path)
    path.write_text("[1]", encoding="utf-8")
    with pytest.raises(IndexLoadError) as err:
        Manifest.load(path)
    assert str(err.value) == f"{path}: manifest must be a JSON object"


def test_describe_file(tmp_path):
    (tmp_path / "f").write_bytes(b"abc")
    assert describe_file(tmp_path / "f") == {
        "bytes": 3,
        "sha256": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
    }


def test_shared_document_keys_sort_like_the_ids_across_stores():
    from llmframe_ray.index.store import share_document_keys

    first = ChunkStore.from_chunks([Chunk(f"{d}#0", d, 0, "x") for d in ("b", "d", "d10", "d9")])
    second = ChunkStore.from_chunks([Chunk(f"{d}#{i}", d, i, "x") for d, i in (("a", 0), ("c", 0), ("c", 1), ("d2", 0))])
    rows = np.arange(4)
    assert first.doc_keys_of(rows).tolist() == ["b", "d", "d10", "d9"]  # the ids until shared
    given = first
    first, second = share_document_keys([first, second])
    assert given.doc_keys_of(rows).tolist() == ["b", "d", "d10", "d9"]  # the copies have keys
    assert first.get(1) == given.get(1)
    keys = {**dict(zip(first.doc_ids_of(rows).tolist(), first.doc_keys_of(rows).tolist())),
            **dict(zip(second.doc_ids_of(rows).tolist(), second.doc_keys_of(rows).tolist()))}
    assert sorted(keys, key=keys.get) == sorted(keys)  # "d10" < "d2" < "d9", as strings
    assert sorted(keys.values()) == list(range(7))
    assert second.doc_keys_of(np.array([1, 2])).tolist() == [keys["c"], keys["c"]]
    assert first.doc_keys_of(rows).dtype == np.int64
