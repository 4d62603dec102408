"""deploy/k8s checked without a cluster: every manifest against the upstream schema kept in deploy/k8s/schemas
(KubeRay 1.7.0's RayService CRD, strict on unknown fields; the nats chart 2.14.2's values), then what no schema
sees: the names and paths one file gives another (Secrets, the PVC, the NATS service, the Serve args)."""

from __future__ import annotations

import copy
import importlib
import importlib.util
import json
import re
from pathlib import Path
from urllib.parse import urlparse

import jsonschema
import pytest
import yaml

from config.settings import load_settings
from deploy import ray_local

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
SCHEMAS = K8S / "schemas"
SCHEMA_OF = {
    "RayService": "rayservice-v1.json",
    "PersistentVolumeClaim": "persistentvolumeclaim-v1.json",
    None: "nats-values.schema.json",
}  # a file without `kind` is the nats chart's values


def _load(name: str):
    return yaml.safe_load((K8S / name).read_text())


def _errors(doc) -> list[str]:
    schema = json.loads((SCHEMAS / SCHEMA_OF[doc.get("kind")]).read_text())
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}"
        for e in jsonschema.Draft202012Validator(schema).iter_errors(doc)
    ]


def _service():
    return _load("rayservice.yaml")


def _serve_config() -> dict:
    return yaml.safe_load(_service()["spec"]["serveConfigV2"])


