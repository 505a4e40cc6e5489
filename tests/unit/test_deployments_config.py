"""The Serve config files parse as Serve configs, their app args validate, they name only
deployments the app has, and the KubeRay file embeds cluster.yaml unchanged."""

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
FILES = ["local.yaml", "cluster.yaml"]


def load(name):
    return yaml.safe_load((REPO / "deployments" / name).read_text())


@pytest.mark.parametrize("name", FILES)
def test_serve_config_is_valid(name):
    from ray.serve.schema import ServeDeploySchema

    from llmframe_ray.serve.app import DEPLOYMENTS, AppArgs

    config = load(name)
    ServeDeploySchema.model_validate(config)
    (application,) = config["applications"]
    assert application["import_path"] == "llmframe_ray.serve.app:build_app"
    args = AppArgs.model_validate(application["args"])
    named = {d["name"] for d in application.get("deployments", [])}
    assert named <= set(DEPLOYMENTS) - {"ShardGroup"}  # shard groups are named per index
    if "Reranker" in named:
        assert args.reranker is True  # a config for a deployment the app lacks is rejected by Serve


def test_rayservice_embeds_cluster_config_and_keeps_the_control_plane_closed():
    service, policy = yaml.safe_load_all((REPO / "deployments" / "rayservice.yaml").read_text())
    assert service["kind"] == "RayService"
    assert yaml.safe_load(service["spec"]["serveConfigV2"]) == load("cluster.yaml")
    cluster = service["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert {"name": "API_SECRET_KEY", "valueFrom": {"secretKeyRef": {"name": "llmframe-api-keys", "key": "api-secret-key"}}} in head["env"]
    assert cluster["authOptions"] == {"mode": "token"}  # Ray's token authentication
    assert 10001 not in {p["containerPort"] for p in head["ports"]}  # no Ray client port
    # the network policy admits anyone to the Serve port only
    assert policy["kind"] == "NetworkPolicy" and policy["spec"]["policyTypes"] == ["Ingress"]
    open_rules = [rule for rule in policy["spec"]["ingress"] if "from" not in rule]
    assert open_rules == [{"ports": [{"port": 8000, "protocol": "TCP"}]}]


def test_builder_rejects_bad_args(tmp_path):
    from llmframe_ray.errors import ConfigError, IndexLoadError
    from llmframe_ray.serve.app import build_app

    with pytest.raises(IndexLoadError, match="no published version in"):
        build_app({"index_dir": str(tmp_path), "settings": {"api_secret_key": "k"}})
    with pytest.raises(ConfigError, match="no API key is configured"):
        build_app({"index_dir": str(tmp_path), "settings": {"api_secret_key": None, "api_keys": None}})
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) \['reranker_enabeld'\]"):
        build_app({"index_dir": str(tmp_path), "settings": {"api_secret_key": "k", "reranker_enabeld": True}})
    with pytest.raises(ConfigError, match="reranker_enabled is true but the app is built without a Reranker"):
        build_app({"index_dir": str(tmp_path), "reranker": False, "settings": {"api_secret_key": "k", "reranker_enabled": True}})
    with pytest.raises(Exception, match="unknown deployment"):
        build_app({"index_dir": str(tmp_path), "deployment_options": {"Rerankr": {}}})


def test_local_layout_with_a_reranker_fits_two_cpus():
    """Every replica of `llmframe-ray serve --layout local --reranker` can be placed on the
    2-CPU Ray it starts (a replica that cannot be placed keeps the app from starting)."""
    from llmframe_ray.serve.app import DEPLOYMENTS, local_layout

    args = local_layout("unused", 2, reranker=True)
    ingress = args.deployment_options["Ingress"]
    needed = ingress["num_replicas"] * ingress["ray_actor_options"]["num_cpus"]
    needed += sum(DEPLOYMENTS[name].ray_actor_options["num_cpus"] for name in ("Reranker", "Generator", "Sessions", "Writer"))
    assert ingress["num_replicas"] == 2 and needed <= 2.0
    assert args.reranker_threads == 2  # placed on 1 CPU, it runs a thread per core while it reranks


@pytest.mark.parametrize("name", FILES)
def test_per_key_limits_are_split_over_the_ingress_replicas_the_file_deploys(name):
    from llmframe_ray.serve.app import ingress_replicas

    (application,) = load(name)["applications"]
    ingress = next(d for d in application.get("deployments", []) if d["name"] == "Ingress")
    assert application["args"]["settings"]["key_limit_replicas"] == ingress_replicas(ingress)


def test_ingress_replicas_from_the_apps_own_options():
    from llmframe_ray.serve.app import ingress_replicas

    assert ingress_replicas({}) == 1
    assert ingress_replicas({"num_replicas": 3}) == 3
    assert ingress_replicas({"autoscaling_config": {"min_replicas": 2, "max_replicas": 8}}) == 2
    assert ingress_replicas({"num_replicas": "auto", "autoscaling_config": {"min_replicas": 4}}) == 4


@pytest.mark.parametrize("hard,expected", [(20000, 7960), (4096, 1598), (1024, 369), (200, 64), (1_000_000, 65536)])
def test_haproxy_connections_fit_the_descriptor_limit(monkeypatch, hard, expected):
    import resource

    from llmframe_ray.serve.run import haproxy_maxconn, serve_speed_settings

    monkeypatch.setattr(resource, "getrlimit", lambda which: (1024, hard))
    assert haproxy_maxconn() == expected
    assert serve_speed_settings(60).get("RAY_SERVE_HAPROXY_MAXCONN", str(expected)) == str(expected)
