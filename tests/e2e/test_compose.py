"""docker-compose.yml against the Compose Specification schema (no Docker engine here), and
the images' separation: the cloud image has no llama.cpp, the edge image no torch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

jsonschema = pytest.importorskip("jsonschema")
yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]


def test_compose_file_is_valid_against_the_spec():
    schema = json.loads((ROOT / "tests/data/compose_spec.json").read_text())
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    jsonschema.Draft201909Validator(schema).validate(doc)
    services = doc["services"]
    assert {"cloud", "wan", "edge", "wan-tc", "bench", "test"} <= set(services)
    assert services["wan-tc"]["cap_add"] == ["NET_ADMIN"]
    for name in ("bench", "test", "wan-tc"):
        assert services[name]["profiles"]
    for svc in services.values():
        dockerfile = svc.get("build", {}).get("dockerfile")
        if dockerfile:
            assert (ROOT / dockerfile).is_file(), dockerfile


def test_images_keep_the_sides_apart():
    cloud = (ROOT / "docker/Dockerfile.cloud").read_text()
    edge = (ROOT / "docker/Dockerfile.edge").read_text()
    assert "'.[cloud]'" in cloud and "llama" not in cloud.replace("No llama.cpp", "")
    assert "'.[edge]'" in edge and "find_spec('torch') is None" in edge
    # checked in the build (docker/sides.py), installed from the host-built wheelhouse, and the
    # base is a build argument (a local Debian base where no registry answers)
    assert "sides.py cloud" in cloud and "sides.py edge" in edge
    for text in (cloud, edge, (ROOT / "docker/Dockerfile.dev").read_text()):
        assert "ARG BASE=" in text and "--no-index" in text
