"""IndexShard save/load and IndexDirectory versions, including interrupted publishes."""

from __future__ import annotations

import asyncio
import json
import os

import numpy as np
import pytest

from llmframe_ray.errors import IndexLoadError
from llmframe_ray.index import atomic
from llmframe_ray.index.dense import DenseParams
from llmframe_ray.index.shard import IndexShard
from llmframe_ray.index.sparse import SparseParams
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.types import Chunk

TEXTS = [
    ("doc-1", "Solar panels", "Photovoltaic cells turn sunlight into electricity."),
    ("doc-1", "Solar panels", "Panel efficiency drops as the cells get hot."),
    ("doc-2", "Wind power", "Wind turbines turn moving air into electricity."),
    ("doc-3", "", "Batteries store electricity for cloudy days: 🔋 ünïcode."),
    ("doc-2", "Wind power", "Offshore turbines see stronger, steadier wind."),
    ("doc-4", "Tides", "Tidal power uses the moon's pull on the oceans."),
]
DIM = 12
MODEL = {"name": "test-encoder", "provider": "local", "dim": DIM, "max_length": 64}
CHUNKING = {"chunk_size": 64, "chunk_overlap": 8}
QUERIES = ["electricity from sunlight", "wind turbines", "moon", "the of"]


def make_chunks() -> list[Chunk]:
    positions: dict[str, int] = {}
    chunks = []
    for doc_id, title, text in TEXTS:
        pos = positions.setdefault(doc_id, 0)
        positions[doc_id] = pos + 1
        chunks.append(Chunk(f"{doc_id}#{pos}", doc_id, pos, text, title=title, end=len(text)))
    return chunks


