"""Reranker fine-tuning end to end on a tiny collection: a few steps only."""

import json
from dataclasses import replace

import numpy as np
import pytest

from llmframe_ray.errors import DatasetError, ModelError
from llmframe_ray.eval.beir import load_beir
from llmframe_ray.eval.runner import check_reranker_data
from llmframe_ray.models.cross_encoder import CrossEncoder, read_card
from llmframe_ray.train.reranker import TrainConfig, build_groups, split_queries
from llmframe_ray.train.run import train_reranker
from tests.unit.tiny_beir import CONFIG, QUESTIONS, TOPICS, tiny_settings, train_params, train_tiny, write_tiny_beir


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory):
    return write_tiny_beir(tmp_path_factory.mktemp("collection"))


@pytest.fixture(scope="module")
def settings(tmp_path_factory, model_dir):
    return tiny_settings(tmp_path_factory.mktemp("home"), model_dir)


@pytest.fixture(scope="module")
def trained(dataset_dir, settings, tmp_path_factory):
    return train_tiny(dataset_dir, settings, tmp_path_factory.mktemp("models") / "tiny-reranker")


def test_model_folder_and_card(trained, dataset_dir):
    out, card = trained
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "model.int8.onnx", "model.onnx", "reranker.json", "tokenizer.json",
        "tower.int8.onnx", "tower.json", "tower.onnx",
    ]
    assert card == read_card(out)
    assert card["steps"] == 2 and card["max_length"] == 48 and card["config"]["seed"] == 7
    assert card["data"]["dataset"] == "tiny-beir" and card["data"]["split"] == "train"
    assert card["data"]["train_queries"] == 4 and card["data"]["validation_queries"] == 2
    assert card["data"]["groups"] == 4
    assert [step for step, _ in card["loss_curve"]] == [2]
    assert card["domain"]["embedding_model"]["name"] == "all-MiniLM-L6-v2"
    assert len(card["domain"]["centroid"]) == 384
    assert np.linalg.norm(card["domain"]["centroid"]) == pytest.approx(1.0, abs=1e-4)
    assert set(card["validation"]) == {
        "queries", "depth", "hybrid", "rerank-fp32", "rerank-int8", "rerank-fp32-rrf", "rerank-int8-rrf",
        "rerank-fp32-score", "rerank-int8-score", "rerank-towers-int8", "rerank-towers-int8-rrf", "rerank-towers-int8-score",
    }
    assert not any(p.name.startswith(".") for p in out.parent.iterdir())


def test_training_is_deterministic(trained, dataset_dir, settings, tmp_path):
    out, card = trained
    again = tmp_path / "again"
    card2 = train_reranker(dataset_dir, "train", again, CONFIG, lambda line: None, **train_params(settings))
    assert card2["loss_curve"] == card["loss_curve"]
    pairs = [("why do tides happen", t) for t in TOPICS.values()]
    a = CrossEncoder(out).score_pairs(pairs)
    b = CrossEncoder(again).score_pairs(pairs)
    np.testing.assert_array_equal(a, b)


def test_rationale_sentences_train_beside_the_passages(dataset_dir, settings, tmp_path):
    """--rationales: one more group per gold sentence of the training claims; the held-out
    claims stay out of both kinds."""
    import shutil

    root = tmp_path / "with-rationales"
    shutil.copytree(dataset_dir, root)
    (root / "rationales").mkdir()
    (root / "rationales" / "corpus_sentences.jsonl").write_text("".join(
        json.dumps({"doc_id": k, "title": k.title(), "abstract": [v, f"This note on {k} has a second sentence."]}) + "\n"
        for k, v in TOPICS.items()
    ))
    (root / "rationales" / "claims_train.jsonl").write_text("".join(
        json.dumps({"id": q, "claim": t, "evidence": {d: [{"sentences": [0], "label": "SUPPORT"}]}}) + "\n"
        for q, (t, d) in QUESTIONS.items()
    ))
    lines = []
    card = train_reranker(root, "train", tmp_path / "m", CONFIG, lines.append, rationales=True, **train_params(settings))
    train_ids, _ = split_queries(list(QUESTIONS), CONFIG.validation_fraction, CONFIG.seed)
    assert card["data"]["rationale_groups"] == len(train_ids)  # one gold sentence per training claim
    assert card["data"]["groups"] == 2 * len(train_ids)  # and one judged document each
    assert f"rationale sentences: {len(train_ids)} groups (1 gold sentence + 2 others of the claim's top 5 and cited documents)" in lines
    with pytest.raises(DatasetError) as missing:
        train_reranker(dataset_dir, "train", tmp_path / "m2", CONFIG, lambda line: None, rationales=True, **train_params(settings))
    assert str(missing.value) == f"--rationales needs {dataset_dir / 'rationales' / 'claims_train.jsonl'} (SciFact's rationales/ layout)"


