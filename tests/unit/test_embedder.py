import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from llmframe_ray.errors import EmptyQueryError, ModelError, QueryTooLongError
from llmframe_ray.models.embedder import OnnxEmbedder, OpenAIEmbedder
from llmframe_ray.models.export import bundled_minilm_path

TEXTS = [
    "Reciprocal rank fusion combines ranked lists without calibrating their scores.",
    "BM25 ranks documents by term frequency and inverse document frequency.",
    "short",
    "A much longer passage about the thermodynamics of protein folding in crowded cellular "
    "environments, where excluded volume effects stabilise the native state. " * 6,
]


def test_onnx_matches_sentence_transformers(embedder):
    """Parity with the reference implementation: cosine >= 0.999 per text."""
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(bundled_minilm_path()), device="cpu")
    expected = reference.encode(TEXTS, normalize_embeddings=True, batch_size=4)
    got = embedder.embed(TEXTS)
    assert got.shape == (len(TEXTS), 384) and got.dtype == np.float32
    cosines = (got * expected).sum(axis=1)
    assert cosines.min() >= 0.999, cosines
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-5)


def test_batched_equals_one_by_one(embedder):
    batched = embedder.embed(TEXTS)
    single = np.vstack([embedder.embed([t]) for t in TEXTS])
    np.testing.assert_allclose(batched, single, atol=1e-5)


def test_split_steps_compose_to_embed(embedder):
    batch = embedder.tokenize(TEXTS[:2])
    pooled = embedder.pool(embedder.run(batch), batch.attention_mask)
    np.testing.assert_allclose(pooled, embedder.embed(TEXTS[:2]), atol=1e-6)


def test_empty_input_gives_empty_matrix(embedder):
    assert embedder.embed([]).shape == (0, 384)


@pytest.mark.parametrize("query", ["", "   ", "\n\t"])
def test_empty_query_rejected(embedder, query):
    with pytest.raises(EmptyQueryError) as err:
        embedder.check_query(query)
    assert str(err.value) == "query is empty or whitespace only"


def test_query_over_model_limit_rejected(embedder):
    query = "word " * 300
    n_tokens = embedder.count_tokens([query.strip()])[0]
    with pytest.raises(QueryTooLongError) as err:
        embedder.check_query(query)
    assert str(err.value) == f"query is {n_tokens} tokens long; the embedding model accepts at most 256"
    assert embedder.check_query("  two words \n") == "two words"


def test_missing_model_file_is_named(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ModelError) as err:
        OnnxEmbedder(tmp_path)
    assert f"embedding model folder {tmp_path} has no model.onnx" in str(err.value)


def test_truncated_model_file(tmp_path, model_dir):
    (tmp_path / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    (tmp_path / "model.onnx").write_bytes((model_dir / "model.onnx").read_bytes()[:4096])
    with pytest.raises(ModelError, match=r"cannot load .*model\.onnx"):
        OnnxEmbedder(tmp_path)


class _FakeOpenAI(BaseHTTPRequestHandler):
    requests: list = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append((self.path, self.headers.get("Authorization"), body))
        dims = body.get("dimensions", 3)
        # vector i = (i+1, 0, 0, ...) unnormalised, answered in reverse order to test sorting
        data = [
            {"object": "embedding", "index": i, "embedding": [float(i + 1)] + [0.0] * (dims - 1)}
            for i in range(len(body["input"]))
        ][::-1]
        payload = json.dumps(
            {"object": "list", "data": data, "model": body["model"], "usage": {"prompt_tokens": 1, "total_tokens": 1}}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


def test_openai_embedder_against_local_server():
    _FakeOpenAI.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeOpenAI)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        emb = OpenAIEmbedder(
            model="text-embedding-3-small",
            api_key="sk-local",
            dimensions=4,
            base_url=f"http://127.0.0.1:{server.server_port}/v1",
            batch_size=2,
        )
        vectors = emb.embed(["a", "b", "c"])
    finally:
        server.shutdown()
        thread.join()
    assert vectors.shape == (3, 4)
    np.testing.assert_allclose(vectors, np.tile([1.0, 0, 0, 0], (3, 1)).astype(np.float32))
    assert [r[2]["input"] for r in _FakeOpenAI.requests] == [["a", "b"], ["c"]]
    assert {r[0] for r in _FakeOpenAI.requests} == {"/v1/embeddings"}
    assert {r[1] for r in _FakeOpenAI.requests} == {"Bearer sk-local"}
    assert {r[2]["dimensions"] for r in _FakeOpenAI.requests} == {4}
    assert emb.info() == {"name": "text-embedding-3-small", "provider": "openai", "dim": 4, "max_length": 8191}


def test_a_checked_query_is_tokenized_once_and_embeds_the_same(embedder):
    embedder._checked.clear()  # the embedder is shared by the tests of this session
    queries = [embedder.check_query(t) for t in TEXTS[:3]]  # each checked, as a search does
    calls = []
    real = embedder._tokenizer

    class Counting:
        def encode_batch(self, texts):
            calls.append(list(texts))
            return real.encode_batch(texts)

    embedder._tokenizer = Counting()
    try:
        checked = embedder.embed(queries + [TEXTS[3]])  # the long text was never checked
        again = embedder.embed(queries)  # their encodings were taken: tokenized afresh
    finally:
        embedder._tokenizer = real
    assert calls == [[TEXTS[3]], queries]
    np.testing.assert_array_equal(checked[:3], again)
    np.testing.assert_allclose(checked, embedder.embed(TEXTS), atol=1e-6)
    assert embedder._checked == {}


def test_the_solo_session_gives_the_same_vectors_bit_for_bit(model_dir):
    """A query that has the machine to itself runs through a wider session (serve/activity.py);
    its vector must not depend on which session ran it."""
    embedder = OnnxEmbedder(model_dir, threads=1, solo_threads=2)
    assert embedder.solo_threads == 2
    options = embedder._solo_session.get_session_options()
    assert options.intra_op_num_threads == 2
    assert options.get_session_config_entry("session.force_spinning_stop") == "1"
    assert embedder._session.get_session_options().intra_op_num_threads == 1
    for text in TEXTS:
        assert embedder.embed([text], solo=True).tobytes() == embedder.embed([text]).tobytes()
    assert embedder.embed(TEXTS, solo=True).tobytes() == embedder.embed(TEXTS).tobytes()


@pytest.mark.parametrize("solo_threads", [0, 1, 2])
def test_no_solo_session_without_more_threads_than_its_own(model_dir, solo_threads):
    embedder = OnnxEmbedder(model_dir, threads=2, solo_threads=solo_threads)
    assert embedder.solo_threads == 0 and embedder._solo_session is embedder._session
    assert embedder.embed(TEXTS, solo=True).tobytes() == embedder.embed(TEXTS).tobytes()