def make_vectors(n: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def build_shard(kind: str = "flat", seed: int = 0) -> IndexShard:
    chunks = make_chunks()
    return IndexShard.build(
        chunks,
        make_vectors(len(chunks), seed),
        dense=DenseParams(kind=kind, hnsw_m=8, ivf_nlist=2, ivf_nprobe=2),
        sparse=SparseParams(),
        model=MODEL,
        chunking=CHUNKING,
    )


def answers(shard: IndexShard) -> tuple:
    """Everything a shard answers for a fixed set of queries."""
    query_vectors = make_vectors(3, seed=99)
    return (
        shard.search_dense(query_vectors, 4),
        shard.search_sparse(QUERIES, 4),
        shard.chunks(range(len(shard))),
        [shard.doc_id(row) for row in range(len(shard))],
    )


# shards


def test_build_fills_the_manifest():
    shard = build_shard()
    manifest = shard.manifest
    assert dict(manifest.counts) == {"documents": 4, "chunks": 6}
    assert manifest.max_chunks_per_doc == 2
    assert dict(manifest.model) == MODEL
    assert manifest.to_dict()["parameters"] == {
        "chunking": CHUNKING,
        "dense": DenseParams(kind="flat", hnsw_m=8, ivf_nlist=2, ivf_nprobe=2).to_dict(),
        "sparse": SparseParams().to_dict(),
    }


def test_auto_extends_an_index_of_any_dense_kind_a_named_kind_only_its_own():
    from llmframe_ray.index.params import ChunkingParams, IndexParams

    manifest = build_shard("hnsw").manifest  # as `auto` records a shard it built as HNSW
    chunking = ChunkingParams(**CHUNKING)
    auto = IndexParams(chunking=chunking, dense=DenseParams(hnsw_m=8, ivf_nlist=2))
    assert auto.mismatch(manifest, MODEL) is None
    assert auto.mismatch(build_shard("flat").manifest, MODEL) is None
    flat = IndexParams(chunking=chunking, dense=DenseParams(kind="flat", hnsw_m=8, ivf_nlist=2))
    assert flat.mismatch(manifest, MODEL) == (
        "the index's dense shards were built with {'kind': 'hnsw', 'hnsw_m': 8, 'hnsw_ef_construction': 200, "
        "'ivf_nlist': 2}, these settings give {'kind': 'flat', 'hnsw_m': 8, 'hnsw_ef_construction': 200, 'ivf_nlist': 2}"
    )
    wider = IndexParams(chunking=chunking, dense=DenseParams(hnsw_m=16, ivf_nlist=2))
    assert wider.mismatch(manifest, MODEL) == (
        "the index's dense shards were built with {'hnsw_m': 8, 'hnsw_ef_construction': 200, 'ivf_nlist': 2}, "
        "these settings give {'hnsw_m': 16, 'hnsw_ef_construction': 200, 'ivf_nlist': 2}"
    )
    # the threshold is part of what an `auto` index's content depends on (the eval cache key)
    assert auto.identity(MODEL)["dense"]["flat_max_rows"] == 20_000
    assert "flat_max_rows" not in flat.identity(MODEL)["dense"]


def test_search_dense_and_sparse_return_rows_and_scores():
    shard = build_shard()
    vectors = make_vectors(6)
    dense = shard.search_dense(vectors[[2, 5]], 2)
    assert [[row for row, _ in hits] for hits in dense][0][0] == 2
    assert dense[1][0][0] == 5 and dense[1][0][1] == pytest.approx(1.0, abs=1e-6)
    sparse = shard.search_sparse(["turbines", "the of"], 10)
    # Rows follow (doc_id, position): the wind chunks (inputs 2 and 4) are rows 2 and 3.
    # Both hold "turbines" once; the shorter one (row 2) scores higher.
    assert [row for row, _ in sparse[0]] == [2, 3]
    assert sparse[1] == []
    assert shard.chunk(4).text.endswith("ünïcode.") and shard.doc_id(3) == "doc-2"
    assert len(shard) == 6


def test_rows_are_stored_in_doc_id_then_position_order():
    chunks = make_chunks()
    vectors = make_vectors(len(chunks))
    order = [5, 3, 1, 4, 0, 2]
    shard = IndexShard.build(
        [chunks[i] for i in order], vectors[order],
        dense=DenseParams(), sparse=SparseParams(), model=MODEL, chunking=CHUNKING,
    )
    expected = sorted(chunks, key=lambda c: (c.doc_id, c.position))
    assert [shard.chunk(row) for row in range(len(shard))] == expected
    # each row's vector moved with its chunk: searching a chunk's own vector finds its row
    for i, chunk in enumerate(chunks):
        (row, score), *_ = shard.search_dense(vectors[[i]], 1)[0]
        assert shard.chunk(row).chunk_id == chunk.chunk_id and score == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
@pytest.mark.parametrize("mmap", [True, False])
def test_shard_save_load_round_trip(tmp_path, kind, mmap):
    shard = build_shard(kind)
    manifest = shard.save(tmp_path / "shard")
    assert sorted(os.listdir(tmp_path)) == ["shard"]  # the temporary directory is gone
    assert set(manifest.files) == {
        "dense.faiss",
        "chunks.bin",
        "chunks.offsets.npy",
        "chunks.docs.json",
        "chunks.doc_index.npy",
        "sparse/analyzer.json",
        "sparse/doc_lengths.npy",
        "sparse/data.csc.index.npy",
        "sparse/indices.csc.index.npy",
        "sparse/indptr.csc.index.npy",
        "sparse/params.index.json",
        "sparse/vocab.index.json",
    }
    for name, entry in manifest.files.items():
        assert entry["bytes"] == (tmp_path / "shard" / name).stat().st_size
    loaded = IndexShard.load(tmp_path / "shard", mmap=mmap, verify=True)
    assert loaded.manifest == manifest
    assert answers(loaded) == answers(shard)


def test_save_refuses_an_existing_path(tmp_path):
    (tmp_path / "shard").mkdir()
    with pytest.raises(FileExistsError, match="already exists; a shard is written once"):
        build_shard().save(tmp_path / "shard")


def test_build_validates_its_inputs():
    chunks = make_chunks()
    kwargs = dict(dense=DenseParams(), sparse=SparseParams(), model=MODEL, chunking=CHUNKING)
    with pytest.raises(ValueError, match="got 6 chunks but 5 embeddings; embeddings row i"):
        IndexShard.build(chunks, make_vectors(5), **kwargs)
    with pytest.raises(ValueError, match="has dim 12 but the embeddings have 8 columns"):
        IndexShard.build(chunks, make_vectors(6)[:, :8].copy(), **kwargs)
    with pytest.raises(ValueError, match="chunk id 'doc-1#0' occurs more than once"):
        IndexShard.build(chunks + chunks[:1], make_vectors(7), **kwargs)
    with pytest.raises(ValueError, match="model description is missing keys: max_length"):
        model = {"name": "m", "provider": "p", "dim": DIM}
        IndexShard.build(chunks, make_vectors(6), **{**kwargs, "model": model})
    with pytest.raises(ValueError, match="cannot build an index shard from zero chunks"):
        IndexShard.build([], make_vectors(0), **kwargs)


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "shard"
    build_shard().save(path)
    return path


def load_error(path, **kwargs) -> str:
    with pytest.raises(IndexLoadError) as err:
        IndexShard.load(path, **kwargs)
    return str(err.value)


def test_load_without_manifest_is_an_incomplete_shard(saved):
    (saved / "manifest.json").unlink()
    assert load_error(saved) == (
        f"{saved}: incomplete index shard (manifest.json is missing); rebuild it"
    )
    assert load_error(saved / "nope") == f"{saved / 'nope'}: index shard directory does not exist"


def test_load_detects_a_truncated_faiss_file(saved):
    path = saved / "dense.faiss"
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 10)
    assert load_error(saved) == (
        f"{saved}: file dense.faiss has {size - 10} bytes; the manifest says {size}"
    )


