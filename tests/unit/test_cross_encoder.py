"""The ONNX cross-encoder runtime, its model sources (local folder, hub download), and reranking."""

import hashlib
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from llmframe_ray.config import load_settings
from llmframe_ray.errors import ModelError
from llmframe_ray.models.cross_encoder import CrossEncoder, ScoreCache, rerank_order
from llmframe_ray.models.export import bundled_minilm_path, export_graph, quantize_int8
from llmframe_ray.models.sources import hub_target, load_reranker, resolve_model
from llmframe_ray.retrieve.rerank import RerankFusion, rerank_hits, score_fusion, unit_range
from llmframe_ray.train.warm_start import torch_scores
from llmframe_ray.types import Hit

PAIRS = [
    ("why do tides happen", "Ocean tides follow the gravitational pull of the Moon."),
    ("why do tides happen", "Sourdough bread rises because wild yeast ferments the dough."),
    ("what makes bread rise", "Sourdough bread rises because wild yeast ferments the dough. " * 20),
    ("x", "y"),
]
MAX_LENGTH = 64


@pytest.fixture(scope="module")
def tiny_model():
    """A small random BERT classifier (seeded) with the MiniLM tokenizer, in PyTorch."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=128, num_labels=1,
    )
    return BertForSequenceClassification(config).eval()


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory, tiny_model):
    folder = tmp_path_factory.mktemp("tiny-ce")
    export_graph(tiny_model, folder / "model.onnx", "logits")
    quantize_int8(folder / "model.onnx", folder / "model.int8.onnx")
    shutil.copyfile(bundled_minilm_path() / "tokenizer.json", folder / "tokenizer.json")
    tiny_model.config.to_json_file(str(folder / "config.json"))
    return folder


def reference_tokenizer():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(bundled_minilm_path() / "tokenizer.json"))
    tok.enable_truncation(max_length=MAX_LENGTH)
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    return tok


def test_onnx_scores_match_pytorch(model_folder, tiny_model):
    """fp32 ONNX equals the PyTorch model it was exported from within 1e-4 (absolute)."""
    encoder = CrossEncoder(model_folder, max_length=MAX_LENGTH, batch_size=3)
    expected = torch_scores(tiny_model, reference_tokenizer(), PAIRS)
    got = encoder.score_pairs(PAIRS)
    assert got.shape == (4,) and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, atol=1e-4)


def test_batch_equals_one_by_one(model_folder):
    encoder = CrossEncoder(model_folder, max_length=MAX_LENGTH, batch_size=4)
    batched = encoder.score_pairs(PAIRS)
    single = np.array([encoder.score_pairs([p])[0] for p in PAIRS])
    np.testing.assert_allclose(batched, single, atol=1e-5)


def test_split_steps_compose(model_folder):
    encoder = CrossEncoder(model_folder, max_length=MAX_LENGTH)
    query, passages = PAIRS[0][0], [p for _, p in PAIRS[:2]]
    batch = encoder.tokenize(query, passages)
    assert batch.input_ids.shape[1] <= MAX_LENGTH
    np.testing.assert_allclose(encoder.postprocess(encoder.run(batch)), encoder.score(query, passages), atol=1e-6)


def test_int8_is_close_to_fp32(model_folder):
    fp32 = CrossEncoder(model_folder, max_length=MAX_LENGTH).score_pairs(PAIRS)
    int8 = CrossEncoder(model_folder, precision="int8", max_length=MAX_LENGTH).score_pairs(PAIRS)
    assert not np.array_equal(fp32, int8)  # really the quantised graph
    np.testing.assert_allclose(int8, fp32, atol=0.05)


def test_an_int8_score_does_not_depend_on_the_batch_around_it(model_folder):
    """Dynamic int8 scales a MatMul's input by the whole tensor's range: run as one batch, the
    pairs' scores move with their neighbours. The encoder runs int8 pairs one by one, so a pair
    scores the same alone, among others, and with 1 or 2 threads."""
    two = CrossEncoder(model_folder, precision="int8", max_length=MAX_LENGTH, threads=2, batch_size=4)
    one = CrossEncoder(model_folder, precision="int8", max_length=MAX_LENGTH, threads=1)
    together = two.score_pairs(PAIRS)
    alone = np.array([one.score_pairs([pair])[0] for pair in PAIRS])
    assert together.tobytes() == alone.tobytes()
    assert two.score_pairs(PAIRS[::-1]).tobytes() == together[::-1].tobytes()
    as_one_batch = two.postprocess(two.run(two.tokenize_pairs(PAIRS)))
    assert not np.array_equal(as_one_batch, together)  # what a batched run would have given


def test_a_cached_score_is_the_models_and_skips_the_model(model_folder):
    """A repeated pair comes from the cache: the same bytes as the model's score, and the
    model sees only the pairs that are new."""
    plain = CrossEncoder(model_folder, precision="int8", max_length=MAX_LENGTH)
    cached = CrossEncoder(model_folder, precision="int8", max_length=MAX_LENGTH, threads=2, cache_size=100)
    expected = plain.score_pairs(PAIRS)
    run = cached.run
    seen = []
    cached.run = lambda batch: (seen.append(batch.input_ids.shape[0]), run(batch))[1]
    assert cached.score_pairs(PAIRS[:2]).tobytes() == expected[:2].tobytes()
    assert len(seen) == 2
    assert cached.score_pairs(PAIRS).tobytes() == expected.tobytes()
    assert len(seen) == len(PAIRS)  # the first two were not run again
    assert cached.score_pairs(PAIRS[::-1]).tobytes() == expected[::-1].tobytes()
    assert len(seen) == len(PAIRS)
    assert cached.cache.stats() == {"cache_hits": 2 + len(PAIRS), "cache_misses": len(PAIRS), "cache_pairs": len(PAIRS)}
    assert plain.cache is None


def test_score_cache_drops_the_least_recently_used():
    cache = ScoreCache(2)
    a, b, c = ScoreCache.key("q", "a"), ScoreCache.key("q", "b"), ScoreCache.key("q", "c")
    cache.put_many([a, b], [1.0, 2.0])
    assert cache.get_many([a]) == [1.0]  # a is now more recent than b
    cache.put_many([c], [3.0])
    assert cache.get_many([a, b, c]) == [1.0, None, 3.0]
    assert len(cache) == 2
    # the query/passage boundary is part of the key
    assert ScoreCache.key("ab", "c") != ScoreCache.key("a", "bc")
    with pytest.raises(ValueError, match="at least 1 pair, got capacity 0"):
        ScoreCache(0)


def test_the_setting_sizes_the_served_cache(model_folder):
    on = load_settings(reranker_model=str(model_folder)).params().reranker_model
    off = load_settings(reranker_model=str(model_folder), reranker_cache_size=0).params().reranker_model
    assert load_reranker(on).cache.capacity == 20000
    assert load_reranker(off).cache is None


def test_the_encoder_reads_the_window(model_folder):
    query = "when do spring tides happen"
    passage = "Coastal notes\n" + " ".join([f"Filler sentence {i} is about the weather only." for i in range(12)] + ["Spring tides happen when the Sun and the Moon line up."])
    windowed = CrossEncoder(model_folder, precision="int8", max_length=96, window=True)
    plain = CrossEncoder(model_folder, precision="int8", max_length=96)
    fitted = windowed.window.fit(query, passage)
    assert fitted != passage
    assert windowed.score(query, [passage]).tobytes() == plain.score(query, [fitted]).tobytes()
    assert not np.array_equal(plain.score(query, [passage]), plain.score(query, [fitted]))


def test_auto_precision_takes_the_quantised_file_where_there_is_one(model_folder, tmp_path):
    assert CrossEncoder(model_folder, precision="auto", max_length=MAX_LENGTH).precision.value == "int8"
    # a hub repo's named ONNX file: fp32 unless its quantised file is named
    assert CrossEncoder(model_folder, precision="auto", onnx_file="model.onnx").precision.value == "fp32"
    fp32_only = tmp_path / "fp32-only"
    shutil.copytree(model_folder, fp32_only)
    (fp32_only / "model.int8.onnx").unlink()
    assert CrossEncoder(fp32_only, precision="auto").precision.value == "fp32"
    assert load_settings().params().reranker_model.precision.value == "auto"
    assert load_settings().params().rerank.depth == 25


def test_empty_candidate_list(model_folder):
    encoder = CrossEncoder(model_folder, max_length=MAX_LENGTH)
    assert encoder.score("q", []).shape == (0,)
    assert rerank_hits("q", [], encoder, depth=50) == []


def test_missing_file_is_named(model_folder, tmp_path):
    shutil.copyfile(model_folder / "model.onnx", tmp_path / "model.onnx")
    with pytest.raises(ModelError) as err:
        CrossEncoder(tmp_path)
    assert str(err.value).startswith(f"reranker model folder {tmp_path} has no tokenizer.json; ")
    with pytest.raises(ModelError, match="has no model.int8.onnx"):
        CrossEncoder(model_folder.parent / model_folder.name, precision="int8", onnx_file="model.int8.onnx.missing")


def test_truncated_model_file(model_folder, tmp_path):
    shutil.copyfile(model_folder / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "model.onnx").write_bytes((model_folder / "model.onnx").read_bytes()[:2000])
    with pytest.raises(ModelError, match=r"cannot load .*model\.onnx: "):
        CrossEncoder(tmp_path)


def test_unknown_precision(model_folder):
    with pytest.raises(ValueError, match="unknown precision 'fp16'; valid precisions: fp32, int8"):
        CrossEncoder(model_folder, precision="fp16")


class ScriptedEncoder:
    """A stand-in cross-encoder with fixed scores per passage text (no model)."""

    def __init__(self, scores):
        self.scores = scores

    def score(self, query, passages):
        return np.array([self.scores[p] for p in passages], dtype=np.float32)


def hit(doc, rank):
    return Hit(doc_id=doc, chunk_id=f"{doc}#0", text=doc, score=1.0 / rank, rank=rank, ranks={"bm25": rank})


def test_rerank_head_then_tail_in_incoming_order():
    hits = [hit(d, i) for i, d in enumerate(["a", "b", "c", "d", "e"], 1)]
    encoder = ScriptedEncoder({"a": 0.1, "b": 2.0, "c": 2.0, "d": 9.0, "e": 50.0})
    out = rerank_hits("q", hits, encoder, depth=3)
    assert [h.doc_id for h in out] == ["b", "c", "a", "d", "e"]  # b, c tie: incoming order
    assert [h.rank for h in out] == [1, 2, 3, 4, 5]
    assert [h.score for h in out[:3]] == [2.0, 2.0, pytest.approx(0.1)]
    assert [dict(h.ranks) for h in out[:3]] == [{"bm25": 2, "rerank": 1}, {"bm25": 3, "rerank": 2}, {"bm25": 1, "rerank": 3}]
    assert out[3].score == hits[3].score and "rerank" not in out[3].ranks
    assert rerank_order([1.0, 3.0, 3.0, -1.0]) == [1, 2, 0, 3]


def test_score_fusion_puts_both_lists_on_one_scale():
    # first stage 1/rank; cross-encoder logits: d is far ahead, a and b nearly tied
    hits = [hit(d, i) for i, d in enumerate(["a", "b", "c", "d", "e"], 1)]
    encoder = ScriptedEncoder({"a": 1.0, "b": 1.2, "c": -3.0, "d": 9.0, "e": 50.0})
    out = rerank_hits("q", hits, encoder, depth=4, fusion=RerankFusion.SCORE, weight=0.5)
    # first on [0, 1]: a 1, b (0.5 - 0.25) / 0.75 = 1/3, c 1/9, d 0; cross-encoder: (x + 3) / 12
    expected = {"a": 1 + 0.5 * 4 / 12, "b": 1 / 3 + 0.5 * 4.2 / 12, "c": 1 / 9, "d": 0.5}
    assert [h.doc_id for h in out] == ["a", "b", "d", "c", "e"]
    assert [h.score for h in out[:4]] == pytest.approx([expected[d] for d in "abdc"])
    assert [h.ranks["rerank"] for h in out[:4]] == [3, 2, 1, 4]
    assert out[4].score == hits[4].score and out[4].rank == 5
    # weight 1: d's lead in the cross-encoder's scores now outweighs b's place in the first stage
    out = rerank_hits("q", hits, encoder, depth=4, fusion=RerankFusion.SCORE, weight=1.0)
    assert [h.doc_id for h in out] == ["a", "d", "b", "c", "e"]


def test_fusion_is_named_or_refused():
    hits = [hit(d, i) for i, d in enumerate(["a", "b", "c"], 1)]
    encoder = ScriptedEncoder({"a": 0.0, "b": 1.0, "c": 5.0})
    by_name = rerank_hits("q", hits, encoder, depth=3, fusion="score", weight=2.0)
    assert by_name == rerank_hits("q", hits, encoder, depth=3, fusion=RerankFusion.SCORE, weight=2.0)
    assert [h.doc_id for h in by_name] == ["c", "a", "b"]  # a 1 + 0; b 0.25 + 2 * 0.2; c 0 + 2
    with pytest.raises(ValueError, match="^unknown rerank fusion 'nearest'; valid rerank fusions: score, rrf, none$"):
        rerank_hits("q", hits, encoder, depth=3, fusion="nearest")
    with pytest.raises(ValueError, match="^unknown rerank fusion 10; "):  # not an RRF k, as the argument once was
        rerank_hits("q", hits, encoder, depth=3, fusion=10)
    with pytest.raises(ValueError, match="^the reranker's fusion weight must be >= 0, got -0.5$"):
        rerank_hits("q", hits, encoder, depth=3, fusion=RerankFusion.SCORE, weight=-0.5)


def test_score_fusion_edges():
    assert score_fusion([0.3], [7.0], 1.0) == [(0, 0.0)]  # one hit: nothing to order
    # equal cross-encoder scores order nothing: the first stage's order stays, ties in incoming order
    assert [i for i, _ in score_fusion([0.2, 0.2, 0.9], [4.0, 4.0, 4.0], 1.0)] == [2, 0, 1]
    np.testing.assert_array_equal(unit_range([2.0, 4.0, 3.0], "x"), [0.0, 1.0, 0.5])
    assert unit_range([], "x").shape == (0,)
    with pytest.raises(ValueError, match="^the cross-encoder gave a score that is not a finite number: nan$"):
        score_fusion([0.2, 0.1], [1.0, float("nan")], 1.0)
    with pytest.raises(ValueError, match="^the first stage gave a score that is not a finite number: inf$"):
        score_fusion([float("inf"), 0.1], [1.0, 2.0], 1.0)


class _FakeHub(BaseHTTPRequestHandler):
    files: dict = {}
    seen: list = []

    def _lookup(self):
        # /{owner}/{name}/resolve/{revision}/{path}
        parts = self.path.split("?")[0].lstrip("/").split("/")
        type(self).seen.append((self.command, "/".join(parts)))
        if len(parts) < 5 or parts[2] != "resolve":
            return None
        return self.files.get(("/".join(parts[:2]), parts[3], "/".join(parts[4:])))

    def _headers(self, body):
        self.send_header("X-Repo-Commit", "a" * 40)
        self.send_header("ETag", f'"{hashlib.sha256(body).hexdigest()}"')
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()

    def _answer(self, with_body: bool):
        body = self._lookup()
        if body is None:  # what the hub answers for a file that is not in the repo
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self._headers(body)
        if with_body:
            self.wfile.write(body)

    def do_HEAD(self):  # noqa: N802
        self._answer(with_body=False)

    def do_GET(self):  # noqa: N802
        self._answer(with_body=True)

    def log_message(self, *args):
        pass


@pytest.fixture
def hub(model_folder, monkeypatch):
    _FakeHub.files = {
        ("acme/tiny-reranker", "main", "onnx/model.onnx"): (model_folder / "model.onnx").read_bytes(),
        ("acme/tiny-reranker", "main", "tokenizer.json"): (model_folder / "tokenizer.json").read_bytes(),
        ("acme/tiny-reranker", "main", "config.json"): (model_folder / "config.json").read_bytes(),
        ("acme/no-tokenizer", "main", "onnx/model.onnx"): b"onnx",
    }
    _FakeHub.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield server
    server.shutdown()
    thread.join()


def test_download_from_hub_then_offline(hub, tmp_path, model_folder, monkeypatch):
    source = resolve_model("acme/tiny-reranker", cache_dir=tmp_path)
    assert source.model_dir == hub_target(tmp_path, "acme/tiny-reranker", None)
    assert source.onnx_file == "onnx/model.onnx"
    for name in ("onnx/model.onnx", "tokenizer.json", "config.json"):
        assert (source.model_dir / name).read_bytes() == _FakeHub.files[("acme/tiny-reranker", "main", name)]
    assert {path for method, path in _FakeHub.seen if method == "GET"} == {
        "acme/tiny-reranker/resolve/main/onnx/model.onnx",
        "acme/tiny-reranker/resolve/main/tokenizer.json",
        "acme/tiny-reranker/resolve/main/config.json",
    }
    # second time: no network at all, and the model loads and scores like the original
    _FakeHub.seen = []
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    settings = load_settings(home=tmp_path.parent / tmp_path.name, reranker_model="acme/tiny-reranker")
    settings_models = settings.models_dir
    shutil.copytree(tmp_path / "hub", settings_models / "hub")
    encoder = load_reranker(settings.params().reranker_model)
    assert _FakeHub.seen == []
    np.testing.assert_allclose(
        encoder.score_pairs(PAIRS[:2]),
        CrossEncoder(model_folder, max_length=encoder.max_length).score_pairs(PAIRS[:2]),
        atol=1e-6,
    )


def test_hub_repo_missing_a_file(hub, tmp_path):
    with pytest.raises(ModelError) as err:
        resolve_model("acme/no-tokenizer", cache_dir=tmp_path)
    assert "hub repo acme/no-tokenizer@main has no file 'tokenizer.json'" in str(err.value)
    assert "train one with `llmframe-ray train-reranker`" in str(err.value)


def test_hub_unreachable(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(ModelError) as err:
        resolve_model("cross-encoder/ms-marco-MiniLM-L-6-v2", cache_dir=tmp_path)
    message = str(err.value)
    assert message.startswith(
        "cannot download 'onnx/model.onnx' of hub repo cross-encoder/ms-marco-MiniLM-L-6-v2@main "
        "from http://127.0.0.1:9: "
    )
    assert message.endswith(
        "without internet access, pass a local folder holding model.onnx and tokenizer.json, or "
        "train one with `llmframe-ray train-reranker`"
    )


def test_not_a_folder_nor_repo_id(tmp_path):
    with pytest.raises(ModelError) as err:
        resolve_model(str(tmp_path / "missing"), cache_dir=tmp_path)
    assert str(err.value) == (
        f"reranker model {str(tmp_path / 'missing')!r} is neither an existing folder nor a hub repo id (owner/name)"
    )


@pytest.mark.model
def test_trained_architecture_exports_faithfully(tmp_path):
    """The reranker `train-reranker` builds (MiniLM, mean pooling, linear head): ONNX matches
    PyTorch within 1e-4."""
    import torch

    from llmframe_ray.train.reranker import mean_pool_classifier

    torch.manual_seed(3)
    model = mean_pool_classifier(bundled_minilm_path()).eval()
    export_graph(model, tmp_path / "model.onnx", "logits")
    shutil.copyfile(bundled_minilm_path() / "tokenizer.json", tmp_path / "tokenizer.json")
    expected = torch_scores(model, reference_tokenizer(), PAIRS)
    got = CrossEncoder(tmp_path, max_length=MAX_LENGTH, batch_size=2).score_pairs(PAIRS)
    np.testing.assert_allclose(got, expected, atol=1e-4)


def test_postprocess_heads():
    assert CrossEncoder.postprocess(np.array([[1.5], [-2.0]])).tolist() == [1.5, -2.0]
    # two classes: log-odds of "relevant", so [5, 6] and [0, 1] score the same
    assert CrossEncoder.postprocess(np.array([[5.0, 6.0], [0.0, 1.0], [2.0, 0.0]])).tolist() == [1.0, 1.0, -2.0]
    with pytest.raises(ModelError, match="must output 1 or 2 logits per pair, this one gives 3"):
        CrossEncoder.postprocess(np.zeros((2, 3)))


def test_int8_of_a_hub_model_needs_its_quantised_file(hub, tmp_path):
    settings = load_settings(home=tmp_path, reranker_model="acme/tiny-reranker", reranker_precision="int8")
    with pytest.raises(ModelError) as err:
        load_reranker(settings.params().reranker_model)
    assert str(err.value) == (
        "int8 precision for hub repo acme/tiny-reranker@main needs its quantised ONNX file: "
        "set LLMFRAME_RERANKER_ONNX_FILE to that file's path in the repo"
    )
