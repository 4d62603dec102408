"""Make the JSON Schemas that tests/unit/test_k8s_manifests.py validates deploy/k8s against, from upstream files.

    python deploy/k8s/schemas/make_schemas.py PATH/TO/ray.io_rayservices.yaml

Inputs: KubeRay's RayService CRD (`ray-operator/config/crd/bases/ray.io_rayservices.yaml` of the release named in
README.md here; 1 MB, not kept) and the nats chart's `values.yaml` (kept here: chart 2.14.2 has no
values.schema.json, so its keys are the schema). Outputs, kept here beside it:
- rayservice-v1.json: the CRD's `v1` openAPIV3Schema as a JSON Schema, as strict as the API server with
  `kubectl apply`'s default strict field validation: an object that lists its properties takes no others
  (unless the CRD preserves unknown fields or declares `additionalProperties`). `description`s and the
  `x-kubernetes-*` markers are dropped; `status` is dropped too (a manifest does not set it);
  `apiVersion` and `kind` are pinned.
- persistentvolumeclaim-v1.json: a PersistentVolumeClaim whose spec and metadata are the CRD's own copies of
  Kubernetes' PersistentVolumeClaimSpec and ObjectMeta (a pod's ephemeral volume template carries them).
- nats-values.schema.json: the chart's values as a schema: a map that lists keys takes only those keys, an
  empty map (`merge`, `env`, `resources`, ...) and a list take anything, a leaf takes a value of its
  default's type or the chart's `$tplYaml` template map.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).parent
DRAFT = "https://json-schema.org/draft/2020-12/schema"
DATA_KEYS = ("default", "enum", "required", "example")  # values, not schemas


def strict(node):
    """One CRD (OpenAPI v3, structural) schema node as a strict JSON Schema node."""
    if isinstance(node, list):
        return [strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in ("description", "nullable") or key.startswith("x-kubernetes-"):
            continue
        if key in ("properties", "patternProperties"):
            out[key] = {name: strict(sub) for name, sub in value.items()}
        else:
            out[key] = value if key in DATA_KEYS else strict(value)
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if "properties" in out and "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def rayservice_schema(crd: dict) -> dict:
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = strict(v1["schema"]["openAPIV3Schema"])
    del schema["properties"]["status"]
    schema["properties"]["apiVersion"] = {"enum": [f"{crd['spec']['group']}/v1"]}
    schema["properties"]["kind"] = {"enum": [crd["spec"]["names"]["kind"]]}
    schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
    return {"$schema": DRAFT, **schema}


def pvc_schema(rayservice: dict) -> dict:
    pod = rayservice["properties"]["spec"]["properties"]["rayClusterConfig"]["properties"]["headGroupSpec"]["properties"][
        "template"
    ]["properties"]["spec"]
    claim = pod["properties"]["volumes"]["items"]["properties"]["ephemeral"]["properties"]["volumeClaimTemplate"]
    return {
        "$schema": DRAFT,
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"enum": ["v1"]},
            "kind": {"enum": ["PersistentVolumeClaim"]},
            "metadata": claim["properties"]["metadata"],
            "spec": claim["properties"]["spec"],
        },
    }


TEMPLATE = {
    "type": "object",
    "additionalProperties": False,
    "minProperties": 1,
    "maxProperties": 1,
    "properties": {"$tplYaml": {"type": "string"}, "$tplYamlSpread": {"type": "string"}},
}
LEAF = {bool: "boolean", int: "integer", float: "number", str: "string"}


def values_schema(values) -> dict:
    """The chart's values.yaml as a JSON Schema (see the module docstring)."""
    if isinstance(values, dict) and values:
        return {"type": "object", "additionalProperties": False, "properties": {k: values_schema(v) for k, v in values.items()}}
    if isinstance(values, dict):
        return {"type": "object"}
    if isinstance(values, list):
        return {"type": "array"}
    leaf = {"type": LEAF[type(values)]} if values is not None else {"type": ["string", "number", "boolean", "null"]}
    return {"anyOf": [leaf, {"$ref": "#/$defs/template"}]}


def write(name: str, schema: dict) -> None:
    (HERE / name).write_text(json.dumps(schema, indent=0, sort_keys=True) + "\n")


def main(crd_path: str) -> None:
    rayservice = rayservice_schema(yaml.safe_load(Path(crd_path).read_text()))
    write("rayservice-v1.json", rayservice)
    write("persistentvolumeclaim-v1.json", pvc_schema(rayservice))
    values = yaml.safe_load((HERE / "nats-2.14.2-values.yaml").read_text())
    write("nats-values.schema.json", {"$schema": DRAFT, "$defs": {"template": TEMPLATE}, **values_schema(values)})


if __name__ == "__main__":
    main(sys.argv[1])
