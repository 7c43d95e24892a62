"""The API guard lets the chat page call back the server that served it: an Origin equal to
the request's own scheme://Host passes, for a Host the server names; a foreign Origin, or a
same-looking one under a Host let in only by '*', is still refused."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from acespec.edge.api.guard import ApiGuard, GuardConfig


async def _ok(_request):
    return JSONResponse({"ok": True})


def _client(cfg: GuardConfig, base: str) -> TestClient:
    app = Starlette(routes=[Route("/v1/chat/completions", _ok, methods=["POST"])])
    return TestClient(ApiGuard(app, cfg), base_url=base)


def _post(client: TestClient, origin: str, **headers) -> int:
    return client.post("/v1/chat/completions", json={}, headers={"Origin": origin, **headers}
                       ).status_code


@pytest.mark.parametrize("base", ["http://127.0.0.1:8000", "http://localhost:8000",
                                  "http://[::1]:8000"])
def test_same_origin_is_accepted(base):
    assert _post(_client(GuardConfig.for_bind("127.0.0.1"), base), base) == 200


def test_bound_and_allowed_hosts_count_as_own():
    cfg = GuardConfig.for_bind("0.0.0.0", allow_hosts=["mylaptop.local"])
    assert _post(_client(cfg, "http://mylaptop.local:8000"), "http://mylaptop.local:8000") == 200


def test_other_origins_are_refused():
    client = _client(GuardConfig.for_bind("127.0.0.1"), "http://127.0.0.1:8000")
    for origin in ("http://evil.test", "http://127.0.0.1:8001", "https://127.0.0.1:8000",
                   "http://127.0.0.1", "null"):
        assert _post(client, origin) == 403, origin


def test_rebound_host_is_refused_even_when_origin_matches_it():
    client = _client(GuardConfig.for_bind("127.0.0.1"), "http://evil.test:8000")
    assert _post(client, "http://evil.test:8000") == 403  # the Host check refuses it
    wildcard = _client(GuardConfig.for_bind("127.0.0.1", allow_hosts=["*"]),
                       "http://evil.test:8000")
    assert _post(wildcard, "http://evil.test:8000") == 403  # '*' lets the Host in, not the page
    assert _post(wildcard, "http://127.0.0.1:8000", Host="127.0.0.1:8000") == 200


def test_the_key_is_still_needed():
    cfg = GuardConfig.for_bind("127.0.0.1", api_key="KEY")
    client = _client(cfg, "http://127.0.0.1:8000")
    assert _post(client, "http://127.0.0.1:8000") == 401
    assert _post(client, "http://127.0.0.1:8000", Authorization="Bearer KEY") == 200
