"""The version cache of a group of shards behind ShardGroup and the Retriever (plain Python, no Ray)."""

import asyncio

from llmframe_ray.config import load_settings
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.ingest.build import build_index
from llmframe_ray.retrieve.plan import Ranker, ReadChunks, SearchShard
from llmframe_ray.retrieve.shard_cache import ShardCache
from llmframe_ray.types import Document


def test_an_older_version_asked_for_again_is_loaded_and_served(tmp_path, embedder):
    settings = load_settings()
    root = tmp_path / "index"
    versions = []
    for n in range(3):
        docs = [Document(f"d{i}", text=f"a short note about {fruit}") for i, fruit in enumerate(["apple", "banana", "cherry", "damson"][: n + 2])]
        versions.append(build_index(docs, root, settings.params().index, embedder))
    server = ShardCache(str(root), [0], settings.params().retrieval, keep_versions=2)
    assert server.loaded_versions() == [versions[2]]

    async def sizes():
        out = []
        for version in (versions[1], versions[0], versions[2], versions[0]):
            shard = await server.version(version)
            out.append(len(shard[0]))
        return out

    assert asyncio.run(sizes()) == [3, 2, 4, 2]
    assert server.loaded_versions() == [versions[2], versions[0]]  # the two most recently used
    found, chunks = asyncio.run(server.answer(versions[0], [SearchShard(Ranker.BM25, 0, ["banana"], 1), ReadChunks(0, (1,))]))
    assert [(row, score) for row, score, _ in found.as_lists()[0]] == [(1, found.scores[0].item())]
    assert [c.doc_id for c in chunks] == ["d1"]
    assert IndexDirectory(root).current_version() == versions[2]


def test_document_keys_are_integers_only_where_one_group_holds_every_shard(tmp_path, embedder):
    # Integer keys are shared by the shards one process loads together; groups holding some of
    # the shards answer the ids, which compare the same way across groups.
    settings = load_settings()
    root = tmp_path / "index"
    docs = [Document(f"d{i}", text=f"a short note about fruit number {i}") for i in range(12)]
    version = build_index(docs, root, settings.params().index, embedder, shards=3)
    searches = [SearchShard(Ranker.BM25, shard, ["fruit"], 20) for shard in range(3)]
    whole = asyncio.run(ShardCache(str(root), [0, 1, 2], settings.params().retrieval).answer(version, searches))
    parts = [asyncio.run(ShardCache(str(root), [s], settings.params().retrieval).answer(version, [searches[s]]))[0] for s in range(3)]
    ids = [doc for part in parts for doc in part.doc_keys.tolist()]
    keys = [key for answer in whole for key in answer.doc_keys.tolist()]
    assert sorted(ids) == sorted(f"d{i}" for i in range(12)) == sorted(ids, key=lambda d: keys[ids.index(d)])
    assert all(isinstance(key, int) for key in keys) and sorted(keys) == list(range(12))


def test_a_group_of_shards_is_prepared_for_joint_search_as_its_version_loads(tmp_path, embedder):
    from llmframe_ray.retrieve import joint
    from llmframe_ray.retrieve.plan import SearchShards

    settings = load_settings()
    root = tmp_path / "index"
    docs = [Document(f"d{i}", text=f"a short note about fruit number {i}") for i in range(12)]
    version = build_index(docs, root, settings.params().index, embedder, shards=3)
    cache = ShardCache(str(root), [0, 1, 2], settings.params().retrieval)
    loaded = asyncio.run(cache.version(version))
    live = [loaded[n] for n in (0, 1, 2) if loaded[n] is not None]
    group = joint._GROUPS[live[0]][1]
    assert group._postings is not None and len(group) == 12  # made at load, before any query
    (answer,) = asyncio.run(cache.answer(version, [SearchShards(Ranker.BM25, (0, 1, 2), ["fruit"], 20)]))
    assert joint._GROUPS[live[0]][1] is group and sorted(answer.doc_keys.tolist()) == list(range(12))