def _pods() -> list[dict]:
    cluster = _service()["spec"]["rayClusterConfig"]
    return [cluster["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in cluster["workerGroupSpecs"]]


def _args() -> dict:
    return _serve_config()["applications"][0]["args"]


@pytest.mark.parametrize("name", sorted(p.name for p in K8S.glob("*.yaml")))
def test_every_manifest_passes_its_upstream_schema(name):
    doc = _load(name)
    assert doc.get("kind") in SCHEMA_OF, f"{name}: no schema kept for kind {doc.get('kind')!r}"
    assert _errors(doc) == []


@pytest.mark.parametrize(
    "name, path, key",
    [
        ("rayservice.yaml", ["spec", "rayClusterConfig"], "headStartParams"),
        ("rayservice.yaml", ["spec", "rayClusterConfig", "headGroupSpec", "template", "spec", "containers", 0], "envs"),
        ("rayservice.yaml", ["spec", "rayClusterConfig", "authOptions"], "token"),
        ("storage.yaml", ["spec"], "size"),
        ("nats-jetstream.yaml", ["config", "jetstream"], "replicas"),
        ("nats-jetstream.yaml", [], "auth"),
    ],
)
def test_the_schemas_refuse_a_field_that_does_not_exist(name, path, key):
    doc = copy.deepcopy(_load(name))
    node = doc
    for p in path:
        node = node[p]
    node[key] = "x"
    assert any("Additional properties" in e for e in _errors(doc)), (name, path, key)


def test_the_nats_schema_is_made_from_the_kept_chart_values():
    spec = importlib.util.spec_from_file_location("make_schemas", SCHEMAS / "make_schemas.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    values = yaml.safe_load((SCHEMAS / "nats-2.14.2-values.yaml").read_text())
    kept = json.loads((SCHEMAS / "nats-values.schema.json").read_text())
    assert {k: v for k, v in kept.items() if not k.startswith("$")} == make.values_schema(values)


def test_the_serve_config_is_one_ray_serve_accepts_and_both_applications_read_the_same_args():
    from ray.serve.schema import ServeDeploySchema

    config = ServeDeploySchema.model_validate(_serve_config())
    api, evolution = config.applications
    assert (api.route_prefix, evolution.route_prefix) == ("/", None)  # the evolution app has no HTTP route
    assert api.args == evolution.args
    for app in config.applications:
        module, attr = app.import_path.split(":")
        assert callable(getattr(importlib.import_module(module), attr)), app.import_path
    assert config.http_options.host == "0.0.0.0"  # reachable from the Service, not only inside the pod


def test_the_api_autoscales_within_bounds_and_the_cluster_with_it():
    (deployment,) = _serve_config()["applications"][0]["deployments"]
    from serve.app import KaizenServer

    assert deployment["name"] == KaizenServer.name
    bounds = deployment["autoscaling_config"]
    assert 1 <= bounds["min_replicas"] < bounds["max_replicas"]
    cluster = _service()["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True
    assert all(
        g["minReplicas"] <= g["replicas"] <= g["maxReplicas"] and g["minReplicas"] < g["maxReplicas"]
        for g in cluster["workerGroupSpecs"]
    )


def test_token_auth_on_every_pod_and_the_dashboard_reachable_by_the_operator():
    cluster = _service()["spec"]["rayClusterConfig"]
    assert cluster["authOptions"]["mode"] == "token"  # KubeRay sets RAY_AUTH_MODE and the token on every pod
    import ray  # the operator refuses token auth below Ray 2.52; the image runs the Ray pyproject.toml pins

    version = tuple(int(x) for x in cluster["rayVersion"].split("."))
    assert version >= (2, 52, 0) and version[:2] == tuple(int(x) for x in ray.__version__.split(".")[:2])
    for pod in _pods():  # ... unless a pod sets them itself
        assert not [e for c in pod["containers"] for e in c.get("env", []) if e["name"].startswith("RAY_AUTH")]
    assert cluster["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "0.0.0.0"
    assert _service()["spec"]["upgradeStrategy"]["type"] == "None"  # never two clusters' actors on one stream


def test_every_pod_has_the_environment_up_gives_ray_and_the_same_image():
    want = {k: v for k, v in ray_local.ray_env().items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    images = set()
    for pod in _pods():
        (container,) = pod["containers"]
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        assert want.items() <= env.items() and "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in env  # "0" keeps workers out
        images.add(container["image"])
    assert len(images) == 1


def _secrets_created_in_readme() -> dict[str, set[str]]:
    """The Secrets deploy/k8s/README.md creates (they are not kept in git) and their keys."""
    text = (K8S / "README.md").read_text()
    out = {}
    for m in re.finditer(r"kubectl create secret generic ([\w-]+)((?:.*\\\n)*.*)", text):  # with its continued lines
        out[m.group(1)] = set(re.findall(r"--from-literal=([\w.-]+)=", m.group(2)))
    return out


def _claims_declared() -> dict[str, dict]:
    docs = [_load(p.name) for p in K8S.glob("*.yaml")]
    return {d["metadata"]["name"]: d for d in docs if d.get("kind") == "PersistentVolumeClaim"}


def test_every_secret_and_claim_a_pod_mounts_is_declared():
    secrets, claims = _secrets_created_in_readme(), _claims_declared()
    assert secrets, "deploy/k8s/README.md creates no Secret"
    for pod in _pods():
        volumes = {v["name"]: v for v in pod["volumes"]}
        for c in pod["containers"]:
            assert {m["name"] for m in c["volumeMounts"]} <= volumes.keys()
        for v in volumes.values():
            if "secret" in v:
                assert v["secret"]["secretName"] in secrets
                assert {i["key"] for i in v["secret"]["items"]} <= secrets[v["secret"]["secretName"]]
            if "persistentVolumeClaim" in v:
                claim = claims[v["persistentVolumeClaim"]["claimName"]]
                assert claim["spec"]["accessModes"] == ["ReadWriteMany"]  # head and workers on different nodes


def _mounted(pod: dict, path: str) -> tuple[dict, str]:
    """The volume that holds `path` in this pod, and the path inside it."""
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for m in container["volumeMounts"]:
        if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/"):
            return volumes[m["name"]], path[len(m["mountPath"]) :].strip("/")
    raise AssertionError(f"{path} is on no volume of the pod")


def test_the_serve_args_name_paths_on_the_mounted_volumes_of_every_pod():
    args = _args()
    for pod in _pods():  # the app is built, and replicas run, on any node
        state, _ = _mounted(pod, args["state_dir"])
        assert "persistentVolumeClaim" in state
        for arg in ("nats_password_file", "api_key_file"):
            secret, inside = _mounted(pod, args[arg])
            assert inside in {i["path"] for i in secret["secret"]["items"]}, arg
    config = Path(args["config"])  # in the image: the repository at /app (Dockerfile)
    assert config.is_relative_to("/app") and (ROOT / config.relative_to("/app")).exists()
    assert re.search(r"^WORKDIR /app$", (ROOT / "Dockerfile").read_text(), re.M)


def test_nats_url_user_and_password_match_the_nats_release():
    values, args = _load("nats-jetstream.yaml"), _args()
    url = urlparse(args["nats_url"])
    chart = yaml.safe_load((SCHEMAS / "nats-2.14.2-values.yaml").read_text())
    assert (url.scheme, url.hostname, url.port) == ("nats", values["fullnameOverride"], chart["config"]["nats"]["port"])
    (user,) = values["config"]["merge"]["authorization"]["users"]
    assert user["user"] == load_settings(ROOT / "config" / "k8s.yaml").nats.user
    var = re.fullmatch(r"<< \$(\w+) >>", user["password"]).group(1)  # the chart's syntax for a nats.conf variable
    ref = values["container"]["env"][var]["valueFrom"]["secretKeyRef"]
    pod = _pods()[0]
    secret, inside = _mounted(pod, args["nats_password_file"])
    item = next(i for i in secret["secret"]["items"] if i["path"] == inside)
    assert (ref["name"], ref["key"]) == (secret["secret"]["secretName"], item["key"])  # one password, both sides


def test_the_stream_is_replicated_on_every_server_of_the_nats_cluster():
    values = _load("nats-jetstream.yaml")
    s = load_settings(ROOT / _args()["config"].removeprefix("/app/"))
    assert values["config"]["jetstream"]["enabled"] and values["config"]["cluster"]["enabled"]
    assert s.nats.replicas == values["config"]["cluster"]["replicas"] == 3


def test_self_endpoints_reach_the_serve_service_kuberay_makes():
    url = urlparse(_args()["own_url"])
    assert url.hostname == f"{_service()['metadata']['name']}-serve-svc"
    assert url.port == _serve_config()["http_options"]["port"]


def test_the_image_installs_the_packages_setup_sh_installs_and_bakes_the_model_the_preset_reads(tmp_path, monkeypatch):
    docker, setup = (ROOT / "Dockerfile").read_text(), (ROOT / "scripts" / "setup.sh").read_text()

    def pins(text):
        return {p for line in re.findall(r"pip install (?:-q )?--no-deps ([^;\n]+)", text) for p in line.split()}

    assert pins(docker) == pins(setup) != set()
    (home,) = re.findall(r"ensure_base_model\(Path\('([^']+)'\)\)", docker)
    from policies.weights.model_store import ensure_base_model

    folder = tmp_path / Path(load_settings(ROOT / "config" / "k8s.yaml").model.path).relative_to(home)
    folder.mkdir(parents=True)
    for f in ("model.safetensors", "config.json"):
        (folder / f).touch()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # another folder: an error, not a conversion
    assert ensure_base_model(tmp_path) == folder  # the image's conversion into `home` is what the preset reads
