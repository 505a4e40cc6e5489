"""Where a cross-encoder comes from: a local folder, or a Hugging Face hub repository.

A hub model is fetched once with the official `huggingface_hub` client (which honours
`HF_ENDPOINT`, read here at call time) into `<LLMFRAME_HOME>/models/hub/<owner>--<name>/<revision>/`
and used offline from then on.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from llmframe_ray.errors import ModelError
from llmframe_ray.models.cross_encoder import CrossEncoder, Precision
from llmframe_ray.models.runtime import PREPACKED_DIR, available_threads
from llmframe_ray.models.two_tower import DEFAULT_VECTOR_CACHE, TOWER_VECTORS_DIR, TwoTowerScorer, has_towers

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
DEFAULT_HUB_ONNX_FILE = "onnx/model.onnx"
REQUIRED_FILES = ("tokenizer.json",)
OPTIONAL_FILES = ("config.json",)
HOW_TO_GET = (
    "without internet access, pass a local folder holding model.onnx and tokenizer.json, or "
    "train one with `llmframe-ray train-reranker`"
)


@dataclass(frozen=True)
class ModelSource:
    """A resolved model: the folder, and the ONNX file inside it (None: the precision's default)."""

    model_dir: Path
    onnx_file: str | None
    origin: str


def resolve_model(
    spec: str | Path,
    *,
    cache_dir: Path,
    revision: str | None = None,
    onnx_file: str | None = None,
) -> ModelSource:
    """A local model folder as is; a hub repo id downloaded (once) into `cache_dir`."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return ModelSource(path, onnx_file, f"local folder {path}")
    text = str(spec)
    if not REPO_ID.match(text):
        raise ModelError(
            f"reranker model {text!r} is neither an existing folder nor a hub repo id "
            "(owner/name)"
        )
    return download_from_hub(text, cache_dir=cache_dir, revision=revision, onnx_file=onnx_file or DEFAULT_HUB_ONNX_FILE)


def hub_target(cache_dir: Path, repo_id: str, revision: str | None) -> Path:
    owner, name = repo_id.split("/", 1)
    return Path(cache_dir) / "hub" / f"{owner}--{name}" / (revision or "main")


def download_from_hub(
    repo_id: str, *, cache_dir: Path, revision: str | None, onnx_file: str
) -> ModelSource:
    """Fetch the ONNX file, tokenizer.json and (if present) config.json of a hub repo."""
    target = hub_target(cache_dir, repo_id, revision)
    origin = f"hub repo {repo_id}@{revision or 'main'}"
    needed = (onnx_file, *REQUIRED_FILES)
    if all((target / name).is_file() for name in needed):
        return ModelSource(target, onnx_file, origin)  # already downloaded: no network
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as exc:
        raise ModelError(f"downloading {origin} needs huggingface_hub: pip install huggingface_hub") from exc
    from huggingface_hub.errors import RemoteEntryNotFoundError  # the file is not in the repo

    endpoint = os.environ.get("HF_ENDPOINT") or None
    where = endpoint or "the Hugging Face hub"
    target.mkdir(parents=True, exist_ok=True)
    for name in (*needed, *OPTIONAL_FILES):
        try:
            hf_hub_download(
                repo_id, name, revision=revision, local_dir=target, endpoint=endpoint,
                token=os.environ.get("HF_TOKEN") or None,
            )
        except RemoteEntryNotFoundError as exc:
            if name in OPTIONAL_FILES:
                continue
            raise ModelError(f"{origin} has no file {name!r} ({where}); {HOW_TO_GET}") from exc
        except Exception as exc:  # network errors, 401/404 for the repo, offline mode
            raise ModelError(
                f"cannot download {name!r} of {origin} from {where}: {type(exc).__name__}: "
                f"{exc}; {HOW_TO_GET}"
            ) from exc
    return ModelSource(target, onnx_file, origin)


@dataclass(frozen=True)
class RerankerModelParams:
    """Which cross-encoder to load and how. `model` is a folder or a hub repo id; `threads`
    None: every core this process may use (a Serve replica sets the CPUs it was given)."""

    model: str = "cross-encoder/ms-marco-MiniLM-L-6-v2"
    models_dir: Path = Path("models")
    revision: str | None = None
    onnx_file: str | None = None
    precision: Precision = Precision.AUTO  # int8 where the model folder has its quantised file
    batch_size: int = 32
    max_length: int | None = None
    threads: int | None = None
    spinning: bool = True  # ONNX Runtime's idle threads spin-wait (runtime.create_session)
    cache_size: int = 0  # (query, passage) scores kept (CrossEncoder: ScoreCache); 0: none
    window: bool = False  # long passages: their best-matching sentences (passage_window.py)
    towers: bool = True  # a folder with two towers is scored by them (two_tower.py), unless `window`
    vector_cache: int = DEFAULT_VECTOR_CACHE  # two towers: passages' vectors kept; 0: none

    def __post_init__(self) -> None:
        object.__setattr__(self, "precision", Precision.from_str(self.precision))

    def with_threads(self, threads: int) -> RerankerModelParams:
        return replace(self, threads=threads)


def load_reranker(
    params: RerankerModelParams, spec: str | Path | None = None, precision: str | Precision | None = None
) -> CrossEncoder | TwoTowerScorer:
    """The cross-encoder `params` name (or `spec`), resolved, downloaded once, and loaded: from
    its two towers where the folder has them, `params.towers` is on and no passage window is
    asked for (a window depends on the query, a tower's passage vector must not)."""
    precision = params.precision if precision is None else Precision.from_str(precision)
    source = resolve_model(
        params.model if spec is None else spec,
        cache_dir=params.models_dir,
        revision=params.revision,
        onnx_file=params.onnx_file,
    )
    if precision is Precision.INT8 and source.onnx_file is not None and params.onnx_file is None:
        raise ModelError(
            f"int8 precision for {source.origin} needs its quantised ONNX file: set "
            "LLMFRAME_RERANKER_ONNX_FILE to that file's path in the repo"
        )
    if params.towers and not params.window and source.onnx_file is None and has_towers(source.model_dir):
        return TwoTowerScorer(
            source.model_dir, precision=precision, max_length=params.max_length, batch_size=params.batch_size,
            threads=available_threads(params.threads), spinning=params.spinning,
            prepacked_dir=Path(params.models_dir) / PREPACKED_DIR, cache_size=params.vector_cache,
            store_dir=Path(params.models_dir) / TOWER_VECTORS_DIR,
        )
    return CrossEncoder(
        source.model_dir,
        precision=precision,
        onnx_file=source.onnx_file,
        max_length=params.max_length,
        batch_size=params.batch_size,
        threads=available_threads(params.threads),
        spinning=params.spinning,
        prepacked_dir=Path(params.models_dir) / PREPACKED_DIR,
        cache_size=params.cache_size,
        window=params.window,
    )