def test_load_detects_a_missing_file(saved):
    (saved / "sparse" / "vocab.index.json").unlink()
    assert load_error(saved) == (
        f"{saved}: file sparse/vocab.index.json listed in the manifest is missing"
    )


def test_verify_detects_changed_bytes_of_the_same_size(saved):
    path = saved / "chunks.bin"
    data = bytearray(path.read_bytes())
    data[5] ^= 0x01
    path.write_bytes(bytes(data))
    IndexShard.load(saved)  # sizes agree: only a checksum finds this
    assert load_error(saved, verify=True) == (
        f"{saved}: file chunks.bin does not match its SHA-256 in the manifest"
    )


def test_load_reports_a_corrupt_file_of_the_right_size(saved):
    path = saved / "dense.faiss"
    path.write_bytes(b"\0" * path.stat().st_size)
    assert load_error(saved).startswith(f"{saved}: cannot load index shard: ")


# versions


def test_publish_and_load(tmp_path):
    root = IndexDirectory(tmp_path / "index")
    assert root.current_version() is None and root.versions() == []
    shards = [build_shard(seed=1), build_shard("hnsw", seed=2), build_shard(seed=3)]
    first = root.publish(shards[:1])
    second = root.publish(shards[1:])
    assert first < second
    assert root.versions() == [first, second]
    assert root.current_version() == second
    assert (tmp_path / "index" / "CURRENT").read_text() == f"{second}\n"

    loaded = root.load()
    assert loaded.version == second and loaded.path == tmp_path / "index" / "versions" / second
    assert [len(s) for s in loaded.shards] == [6, 6]
    assert answers(loaded.shards[0]) == answers(shards[1])
    assert answers(loaded.shards[1]) == answers(shards[2])
    assert answers(root.load(first).shards[0]) == answers(shards[0])
    info = json.loads((loaded.path / "version.json").read_text())
    assert (info["version"], info["shards"]) == (second, 2)


def test_load_errors_name_the_problem(tmp_path):
    root = IndexDirectory(tmp_path / "index")
    with pytest.raises(IndexLoadError) as err:
        root.load()
    assert str(err.value) == (
        f"index directory {tmp_path / 'index'} does not exist; "
        "build one with `llmframe-ray index build`"
    )
    (tmp_path / "index").mkdir()
    with pytest.raises(IndexLoadError) as err:
        root.load()
    assert str(err.value) == (
        f"no published version in {tmp_path / 'index'}; build one with `llmframe-ray index build`"
    )
    version = root.publish([build_shard()])
    (tmp_path / "index" / "versions" / version / "version.json").unlink()
    with pytest.raises(IndexLoadError) as err:
        root.load()
    assert str(err.value) == (
        f"version {version} in {tmp_path / 'index'} is incomplete (version.json is missing)"
    )
    (tmp_path / "index" / "CURRENT").write_text("20990101T000000000000Z-abcdef\n")
    with pytest.raises(IndexLoadError) as err:
        root.load()
    assert str(err.value) == (
        f"{tmp_path / 'index' / 'CURRENT'} names version 20990101T000000000000Z-abcdef, which "
        f"does not exist in {tmp_path / 'index' / 'versions'}"
    )
    (tmp_path / "index" / "CURRENT").write_text("../../etc\n")
    with pytest.raises(IndexLoadError, match="CURRENT does not name a version: '../../etc'"):
        root.load()


