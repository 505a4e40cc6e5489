"""Distillation: a trained reranker's scores as soft labels for a smaller one.

A student with fewer layers learns less from one judged positive per group than from how a
stronger model orders the whole group (positive and hard negatives alike). The teacher, any
reranker folder (`train-reranker --teacher M`), scores every pair of every group once, through
its ONNX runtime; `distill_loss` then mixes the listwise loss on the judgments with the
divergence of the student's softmax over the group from the teacher's:

    loss = (1 - w) * CE(student, positive) + w * T^2 * KL(softmax(teacher / T) || softmax(student / T))

(Hinton et al., 2015: the T^2 factor keeps the soft term's gradients on the scale of the hard
one's as T changes).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from llmframe_ray.index.manifest import describe_file
from llmframe_ray.models.cross_encoder import CrossEncoder, Precision, read_card
from llmframe_ray.train.reranker import Group, Log, TrainConfig


def teacher_scores(teacher_dir: Path, groups: Sequence[Group], threads: int, log: Log) -> list[Group]:
    """`groups` with the teacher's fp32 score of each of their pairs (positive first)."""
    teacher = CrossEncoder(teacher_dir, precision=Precision.FP32, threads=threads)
    pairs = [(g.query, passage) for g in groups for passage in (g.positive, *g.negatives)]
    log(f"teacher {teacher.name}: scoring {len(pairs)} pairs (max length {teacher.max_length})")
    started = time.perf_counter()
    scores = teacher.score_pairs(pairs).tolist()
    log(f"teacher scored {len(pairs)} pairs in {time.perf_counter() - started:.0f}s")
    out, at = [], 0
    for group in groups:
        size = 1 + len(group.negatives)
        out.append(replace(group, teacher=tuple(scores[at : at + size])))
        at += size
    return out


def teacher_card(teacher_dir: Path) -> dict:
    """What the student's card records of its teacher: name, layers, its card's own data and a
    digest of its fp32 weights."""
    card = read_card(teacher_dir)
    return {
        "name": card.get("name") or Path(teacher_dir).name,
        "layers": card.get("layers"),
        "data": card.get("data"),
        "model_sha256": describe_file(Path(teacher_dir) / "model.onnx")["sha256"],
        # what it learnt from in turn, for the eval's leak check (eval/runner.py: check_reranker_data)
        **{key: card[key] for key in ("teacher", "init") if isinstance(card.get(key), dict)},
    }


def distill_loss(logits, labels, teacher, weight: float, temperature: float):
    """The mixed loss above for logits (groups, size) whose column 0 is the judged positive;
    `teacher` holds the teacher's logits for the same pairs (or None: the hard loss alone)."""
    import torch

    hard = torch.nn.functional.cross_entropy(logits, labels)
    if teacher is None or weight == 0:
        return hard
    soft = torch.nn.functional.kl_div(
        torch.log_softmax(logits / temperature, dim=1),
        torch.log_softmax(teacher / temperature, dim=1),
        reduction="batchmean",
        log_target=True,
    )
    return (1.0 - weight) * hard + weight * temperature**2 * soft


def check_teacher_split(
    info: dict, card: dict, dataset: str, config: TrainConfig, log: Log, who: str = "the teacher"
) -> None:
    """Warn when the teacher (or `who`: the model a training starts from) learnt from this
    dataset with another held-out share: it has then seen some of the queries the student's
    validation figures are measured on."""
    data = info.get("data") or {}
    own = card.get("config") or {}
    same_hold_out = own.get("seed") == config.seed and own.get("validation_fraction") == config.validation_fraction
    if data.get("dataset") == dataset and not same_hold_out:
        log(
            f"warning: {who} was trained on {dataset} with seed {own.get('seed')} and validation "
            f"share {own.get('validation_fraction')}; this run holds out other queries, so its "
            f"validation figures include queries {who} was trained on"
        )
