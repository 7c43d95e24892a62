"""The Kubernetes manifests (deploy/k8s, deploy/prometheus, deploy/grafana) as kustomize
renders them, each resource valid against the Kubernetes API's schemas (kubernetes-validate,
strict) and wired to the others: probes on the verifier's gRPC health, the scrape
annotations on its metrics port, a headless Service and a PodDisruptionBudget over its pods,
Envoy hashing on the session header over that Service (its config parsed against Envoy's
API protos), the tensor-parallel and demo variants; and Envoy's ring hash, modelled, keeps a session on one verifier and moves about
a third of them when one of three goes away."""

from __future__ import annotations

import copy
import random
import uuid
from bisect import bisect_left
from math import ceil
from pathlib import Path

import kubernetes_validate
import pytest
import xxhash
import yaml
from envoy.config.bootstrap.v3 import bootstrap_pb2

# The typed configs the shipped Envoy config names: imported, their types resolve.
from envoy.extensions.filters.http.router.v3 import router_pb2  # noqa: F401
from envoy.extensions.filters.network.http_connection_manager.v3 import (  # noqa: F401
    http_connection_manager_pb2,
)
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2  # noqa: F401
from google.protobuf import json_format

from acespec.proto import SESSION_KEY

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBERNETES = "1.34.0"  # the Kubernetes version the manifests are validated against
KUSTOMIZATIONS = ["k8s/base", "k8s/overlays/demo", "k8s/overlays/tp", "prometheus", "grafana"]
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}


# -- a kustomize of the features the manifests use ----------------------------------------

def _json_patch(doc: dict, ops: list[dict]) -> None:
    """RFC 6902 add, replace and remove, as kustomize applies a patch file's ops."""
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~")
                          for p in op["path"].split("/")[1:]]
        node = doc
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if op["op"] == "remove":
            del node[int(last) if isinstance(node, list) else last]
        elif isinstance(node, list):
            if op["op"] == "add":
                node.insert(len(node) if last == "-" else int(last), op["value"])
            else:
                node[int(last)] = op["value"]
        else:
            assert op["op"] == "add" or last in node, op
            node[last] = op["value"]


def render(folder: Path) -> list[dict]:
    """The resources `kubectl kustomize folder` prints (for the features used here:
    resources, namespace, configMapGenerator without name hashes, JSON 6902 patches with a
    target, `$patch: delete`, images)."""
    k = yaml.safe_load((folder / "kustomization.yaml").read_text())
    assert k["kind"] == "Kustomization"
    docs: list[dict] = []
    for res in k.get("resources", []):
        path = (folder / res).resolve()
        if path.is_dir():
            docs += render(path)
        else:
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    for gen in k.get("configMapGenerator", []):
        assert k["generatorOptions"]["disableNameSuffixHash"] is True
        data = {}
        for f in gen["files"]:
            key, _, rel = f.rpartition("=") if "=" in f else (Path(f).name, "", f)
            data[key] = (folder / rel).read_text()
        docs.append({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": gen["name"]}, "data": data})
    for patch in k.get("patches", []):
        body = yaml.safe_load((folder / patch["path"]).read_text())
        if "target" in patch:
            t = patch["target"]
            hits = [d for d in docs if d["kind"] == t["kind"] and d["metadata"]["name"] == t["name"]]
            assert hits, patch
            for d in hits:
                _json_patch(d, body)
        else:
            assert body.pop("$patch") == "delete", patch
            gone = [d for d in docs if (d["kind"], d["metadata"]["name"]) ==
                    (body["kind"], body["metadata"]["name"])]
            assert gone, patch
            docs = [d for d in docs if d not in gone]
    for image in k.get("images", []):
        for d in docs:
            for c in _containers(d):
                if c["image"] == image["name"]:
                    c["image"] = f"{image.get('newName', image['name'])}:{image['newTag']}"
    if "namespace" in k:
        for d in docs:
            if d["kind"] not in CLUSTER_SCOPED:
                d["metadata"]["namespace"] = k["namespace"]
    return copy.deepcopy(docs)


def _containers(doc: dict) -> list[dict]:
    return doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])


def find(docs: list[dict], kind: str, name: str) -> dict:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


# -- validity ------------------------------------------------------------------------------

@pytest.mark.parametrize("folder", KUSTOMIZATIONS)
def test_every_resource_is_valid_kubernetes(folder):
    docs = render(DEPLOY / folder)
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    names = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(names) == len(set(names)), names