def test_refuses_test_split(dataset_dir, settings, tmp_path):
    with pytest.raises(DatasetError, match="refusing to train on test judgments"):
        train_reranker(dataset_dir, "test", tmp_path / "m", CONFIG, lambda line: None, **train_params(settings))


def test_refuses_to_overwrite_a_folder_that_is_not_a_model(dataset_dir, settings, tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="is not a reranker folder; refusing to overwrite it"):
        train_reranker(dataset_dir, "train", tmp_path / "notes", CONFIG, lambda line: None, **train_params(settings))
    assert (tmp_path / "notes" / "keep.txt").read_text() == "mine"


def test_eval_refuses_a_reranker_trained_on_the_same_judgments(trained, dataset_dir):
    _, card = trained
    check_reranker_data(card, load_beir(dataset_dir, "test"))  # trained on train: allowed
    with pytest.raises(ModelError) as err:
        check_reranker_data(card, load_beir(dataset_dir, "train"))
    assert str(err.value) == (
        "the reranker was trained on tiny-beir/qrels/train.tsv; evaluating it on the same "
        "judgments (tiny-beir train) would report training data as test results"
    )


def test_negatives_exclude_every_judged_document(dataset_dir):
    ds = load_beir(dataset_dir, "train")
    candidates = {q: ["bread", "tides", "lava", "bikes", "ice", "bees", "stars"] for q in ds.queries}
    groups = build_groups(ds, list(ds.queries), candidates, TrainConfig(negatives=3, mining_depth=5, seed=1))
    assert len(groups) == 6
    for g in groups:
        judged_text = TOPICS[QUESTIONS[g.query_id][1]]
        assert g.positive.endswith(judged_text)
        assert all(not n.endswith(judged_text) for n in g.negatives) and len(set(g.negatives)) == 3


def test_split_queries_is_seeded_and_disjoint():
    ids = [f"q{i}" for i in range(20)]
    train_a, val_a = split_queries(ids, 0.1, seed=3)
    train_b, val_b = split_queries(list(reversed(ids)), 0.1, seed=3)
    assert (train_a, val_a) == (train_b, val_b)
    assert len(val_a) == 2 and not set(train_a) & set(val_a) and len(train_a) + len(val_a) == 20


