"""The app builder: `build_app(args)` composes the deployments into one Serve application.

    Ingress -> Retriever -> [QueryEncoder], [ShardGroup-g for every group g of shards]
            -> Reranker (when enabled) -> Generator (provider chain), Sessions

The Retriever batches whole requests; it encodes queries in its own process or through the
QueryEncoder, and searches shards in its own process or through ShardGroup deployments (each
holding `shards_per_group` shards with both rankers), as the args say.

Used by `serve run deployments/local.yaml`, `serve deploy deployments/cluster.yaml`, KubeRay
(deployments/rayservice.yaml) and `llmframe-ray serve --index DIR`.
"""

# No `from __future__ import annotations` here: Serve validates `args` against the builder's
# annotation only when it is a real class.
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator
from ray.serve import Application

from llmframe_ray.api.auth import ApiKeys
from llmframe_ray.api.params import ServiceParams
from llmframe_ray.config import Settings, load_settings
from llmframe_ray.errors import ConfigError, IndexLoadError
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.serve.encoder import QueryEncoder
from llmframe_ray.serve.generator import Generator
from llmframe_ray.serve.ingress import Ingress
from llmframe_ray.serve.reranker import Reranker
from llmframe_ray.serve.retriever import Retriever, RetrieverArgs
from llmframe_ray.serve.sessions import Sessions
from llmframe_ray.serve.shard_group import ShardGroup
from llmframe_ray.serve.writer import JobParams, Writer
from llmframe_ray.api.documents import DocumentLimits


DEPLOYMENTS = {
    "QueryEncoder": QueryEncoder,
    "ShardGroup": ShardGroup,
    "Retriever": Retriever,
    "Reranker": Reranker,
    "Generator": Generator,
    "Sessions": Sessions,
    "Writer": Writer,
    "Ingress": Ingress,
}


def group_deployment_name(group: int) -> str:
    return f"ShardGroup-{group}"


def shard_groups(n_shards: int, per_group: int | None) -> list[tuple[int, ...]]:
    """Shards 0..n-1 in consecutive groups of `per_group` (None: one group of all)."""
    size = n_shards if per_group is None else per_group
    return [tuple(range(start, min(start + size, n_shards))) for start in range(0, n_shards, max(size, 1))]


class AppArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    index_dir: str = Field(description="Index directory (its CURRENT version is served); relative paths are resolved where the app is built.")
    settings: dict[str, Any] = Field(default_factory=dict, description="Overrides of LLMFRAME_* settings, by field name (e.g. reranker_model).")
    reranker: Optional[bool] = Field(None, description="Deploy the Reranker (default: LLMFRAME_RERANKER_ENABLED).")
    encoder_in_retriever: bool = Field(
        False, description="Encode queries in the Retriever's process (one machine: saves a hop) instead of a QueryEncoder deployment."
    )
    shards_in_retriever: bool = Field(
        False, description="Search the shards in the Retriever's process instead of ShardGroup deployments."
    )
    retriever_in_ingress: bool = Field(
        False, description="Run the Retriever inside each Ingress replica (one machine: no hop) instead of its own deployment."
    )
    shards_per_group: Optional[int] = Field(
        None, ge=1, description="Shards per ShardGroup deployment, both rankers each (default: all shards in one group)."
    )
    reranker_threads: Optional[int] = Field(
        None, ge=1, description="Model threads of each Reranker replica (default: LLMFRAME_NUM_THREADS, else its CPUs)."
    )
    deployment_options: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description=(
            "Serve deployment options (num_replicas, autoscaling_config, ray_actor_options, user_config, ...) by "
            "deployment: QueryEncoder, Retriever, Reranker, Generator, Ingress, and ShardGroup for every shard "
            "group. A Serve config's `deployments:` list can set the first five too."
        ),
    )

    @field_validator("deployment_options")
    @classmethod
    def _known_deployments(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        unknown = sorted(set(value) - set(DEPLOYMENTS))
        if unknown:
            raise ValueError(f"unknown deployment(s) {unknown}; known: {', '.join(DEPLOYMENTS)}")
        return value


def local_layout(index_dir: str, cpus: int, **fields: Any) -> AppArgs:
    """One machine of `cpus` cores: retrieval (encoder and every shard) inside each Ingress
    replica, one replica per core with one model thread each, so that a request makes no hop
    between replicas (`llmframe-ray serve`, deployments/local.yaml). 0.4 CPU per replica leaves
    room for the Reranker's 1 CPU on a 2-CPU Ray (a replica that cannot be placed would keep
    the app from starting). The Reranker runs a thread per core all the same: while it
    reranks, it is what the requests wait for (see README "Reranking", served)."""
    fields.setdefault("reranker_threads", max(1, cpus))
    options = dict(fields.pop("deployment_options", {}))
    options.setdefault("Ingress", {"num_replicas": max(1, cpus), "ray_actor_options": {"num_cpus": 0.4}})
    return AppArgs(
        index_dir=index_dir,
        retriever_in_ingress=True,
        encoder_in_retriever=True,
        shards_in_retriever=True,
        deployment_options=options,
        **fields,
    )


def ingress_replicas(ingress: Mapping[str, Any]) -> int:
    """The Ingress replicas that the app's own deployment options give: `num_replicas`, or
    with autoscaling its minimum (so a per-key limit holds at the fewest replicas and loosens as
    more start); 1 when they say nothing."""
    replicas = ingress.get("num_replicas")
    if isinstance(replicas, int):
        return max(1, replicas)
    return max(1, int((ingress.get("autoscaling_config") or {}).get("min_replicas", 1) or 1))


def _split_key_limits(service: ServiceParams, ingress: Mapping[str, Any], setting: Optional[int]) -> ServiceParams:
    """Per-key limits split over the Ingress replicas (api/limits.py): LLMFRAME_KEY_LIMIT_REPLICAS,
    else what the app's deployment options say (options set only in a Serve config file's
    `deployments:` list are not visible here: such files set the setting)."""
    replicas = setting if setting is not None else ingress_replicas(ingress)
    return replace(service, limits=replace(service.limits, replicas=replicas))


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
    keys = ApiKeys.from_settings(settings)
    params = replace(params, service=_split_key_limits(
        params.service, args.deployment_options.get("Ingress", {}), settings.key_limit_replicas
    ))
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
    groups = shard_groups(n_shards, args.shards_per_group)
    if args.shards_in_retriever:
        placed: list[tuple[tuple[int, ...], Any]] = [(tuple(range(n_shards)), None)]
    else:
        placed = [
            (shards, deployment("ShardGroup", group_deployment_name(g)).bind(str(root), shards, retrieval, settings.num_threads))
            for g, shards in enumerate(groups)
        ]
    encoder = params.embedder if args.encoder_in_retriever else deployment("QueryEncoder").bind(params.embedder)
    retriever_args = RetrieverArgs(encoder, placed, str(root), retrieval, params.index_watch_interval_s, settings.num_threads)
    retriever = retriever_args if args.retriever_in_ingress else deployment("Retriever").bind(retriever_args)
    reranker_model = params.reranker_model
    if args.reranker_threads is not None and reranker_model.threads is None:  # LLMFRAME_NUM_THREADS wins
        reranker_model = reranker_model.with_threads(args.reranker_threads)
    reranker = deployment("Reranker").bind(reranker_model, params.rerank.depth) if use_reranker else None
    generator = deployment("Generator").bind(params.providers, params.service.generation.prices)
    sessions = deployment("Sessions").bind(params.sessions, settings.metrics_push_interval_s)  # also the metrics hub

    job = JobParams(params.embedder, params.index, replace(params.ingest, cpu_scale=settings.writer_cpu_scale))
    writer = deployment("Writer").bind(str(root), job, settings.writer_batch_wait_s)
    limits = DocumentLimits(settings.upload_max_bytes, settings.documents_max_per_request, settings.documents_max_queued_bytes)

    probes = {"Generator": generator, "Sessions": sessions, "Writer": writer}
    batched = {}
    if not args.retriever_in_ingress:  # else the Ingress adds its own
        probes["Retriever"] = batched["Retriever"] = retriever
    if not args.encoder_in_retriever:
        probes["QueryEncoder"] = batched["QueryEncoder"] = encoder
    probes.update({group_deployment_name(g): handle for g, (_, handle) in enumerate(placed) if handle is not None})
    if reranker is not None:
        probes["Reranker"] = reranker
        batched["Reranker"] = reranker
    return deployment("Ingress").bind(
        retriever, reranker, generator, sessions, probes, batched, keys, params.service, (str(root), limits, writer)
    )
