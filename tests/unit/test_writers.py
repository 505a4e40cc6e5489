"""Two writers of one index directory never lose or corrupt a version: `build_index` holds the
writer lock (as the ingestion job does), and a commit built from a version that is no longer
CURRENT is refused."""

from __future__ import annotations

import threading

import pytest

from llmframe_ray.config import load_settings
from llmframe_ray.index import atomic
from llmframe_ray.index.versions import IndexBusyError, IndexDirectory
from llmframe_ray.ingest.build import build_index
from llmframe_ray.types import Document

DOCS = [
    Document("tides", title="Tides", text="Ocean tides are driven mainly by the gravitational pull of the Moon."),
    Document("bread", title="Bread", text="A sourdough starter is a culture of wild yeast and lactic acid bacteria."),
]
PARAMS = load_settings().params().index


def test_a_build_while_another_writer_runs_fails_at_once_and_touches_nothing(tmp_path, embedder):
    index = tmp_path / "index"
    first = build_index(DOCS, index, PARAMS, embedder)
    directory = IndexDirectory(index)
    with directory.writer_lock():  # another writer (a job) is running, with its staging folder
        staging = atomic.temp_sibling(index / "staging")
        staging.mkdir()
        (staging / "part-0.npy").write_bytes(b"embeddings so far")
        with pytest.raises(IndexBusyError, match="another process is writing"):
            build_index(DOCS[:1], index, PARAMS, embedder)
        assert (staging / "part-0.npy").read_bytes() == b"embeddings so far"
    assert directory.current_version() == first and directory.versions() == [first]


def test_two_builds_at_once_publish_one_whole_version(tmp_path, embedder):
    index = tmp_path / "index"
    outcomes: list[object] = []
    gate = threading.Barrier(2)

    def build(docs):
        gate.wait()
        try:
            outcomes.append(build_index(docs, index, PARAMS, embedder))
        except IndexBusyError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=build, args=(docs,)) for docs in (DOCS, DOCS[:1])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    published = [o for o in outcomes if isinstance(o, str)]
    assert len(published) == 1 and len(outcomes) == 2
    loaded = IndexDirectory(index).load(verify=True)
    assert loaded.version == published[0] and IndexDirectory(index).versions() == published


def test_a_version_built_from_a_stale_base_is_not_published(tmp_path, embedder):
    index = tmp_path / "index"
    first = build_index(DOCS, index, PARAMS, embedder)
    directory = IndexDirectory(index)
    shard = directory.load().shards[0]
    version, tmp = directory.stage()
    shard.save(tmp / "shard-0000")
    second = build_index(DOCS[:1], index, PARAMS, embedder)  # another machine published meanwhile
    with pytest.raises(IndexBusyError) as caught:
        directory.commit(version, tmp, 1, base=first)
    assert str(caught.value) == (
        f"{index / 'CURRENT'} changed from {first} to {second} while version {version} was being built "
        f"from {first}; nothing was published: run it again"
    )
    assert directory.current_version() == second and not tmp.exists()
    assert directory.versions() == [first, second]