def test_eval_rerank_mode_writes_runs(trained, dataset_dir, settings, tmp_path):
    import os
    import subprocess
    import sys

    out, _ = trained
    env = {**os.environ, "LLMFRAME_HOME": str(settings.home), "LLMFRAME_NUM_THREADS": "2"}
    args = [sys.executable, "-m", "llmframe_ray.cli", "eval", "--dataset", str(dataset_dir),
            "--mode", "hybrid", "--mode", "rerank", "--reranker", str(out), "--rerank-depth", "3",
            "--runs-dir", str(tmp_path)]
    result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    hybrid = [line.split() for line in (tmp_path / "hybrid.trec").read_text().splitlines()]
    rerank = [line.split() for line in (tmp_path / "rerank.trec").read_text().splitlines()]
    # same documents; below the reranked depth the hybrid order is kept
    assert sorted(r[2] for r in rerank) == sorted(h[2] for h in hybrid)
    assert [r[2] for r in rerank[3:]] == [h[2] for h in hybrid[3:]]
    # int8: the default precision (auto) takes the trained folder's quantised file; at home:
    # the eval's index is the training corpus's, so its centroid is the card's
    assert result.stdout.splitlines()[-1] == (
        f"reranker: {out} (int8 two towers, depth 3, max length 32, score fusion, weight 1.000; domain similarity 1.000)"
    )
    # a reranker trained on these judgments is refused
    refused = subprocess.run(args[:-2] + ["--split", "train"], env=env, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2
    assert "the reranker was trained on tiny-beir/qrels/train.tsv" in refused.stderr


def test_with_closed_gates_the_cross_encoder_scores_like_the_bi_encoder(embedder):
    """The gated model's starting point: with cross-segment attention shut, its logit is exactly
    scale * the bi-encoder's cosine (here checked against the ONNX embedder, to ONNX-vs-torch
    rounding); the default gate (-6) stays close to it."""
    from llmframe_ray.models.export import bundled_minilm_path
    from llmframe_ray.train.reranker import mean_pool_classifier, pair_tokenizer
    from llmframe_ray.train.warm_start import torch_scores

    query = "Vitamin D deficiency raises the risk of hip fractures in older adults."
    passages = [
        "Low serum vitamin D was associated with hip fracture in a cohort of 2,000 elderly people.",
        "The mitochondrial genome encodes thirteen proteins of the respiratory chain.",
        "Short.",
    ]
    vectors = embedder.embed([query, *passages])
    cosines = vectors[1:] @ vectors[0]
    tokenizer = pair_tokenizer(bundled_minilm_path(), 192)
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    closed = torch_scores(mean_pool_classifier(bundled_minilm_path(), gate_init=-1e4), tokenizer,
                          [(query, p) for p in passages])
    assert closed / 20.0 == pytest.approx(cosines, abs=1e-5)
    default = torch_scores(mean_pool_classifier(bundled_minilm_path()), tokenizer, [(query, p) for p in passages])
    assert np.argsort(-default).tolist() == np.argsort(-cosines).tolist()
    assert default / 20.0 == pytest.approx(cosines, abs=0.02)
    tokenizer.no_padding()
    enc = tokenizer.encode(query, passages[2])
    assert enc.tokens[-4:] == ["[CLS]", "short", ".", "[SEP]"] and enc.type_ids[-4:] == [1, 1, 1, 1]


def test_kept_layers_are_evenly_spaced_and_end_with_the_last():
    from llmframe_ray.train.reranker import kept_layers

    assert [kept_layers(6, n) for n in (1, 2, 3, 4, 5, 6, None)] == [
        [5], [0, 5], [0, 2, 5], [0, 2, 3, 5], [0, 1, 2, 4, 5], [0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5],
    ]
    with pytest.raises(ValueError, match="the encoder has 6 layers; cannot keep 7"):
        kept_layers(6, 7)
    with pytest.raises(ValueError, match="layers must be >= 1, got 0"):
        TrainConfig(layers=0)


def test_averaged_weights_follow_the_same_run_and_export_its_late_mean(dataset_dir, settings, tmp_path, monkeypatch):
    """--average-last 0.5 over 4 steps: the same training steps (same loss curve), the mean of
    steps 3 and 4 of every trained weight exported (the card says how many), so other scores
    than the last step's."""
    import llmframe_ray.train.reranker as reranker
    from llmframe_ray.models.export import bundled_minilm_path
    from llmframe_ray.train.average import TailAverage

    seen = {}

    class Recording(TailAverage):
        def update(self, step):
            before = self.count
            super().update(step)
            if self.count > before:
                seen.setdefault("steps", []).append(step)
                seen["params"] = len(self.params)

    monkeypatch.setattr(reranker, "TailAverage", Recording)
    config = replace(CONFIG, epochs=2, max_steps=None, layers=2)
    last = train_reranker(dataset_dir, "train", tmp_path / "last", config, lambda line: None, **train_params(settings))
    assert seen == {}
    lines = []
    mean = train_reranker(
        dataset_dir, "train", tmp_path / "mean", replace(config, average_last=0.5), lines.append,
        **train_params(settings),
    )
    assert seen["steps"] == [3, 4]
    # every weight that trains: the encoder's (not its frozen embeddings), the head, scale and gates
    fresh = reranker.mean_pool_classifier(bundled_minilm_path(), layers=2)
    assert seen["params"] == len(list(fresh.parameters())) - len(list(fresh.encoder.embeddings.parameters()))
    assert "  exporting the weights averaged over the last 2 of 4 steps (--average-last 0.5)" in lines
    assert last["steps"] == mean["steps"] == 4
    assert mean["loss_curve"] == last["loss_curve"]
    assert mean["averaged_steps"] == 2 and "averaged_steps" not in last
    assert mean["config"]["average_last"] == 0.5
    pairs = [("why do tides happen", t) for t in TOPICS.values()]
    moved = np.abs(CrossEncoder(tmp_path / "mean").score_pairs(pairs) - CrossEncoder(tmp_path / "last").score_pairs(pairs))
    assert moved.max() > 1e-3  # 0.06 when written


def test_a_smaller_reranker_keeps_the_chosen_layers_end_to_end(dataset_dir, settings, tmp_path, trained):
    """--layers 2: the exported model has 2 transformer layers (config, ONNX graph), the card says
    which, the ONNX scores match the PyTorch model, and it differs from the 6-layer model."""
    import onnx

    out = tmp_path / "two-layers"
    card = train_reranker(dataset_dir, "train", out, replace(CONFIG, layers=2), lambda line: None, **train_params(settings))
    assert card["layers"] == [0, 5] and card["config"]["layers"] == 2
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 2
    six, _ = trained
    assert read_card(six)["layers"] == [0, 1, 2, 3, 4, 5]

    def attention_softmaxes(model_dir):
        graph = onnx.load(str(model_dir / "model.onnx")).graph
        return sum(node.op_type == "Softmax" for node in graph.node)

    assert attention_softmaxes(out) == 2 and attention_softmaxes(six) == 6
    pairs = [("why do tides happen", t) for t in TOPICS.values()]
    assert CrossEncoder(out).score_pairs(pairs).shape == (len(pairs),)
    assert not np.allclose(CrossEncoder(out).score_pairs(pairs), CrossEncoder(six).score_pairs(pairs))


def test_a_student_distilled_from_a_teacher_records_it_and_learns_from_its_scores(dataset_dir, settings, tmp_path, trained, monkeypatch):
    """--teacher M: every training pair is scored by the teacher once, the card names the
    teacher (and its weights' digest), a different soft-loss weight gives a different student,
    and a student inherits its teacher's training data in the eval's leak check."""
    import hashlib

    from llmframe_ray.train import distill

    teacher, _ = trained
    seen: list[int] = []
    real = distill.teacher_scores

    def counted(teacher_dir, groups, threads, log):
        out = real(teacher_dir, groups, threads, log)
        seen.extend(len(g.teacher) for g in out)
        want = CrossEncoder(teacher_dir).score_pairs([(out[0].query, p) for p in (out[0].positive, *out[0].negatives)])
        assert out[0].teacher == tuple(want.tolist())
        return out

    lines: list[str] = []
    student = tmp_path / "student"
    config = replace(CONFIG, layers=2, max_steps=3)
    monkeypatch.setattr("llmframe_ray.train.run.teacher_scores", counted)
    card = train_reranker(dataset_dir, "train", student, config, lines.append, teacher=teacher, **train_params(settings))
    assert seen == [1 + CONFIG.negatives] * card["data"]["groups"]
    assert any(line.startswith("teacher tiny-reranker: scoring 12 pairs") for line in lines)
    assert card["teacher"]["name"] == "tiny-reranker" and card["teacher"]["layers"] == [0, 1, 2, 3, 4, 5]
    assert card["teacher"]["model_sha256"] == hashlib.sha256((teacher / "model.onnx").read_bytes()).hexdigest()
    assert (card["teacher"]["weight"], card["teacher"]["temperature"]) == (0.5, 1.0)
    assert not any("warning" in line for line in lines)  # same seed and held-out share as the teacher

    hard_only = train_reranker(
        dataset_dir, "train", tmp_path / "hard", replace(config, distill_weight=0.0), lambda line: None,
        teacher=teacher, **train_params(settings),
    )
    assert hard_only["loss_curve"] != card["loss_curve"]

    student_card = dict(read_card(student), data={"dataset": "elsewhere", "split": "train"})
    check_reranker_data(student_card, load_beir(dataset_dir, "test"))
    with pytest.raises(ModelError, match="trained on tiny-beir/qrels/train.tsv"):
        check_reranker_data(student_card, load_beir(dataset_dir, "train"))  # through its teacher


def test_distill_loss_mixes_the_judgments_with_the_teachers_order():
    import torch

    from llmframe_ray.train.distill import distill_loss

    logits = torch.tensor([[2.0, 1.0, 0.0], [0.5, 1.5, -1.0]])
    labels = torch.zeros(2, dtype=torch.long)
    hard = torch.nn.functional.cross_entropy(logits, labels)
    assert torch.equal(distill_loss(logits, labels, None, 0.5, 1.0), hard)
    assert torch.equal(distill_loss(logits, labels, logits * 3, 0.0, 1.0), hard)
    # a teacher that orders the group as the student does, at the same scale: no soft loss
    assert torch.allclose(distill_loss(logits, labels, logits.clone(), 0.25, 1.0), 0.75 * hard)
    # the soft term is T^2 KL(teacher || student), averaged over groups
    teacher = torch.tensor([[0.0, 3.0, 0.0], [1.0, 1.0, 1.0]])
    t = 2.0
    p = torch.softmax(teacher / t, 1)
    kl = (p * (torch.log(p) - torch.log_softmax(logits / t, 1))).sum(1).mean()
    assert torch.allclose(distill_loss(logits, labels, teacher, 1.0, t), t * t * kl)
    student = logits.clone().requires_grad_(True)
    distill_loss(student, labels, teacher, 1.0, 1.0).backward()
    assert student.grad[0, 1] < 0 and student.grad[0, 0] > 0  # pushed towards the teacher's favourite


def test_a_teacher_trained_with_another_hold_out_is_named_in_a_warning():
    from llmframe_ray.train.distill import check_teacher_split

    lines: list[str] = []
    info = {"data": {"dataset": "scifact"}}
    check_teacher_split(info, {"config": {"seed": 13, "validation_fraction": 0.1}}, "scifact", TrainConfig(seed=13), lines.append)
    check_teacher_split(info, {"config": {"seed": 13, "validation_fraction": 0.1}}, "nfcorpus", TrainConfig(seed=5), lines.append)
    assert lines == []
    check_teacher_split(info, {"config": {"seed": 13, "validation_fraction": 0.1}}, "scifact", TrainConfig(seed=5), lines.append)
    assert lines == [
        "warning: the teacher was trained on scifact with seed 13 and validation share 0.1; this run "
        "holds out other queries, so its validation figures include queries the teacher was trained on"
    ]
    with pytest.raises(ValueError, match=r"distill_weight must be in \[0, 1\] and distill_temperature > 0, got 1.5 and 1.0"):
        TrainConfig(distill_weight=1.5)


def test_segment_gates_as_extra_dimensions_equal_an_additive_bias():
    """The gated model's attention (train/attention.py: segment_gated_attention) adds its biases
    as extra query/key dimensions; the scores, and so the outputs, equal eager attention with
    the same biases added as a (heads x tokens x tokens) tensor."""
    import torch

    from llmframe_ray.train.attention import segment_gated_attention

    torch.manual_seed(3)
    batch, heads, tokens, dim = 2, 3, 7, 8
    query, key, value = (torch.randn(batch, heads, tokens, dim) for _ in range(3))
    first = torch.tensor([[1, 1, 1, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0]], dtype=torch.float32)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0]], dtype=torch.float32)
    second = mask - first
    gates = torch.randn(2, heads) * 4
    bias = (
        (1.0 - mask)[:, None, None, :] * -1e4
        + gates[0][None, :, None, None] * (first[:, :, None] * second[:, None, :])[:, None]
        + gates[1][None, :, None, None] * (second[:, :, None] * first[:, None, :])[:, None]
    )
    expected = torch.softmax(query @ key.transpose(2, 3) * dim ** -0.5 + bias, dim=-1) @ value
    query_side = torch.stack([gates[0][None, :, None] * first[:, None, :], gates[1][None, :, None] * second[:, None, :],
                              torch.ones(batch, heads, tokens)], -1)
    key_side = torch.stack([second, first, (1.0 - mask) * -1e4], -1)[:, None]
    module = torch.nn.Module().eval()
    out, weights = segment_gated_attention(module, query, key, value, (query_side, key_side))
    assert out.shape == (batch, tokens, heads, dim)
    assert torch.allclose(out.transpose(1, 2), expected, atol=1e-5)
    assert torch.allclose(weights[1, :, :, 5:], torch.zeros(heads, tokens, 2))  # padding gets no attention
