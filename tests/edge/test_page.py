"""The chat page as `edge serve` serves it (the real app, behind the API guard with a key):
`/` and its files come with their content types and the page's Content-Security-Policy,
without the key; everything the page loads is one of its files, and nothing in them names
another site."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
from starlette.testclient import TestClient

from acespec.edge.api.app import create_app
from acespec.edge.api.guard import GuardConfig
from acespec.edge.api.page import TYPES, static_files

BASE = "http://127.0.0.1:8000"
SVG_NAMESPACE = 'xmlns="http://www.w3.org/2000/svg"'  # a name, never fetched


@pytest.fixture(scope="module")
def client() -> TestClient:
    """The routes need no service to serve the page."""
    return TestClient(create_app(None, GuardConfig.for_bind("127.0.0.1", api_key="KEY")),
                      base_url=BASE)


class _Refs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.refs: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.refs += [v for k, v in attrs if k in ("src", "href", "action") and v]


def test_index_is_served_without_the_key(client):
    r = client.get("/")
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/html; charset=utf-8"
    assert "default-src 'self'" in r.headers["content-security-policy"]
    assert r.headers["x-content-type-options"] == "nosniff"
    assert client.post("/v1/chat/completions", json={}).status_code == 401  # the API: keyed


def test_every_file_the_page_loads_is_served_with_its_type(client):
    parser = _Refs()
    parser.feed(client.get("/").text)
    assert {"static/chat.js", "static/chat.css"} <= set(parser.refs)
    for ref in parser.refs:
        assert re.fullmatch(r"static/[\w.-]+", ref), ref  # relative: this server
        r = client.get(f"/{ref}")
        assert r.status_code == 200, ref
        assert r.headers["content-type"] == TYPES[ref[ref.rfind("."):]], ref
        assert "content-security-policy" in r.headers


def test_unknown_files_are_404(client):
    for path in ("/static/nope.js", "/static/index.html", "/static/..%2Fpage.py",
                 "/static/"):
        assert client.get(path).status_code == 404, path


def test_nothing_names_another_site():
    for name, (content, _) in static_files().items():
        text = content.decode()
        if name.endswith(".svg"):
            text = text.replace(SVG_NAMESPACE, "")
        assert not re.search(r"[a-z][a-z0-9+.-]*://", text, re.I), name  # no absolute URL
        assert not re.search(r"""(["'(=]\s*)//[\w.-]""", text), name  # nor protocol-relative
        assert "@import" not in text and "url(" not in text, name
    script = static_files()["chat.js"][0].decode()
    for target in re.findall(r"""fetch\(\s*["'`]([^"'`]+)""", script):
        assert re.fullmatch(r"[\w/.-]+", target) and not target.startswith("/"), target
