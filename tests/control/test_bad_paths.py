"""Paths holding a lone UTF-16 surrogate or a control character are refused at the API's
edge with a 422 naming the field, on every route that takes paths (issue 34)."""

from __future__ import annotations

import pytest

from .conftest import Api
from .test_api import store  # noqa: F401  (the store fixture)

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)

#: raw JSON (a client's encoder would refuse a lone surrogate): an escape is how one arrives
BAD = ["\\ud800", "/in/a\\udfffb", "/in/\\u0001x", "/in/tab\\tname", "/in/new\\nline", "/in/\\u007f"]


def raw_post(api: Api, url: str, body: str, token: str | None = None):
    return api.client.post(url, content=body.encode(), headers={**api.h(token), "Content-Type": "application/json"})


@pytest.mark.parametrize("bad", BAD)
def test_placements_refuse_bad_input_paths_with_422(api: Api, store, bad):  # noqa: F811
    r = raw_post(api, "/api/v1/placements", f'{{"inputs": ["/in/ok", "{bad}"], "nodes": ["a"]}}')
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"][:3] == ["body", "inputs", 1]


@pytest.mark.parametrize("bad", BAD)
def test_file_actions_refuse_bad_paths_with_422(api: Api, store, bad):  # noqa: F811
    for action in ("pin", "promote"):
        r = raw_post(api, "/api/v1/files/actions", f'{{"action": "{action}", "paths": ["/in/ok", "{bad}"]}}')
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"][:3] == ["body", "paths", 1]


@pytest.mark.parametrize("bad", ["/in/\x01x", "/in/tab\tname", "/in/new\nline", "/in/\x7f", "/in/nul\x00"])
def test_file_routes_refuse_bad_query_paths_with_422(api: Api, store, bad):  # noqa: F811
    for url in ("/api/v1/files", "/api/v1/files/info"):
        r = api.get(url, params={"path": bad}, token=api.read)
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["query", "path"]


@pytest.mark.parametrize("bad", BAD)
def test_manifests_refuse_bad_file_names_with_422(api: Api, store, bad):  # noqa: F811
    doc = (f'{{"name": "w", "jobs": [{{"name": "j1", "accesses": [{{"path": "in/ok", "size": "1M"}}, '
           f'{{"path": "{bad}", "size": "1M"}}]}}]}}')
    assert api.beat("a").status_code == 200
    r = raw_post(api, "/api/v1/manifests?nodes=a", doc)
    assert r.status_code == 422, r.text
    # the parser refuses a string no UTF-8 encodes where it reads it; the names it took, by job
    assert r.json()["detail"][0]["loc"] in (["body", "jobs", 0, "accesses", 1, "path"],
                                            ["body", "jobs", "j1", "inputs", 1])
