"""The app builder: `build_app(args)` composes the deployments into one Serve application.

    Ingress -> Retriever -> QueryEncoder, DenseShard-i and SparseShard-i for every shard i
            -> Reranker (when enabled) -> Generator (provider chain), Sessions

Used by `serve run deployments/local.yaml`, `serve deploy deployments/cluster.yaml`, KubeRay
(deployments/rayservice.yaml) and `llmframe-ray serve --index DIR`.
"""

# No `from __future__ import annotations` here: Serve validates `args` against the builder's
# annotation only when it is a real class.
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator
from ray.serve import Application

from llmframe_ray.api.auth import ApiKeys
from llmframe_ray.config import Settings, load_settings
from llmframe_ray.errors import ConfigError, IndexLoadError
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.serve.dense_shard import DenseShard
from llmframe_ray.serve.encoder import QueryEncoder
from llmframe_ray.serve.generator import Generator
from llmframe_ray.serve.ingress import Ingress
from llmframe_ray.serve.reranker import Reranker
from llmframe_ray.serve.retriever import Retriever
from llmframe_ray.serve.sessions import Sessions
from llmframe_ray.serve.sparse_shard import SparseShard


DEPLOYMENTS = {
    "QueryEncoder": QueryEncoder,
    "DenseShard": DenseShard,
    "SparseShard": SparseShard,
    "Retriever": Retriever,
    "Reranker": Reranker,
    "Generator": Generator,
    "Sessions": Sessions,
    "Ingress": Ingress,
}


def shard_deployment_name(kind: str, shard: int) -> str:
    return f"{kind}-{shard}"


class AppArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    index_dir: str = Field(description="Index directory (its CURRENT version is served); relative paths are resolved where the app is built.")
    settings: dict[str, Any] = Field(default_factory=dict, description="Overrides of LLMFRAME_* settings, by field name (e.g. reranker_model).")
    reranker: Optional[bool] = Field(None, description="Deploy the Reranker (default: LLMFRAME_RERANKER_ENABLED).")
    deployment_options: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description=(
            "Serve deployment options (num_replicas, autoscaling_config, ray_actor_options, user_config, ...) by "
            "deployment: QueryEncoder, Retriever, Reranker, Generator, Ingress, and DenseShard / SparseShard for "
            "every shard. A Serve config's `deployments:` list can set the first five too."
        ),
    )

    @field_validator("deployment_options")
    @classmethod
    def _known_deployments(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        unknown = sorted(set(value) - set(DEPLOYMENTS))
        if unknown:
            raise ValueError(f"unknown deployment(s) {unknown}; known: {', '.join(DEPLOYMENTS)}")
        return value


def build_app(args: AppArgs) -> Application:
    """Settings are read and resolved here, once, where the app is built (LLMFRAME_* of this
    environment with `args.settings` on top); each deployment is bound with only the
    parameters it uses, so a secret reaches only the replica that needs it (API keys only as
    digests, to the Ingress; provider keys to the Generator)."""
    if not isinstance(args, AppArgs):
        args = AppArgs.model_validate(args)
    overrides = dict(args.settings)
    unknown = sorted(set(overrides) - set(Settings.model_fields))
    if unknown:
        raise ConfigError(f"unknown setting(s) {unknown} in the app's args.settings; names are Settings fields, e.g. reranker_model")
    settings = load_settings(**overrides)  # a bad setting fails here, before any replica starts
    use_reranker = settings.reranker_enabled if args.reranker is None else args.reranker
    if "reranker_enabled" in overrides and settings.reranker_enabled and not use_reranker:
        raise ConfigError("settings.reranker_enabled is true but the app is built without a Reranker (reranker: false)")
    params = settings.params()
    if "reranker_enabled" not in overrides:  # by default, rerank when a Reranker is deployed
        rerank = replace(params.rerank, enabled=use_reranker)
        params = replace(params, rerank=rerank, service=replace(params.service, rerank=rerank))
    keys = ApiKeys.configured(settings.api_key_list, disabled=settings.auth_disabled)
    root = Path(args.index_dir).expanduser().resolve()
    index = IndexDirectory(root)
    current = index.current_version()
    if current is None:
        raise IndexLoadError(f"no published version in {root}; build one with `llmframe-ray ingest`")
    n_shards = int(index.version_info(current)["shards"])

    def deployment(kind: str, name: Optional[str] = None) -> Any:
        options = dict(args.deployment_options.get(kind, {}))
        if name is not None:
            options["name"] = name
        return DEPLOYMENTS[kind].options(**options) if options else DEPLOYMENTS[kind]

    retrieval = params.retrieval
    encoder = deployment("QueryEncoder").bind(params.embedder)
    dense = [
        deployment("DenseShard", shard_deployment_name("DenseShard", i)).bind(str(root), i, retrieval, settings.num_threads)
        for i in range(n_shards)
    ]
    sparse = [
        deployment("SparseShard", shard_deployment_name("SparseShard", i)).bind(str(root), i, retrieval)
        for i in range(n_shards)
    ]
    retriever = deployment("Retriever").bind(encoder, dense, sparse, str(root), retrieval, params.index_watch_interval_s)
    reranker = deployment("Reranker").bind(params.reranker_model, params.rerank.depth) if use_reranker else None
    generator = deployment("Generator").bind(params.providers, params.service.generation.prices)
    sessions = deployment("Sessions").bind(params.sessions)

    probes = {"QueryEncoder": encoder, "Retriever": retriever, "Generator": generator, "Sessions": sessions}
    probes.update({shard_deployment_name("DenseShard", i): d for i, d in enumerate(dense)})
    probes.update({shard_deployment_name("SparseShard", i): s for i, s in enumerate(sparse)})
    batched = {"QueryEncoder": encoder}
    if reranker is not None:
        probes["Reranker"] = reranker
        batched["Reranker"] = reranker
    return deployment("Ingress").bind(retriever, reranker, generator, sessions, probes, batched, keys, params.service)