class Crash(BaseException):
    """Stands for the process dying: no `except Exception` cleanup runs."""


def failing_after(monkeypatch, calls: int, error: BaseException) -> None:
    """Make the (calls + 1)-th atomic write fail, as a full disk or a crash would."""
    real = atomic.write_via
    count = {"n": 0}

    def write_via(path, write):
        if count["n"] == calls:
            raise error
        count["n"] += 1
        real(path, write)

    monkeypatch.setattr(atomic, "write_via", write_via)


def count_writes(monkeypatch, root: IndexDirectory, shards) -> int:
    real = atomic.write_via
    count = {"n": 0}

    def write_via(path, write):
        count["n"] += 1
        real(path, write)

    with monkeypatch.context() as m:
        m.setattr(atomic, "write_via", write_via)
        root.publish(shards)
    return count["n"]


@pytest.mark.parametrize("error", [OSError("disk full"), Crash()], ids=["error", "crash"])
def test_an_interrupted_publish_leaves_the_previous_version_served(tmp_path, monkeypatch, error):
    root = IndexDirectory(tmp_path / "index")
    old = root.publish([build_shard(seed=1)])
    expected = answers(root.load().shards[0])
    new_shards = [build_shard(seed=2), build_shard("ivf", seed=3)]
    total = count_writes(monkeypatch, IndexDirectory(tmp_path / "scratch"), new_shards)
    assert total > 10

    for calls in range(total):
        with monkeypatch.context() as m:
            failing_after(m, calls, error)
            with pytest.raises(type(error)):
                root.publish(new_shards)
        assert root.current_version() == old, calls
        loaded = root.load()
        assert loaded.version == old
        assert answers(loaded.shards[0]) == expected
        if isinstance(error, Crash):
            leftovers = root.remove_incomplete()
            # Only the last write (CURRENT itself) fails after the new version is in place.
            assert len(leftovers) == (0 if calls == total - 1 else 1), calls
        assert not any(atomic.is_temp_name(p.name) for p in (tmp_path / "index").rglob("*"))

    # After all that, publishing works and switches CURRENT.
    new = root.publish(new_shards)
    assert root.current_version() == new
    assert answers(root.load().shards[1]) == answers(new_shards[1])


def test_leftovers_of_a_crash_are_ignored_then_removed(tmp_path, monkeypatch):
    root = IndexDirectory(tmp_path / "index")
    old = root.publish([build_shard(seed=1)])
    with monkeypatch.context() as m:
        failing_after(m, 5, Crash())
        with pytest.raises(Crash):
            root.publish([build_shard(seed=2)])
    versions_dir = tmp_path / "index" / "versions"
    debris = [p for p in versions_dir.iterdir() if atomic.is_temp_name(p.name)]
    assert len(debris) == 1 and debris[0].is_dir()
    (tmp_path / "index" / ".CURRENT.tmp-0123456789ab").write_text("half")
    assert root.versions() == [old]
    assert root.load().version == old

    removed = root.remove_incomplete()
    assert sorted(removed) == sorted([debris[0], tmp_path / "index" / ".CURRENT.tmp-0123456789ab"])
    assert os.listdir(versions_dir) == [old]
    assert root.remove_incomplete() == []


def test_publish_refuses_zero_shards(tmp_path):
    with pytest.raises(ValueError, match="cannot publish a version with zero shards"):
        IndexDirectory(tmp_path).publish([])


def test_prune_keeps_the_newest_the_served_and_the_protected(tmp_path):
    root = IndexDirectory(tmp_path / "index")
    versions = [root.publish([build_shard(seed=i)]) for i in range(5)]
    (tmp_path / "index" / "CURRENT").write_text(versions[1] + "\n")  # serve an old one
    removed = root.prune(2, protect=[versions[2]])
    assert removed == [versions[0]]
    assert root.versions() == versions[1:]
    assert root.prune(1) == [versions[2], versions[3]]
    assert root.versions() == [versions[1], versions[4]]
    assert root.remove_incomplete() == []  # deleting left no debris
    with pytest.raises(ValueError, match="keep must be >= 1"):
        root.prune(0)