def test_the_validator_refuses_a_wrong_resource():
    doc = find(render(DEPLOY / "k8s/base"), "Deployment", "acespec-verifier")
    doc["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpc"]["port"] = "grpc"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    doc = find(render(DEPLOY / "k8s/base"), "Service", "acespec-verifier")
    doc["spec"]["clusterIp"] = "None"  # a misspelt field: strict validation names it
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


# -- wiring --------------------------------------------------------------------------------

def test_the_verifier_is_probed_scraped_and_served_headless():
    docs = render(DEPLOY / "k8s/base")
    dep = find(docs, "Deployment", "acespec-verifier")
    pod = dep["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert c["command"] == ["acespec", "cloud", "serve"]
    assert int(flag(c["args"], "--port")) == ports["grpc"]
    assert int(flag(c["args"], "--metrics-port")) == ports["metrics"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == ports["grpc"]
    assert c["readinessProbe"]["grpc"]["service"] == "acespec.v1.Verifier"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["spec"]["terminationGracePeriodSeconds"] > float(flag(c["args"], "--grace"))
    ann = pod["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true"
    assert int(ann["prometheus.io/port"]) == ports["metrics"]
    labels = pod["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"] == labels
    svc = find(docs, "Service", "acespec-verifier")
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["selector"] == labels
    pdb = find(docs, "PodDisruptionBudget", "acespec-verifier")
    assert pdb["spec"]["selector"]["matchLabels"] == labels
    assert pdb["spec"]["maxUnavailable"] < dep["spec"]["replicas"]
    # Prometheus keeps exactly these pods (deploy/prometheus/prometheus.yml).
    scrape = yaml.safe_load((DEPLOY / "prometheus/prometheus.yml").read_text())
    (job,) = scrape["scrape_configs"]
    keep = {r["source_labels"][0]: r["regex"] for r in job["relabel_configs"]
            if r.get("action") == "keep"}
    assert job["job_name"] == "acespec-verifier"
    assert keep["__meta_kubernetes_pod_label_app_kubernetes_io_name"] == \
        labels["app.kubernetes.io/name"]


def envoy_config(docs: list[dict]) -> dict:
    return yaml.safe_load(find(docs, "ConfigMap", "acespec-envoy")["data"]["envoy.yaml"])


def test_the_envoy_config_is_what_envoy_reads():
    """Parsed as Envoy parses its bootstrap: against Envoy's API protos (xds-protos), every
    field and every typed config known; a misspelt field is refused."""
    cfg = envoy_config(render(DEPLOY / "k8s/base"))
    boot = json_format.ParseDict(cfg, bootstrap_pb2.Bootstrap())
    (cluster,) = boot.static_resources.clusters
    assert cluster.ring_hash_lb_config.minimum_ring_size.value == 1024
    cfg["static_resources"]["clusters"][0]["lb_polcy"] = "RING_HASH"
    with pytest.raises(json_format.ParseError, match="lb_polcy"):
        json_format.ParseDict(cfg, bootstrap_pb2.Bootstrap())


def test_envoy_hashes_sessions_over_the_headless_service():
    docs = render(DEPLOY / "k8s/base")
    cfg = envoy_config(docs)
    (listener,) = cfg["static_resources"]["listeners"]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    (route,) = hcm["route_config"]["virtual_hosts"][0]["routes"]
    # The header nginx hashes on (acespec.cloud.serving.nginx): the edge sends it on every call.
    assert route["route"]["hash_policy"] == [{"header": {"header_name": SESSION_KEY}}]
    (cluster,) = cfg["static_resources"]["clusters"]
    assert route["route"]["cluster"] == cluster["name"]
    assert cluster["lb_policy"] == "RING_HASH" and cluster["type"] == "STRICT_DNS"
    assert cluster["ring_hash_lb_config"]["hash_function"] == "XX_HASH"
    assert cluster["health_checks"][0]["grpc_health_check"]["service_name"] == \
        "acespec.v1.Verifier"
    addr = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"][
        "address"]["socket_address"]
    svc = find(docs, "Service", "acespec-verifier")
    assert addr["address"] == f"acespec-verifier.{svc['metadata']['namespace']}.svc.cluster.local"
    assert addr["port_value"] == {p["name"]: p["port"] for p in svc["spec"]["ports"]}["grpc"]
    envoy = find(docs, "Deployment", "acespec-envoy")
    (c,) = _containers(envoy)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert listener["address"]["socket_address"]["port_value"] == ports["grpc"]
    assert flag(c["args"], "-c") == "/etc/envoy/envoy.yaml"
    front = find(docs, "Service", "acespec")
    assert front["spec"]["selector"] == envoy["spec"]["selector"]["matchLabels"]


def test_the_tensor_parallel_variant_gives_one_pod_its_ranks_gpus():
    docs = render(DEPLOY / "k8s/overlays/tp")
    (c,) = _containers(find(docs, "Deployment", "acespec-verifier"))
    ranks = int(flag(c["args"], "--tp"))
    assert ranks > 1 and c["resources"]["limits"]["nvidia.com/gpu"] == ranks
    assert {"name": "shm", "mountPath": "/dev/shm"} in c["volumeMounts"]


def test_the_demo_runs_on_cpus_with_prometheus_and_grafana():
    docs = render(DEPLOY / "k8s/overlays/demo")
    (c,) = _containers(find(docs, "Deployment", "acespec-verifier"))
    assert flag(c["args"], "--device") == "cpu" and "--model" not in c["args"]
    assert "nvidia.com/gpu" not in str(c["resources"]) and "volumeMounts" not in c
    assert not [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    prom = find(docs, "ConfigMap", "acespec-prometheus")["data"]
    assert prom["alerts.yml"] == (DEPLOY / "prometheus/alerts.yml").read_text()
    assert "alerts.yml" in yaml.safe_load(prom["prometheus.yml"])["rule_files"]
    svc = find(docs, "Service", "acespec-prometheus")
    sources = yaml.safe_load(find(docs, "ConfigMap", "acespec-grafana-provisioning")[
        "data"]["datasources.yaml"])["datasources"]
    assert sources[0]["url"] == f"http://{svc['metadata']['name']}:{svc['spec']['ports'][0]['port']}"
    dashboards = find(docs, "ConfigMap", "acespec-grafana-dashboards")["data"]
    assert dashboards["acespec-verifier.json"] == \
        (DEPLOY / "grafana/acespec-verifier.json").read_text()


# -- Envoy's ring hash -----------------------------------------------------------------------

def ring(hosts: list[str], minimum_ring_size: int, maximum_ring_size: int
         ) -> tuple[list[int], list[str]]:
    """Envoy's RING_HASH ring for equally weighted hosts ('ip:port'): each host's
    '{address}_{i}' hashed with xxHash64, as many times as the ring size needs."""
    scale = min(ceil(minimum_ring_size / len(hosts)) * len(hosts), maximum_ring_size)
    per_host = ceil(scale / len(hosts))
    points = sorted((xxhash.xxh64_intdigest(f"{h}_{i}".encode()), h)
                    for h in hosts for i in range(per_host))
    return [p for p, _ in points], [h for _, h in points]


def pick(ring_: tuple[list[int], list[str]], session: str) -> str:
    """The host a request whose session header is `session` goes to: the first ring entry
    at or after the header's xxHash64, wrapping around."""
    hashes, owners = ring_
    return owners[bisect_left(hashes, xxhash.xxh64_intdigest(session.encode())) % len(hashes)]


def test_the_ring_keeps_a_session_on_one_verifier_and_moves_a_third_when_one_leaves():
    cfg = envoy_config(render(DEPLOY / "k8s/base"))
    size = cfg["static_resources"]["clusters"][0]["ring_hash_lb_config"]
    hosts = ["10.0.0.11:50051", "10.0.0.12:50051", "10.0.0.13:50051"]
    rng = random.Random(0)
    sessions = [uuid.UUID(int=rng.getrandbits(128)).hex for _ in range(3000)]
    three = ring(hosts, size["minimum_ring_size"], size["maximum_ring_size"])
    before = {s: pick(three, s) for s in sessions}
    # One session, one verifier: whichever order DNS lists them in, every time.
    shuffled = ring(rng.sample(hosts, 3), size["minimum_ring_size"], size["maximum_ring_size"])
    assert all(pick(shuffled, s) == before[s] for s in sessions)
    share = [sum(v == h for v in before.values()) / len(sessions) for h in hosts]
    assert all(0.25 < x < 0.42 for x in share), share
    # One of three leaves: its sessions move, and a few others: Envoy keeps the ring's size,
    # so each of the two takes more points, and those reshuffle some arcs between them
    # (here 41 % of the sessions move in all, 83 % of the movers from the verifier gone).
    two = ring(hosts[:2], size["minimum_ring_size"], size["maximum_ring_size"])
    moved = [s for s in sessions if pick(two, s) != before[s]]
    assert 0.28 < len(moved) / len(sessions) < 0.45, len(moved)
    assert sum(before[s] == hosts[2] for s in moved) > 0.75 * len(moved)
    assert {s for s in sessions if before[s] == hosts[2]} <= set(moved)