def test_commit_refuses_a_version_missing_an_expected_shard(tmp_path):
    root = IndexDirectory(tmp_path / "index")
    version, tmp = root.stage()
    build_shard(seed=1).save(tmp / "shard-0000")
    with pytest.raises(IndexLoadError, match=r"incomplete: shards \[1\] were not written"):
        root.commit(version, tmp, 2, expected={0, 1})
    assert root.current_version() is None and not tmp.exists()
    version, tmp = root.stage()
    build_shard(seed=1).save(tmp / "shard-0001")
    published = root.commit(version, tmp, 2, {"note": "x"}, expected={1})
    loaded = root.load()
    assert loaded.version == published and loaded.shard_ids == (1,) and loaded.info["empty_shards"] == [0]


def test_one_writer_at_a_time(tmp_path):
    from llmframe_ray.index.versions import IndexBusyError

    root = IndexDirectory(tmp_path / "index")
    with root.writer_lock():
        with pytest.raises(IndexBusyError, match="another process is writing"):
            with IndexDirectory(tmp_path / "index").writer_lock():
                pass
    with root.writer_lock():  # released
        pass


def test_bm25_over_shards_needs_corpus_wide_statistics():
    from llmframe_ray.index.sparse import CorpusStats
    from llmframe_ray.retrieve.facts import ShardFacts, bm25_consistency_problem

    chunks = make_chunks()
    split = [[c for c in chunks if c.doc_id in ("doc-1", "doc-3")], [c for c in chunks if c.doc_id not in ("doc-1", "doc-3")]]

    def shard(part, corpus=None):
        return IndexShard.build(part, make_vectors(len(part)), dense=DenseParams(), sparse=SparseParams(),
                                model=MODEL, chunking=CHUNKING, corpus=corpus)

    own = [shard(part) for part in split]
    facts = [ShardFacts.of(s) for s in own]
    assert bm25_consistency_problem(facts[:1]) is None
    assert "would rank differently from one index" in bm25_consistency_problem(facts)
    corpus = CorpusStats.merge([s.sparse.stats() for s in own])
    wide = [ShardFacts.of(shard(part, corpus)) for part in split]
    assert bm25_consistency_problem(wide) is None
    assert "would rank differently" in bm25_consistency_problem(wide[:1] + facts[1:])
    empty = ShardFacts(size=0, n_tokens=0, corpus=None, model={})
    assert bm25_consistency_problem(facts[:1] + [empty]) is None


@pytest.mark.parametrize("name", ["../outside.bin", "/etc/hostname", "sparse/../../outside.bin", "link.bin"])
def test_a_manifest_cannot_name_files_outside_its_shard(saved, name):
    outside = saved.parent / "outside.bin"
    outside.write_bytes(b"secret")
    (saved / "link.bin").symlink_to(outside)
    manifest = json.loads((saved / "manifest.json").read_text())
    manifest["files"][name] = {"bytes": 6, "sha256": "0" * 64}
    (saved / "manifest.json").write_text(json.dumps(manifest))
    assert load_error(saved) == f"{saved}: the manifest names {name!r}, which is not a file of this shard folder"


def test_serving_loads_check_checksums(tmp_path):
    from llmframe_ray.retrieve.params import RetrievalParams
    from llmframe_ray.retrieve.shard_cache import ShardCache

    directory = IndexDirectory(tmp_path / "index")
    version = directory.publish([build_shard()])
    path = directory.versions_dir / version / "shard-0000" / "chunks.bin"
    data = bytearray(path.read_bytes())
    data[5] ^= 0x01  # same size: only the checksum tells
    path.write_bytes(bytes(data))
    cache = ShardCache(str(tmp_path / "index"), [0], RetrievalParams())
    with pytest.raises(IndexLoadError, match="file chunks.bin does not match its SHA-256 in the manifest"):
        asyncio.run(cache.version(version))
    unchecked = ShardCache(str(tmp_path / "index"), [0], RetrievalParams(verify_on_load=False))
    assert asyncio.run(unchecked.version(version))[0] is not None
