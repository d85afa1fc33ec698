"""fleet.config and fleet.objects against a real S3 server (``weed mini``, tests/support/s3.py)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.request
from datetime import timezone

import pytest

from flywheel.fleet.config import StoreConfig
from flywheel.fleet.errors import FleetError, PreconditionFailed, StoreConfigError, StoreUnavailable
from flywheel.fleet.objects import NOT_MODIFIED, ObjectStore
from tests.support.servers import free_port

ENV = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE12345",
       "AWS_SECRET_ACCESS_KEY": "wJalr/XUtnFEMI+K7MDENG", "AWS_SESSION_TOKEN": "tok-SECRET-123"}
SECRETS = (ENV["AWS_ACCESS_KEY_ID"], ENV["AWS_SECRET_ACCESS_KEY"], ENV["AWS_SESSION_TOKEN"])


# ---- configuration (no server) ----

def test_parse_reads_the_url_and_the_environment():
    cfg = StoreConfig.parse("  s3://my-bucket/fleet/prod/  ", ENV)
    assert (cfg.bucket, cfg.prefix, cfg.endpoint, cfg.region) == ("my-bucket", "fleet/prod", "http://127.0.0.1:9",
                                                                 "us-east-1")
    assert cfg.allow_http and cfg.url == "s3://my-bucket/fleet/prod"
    assert cfg.location("models/CURRENT") == "s3://my-bucket/fleet/prod/models/CURRENT"
    assert StoreConfig.parse("s3://my-bucket", ENV).prefix == ""
    aws = StoreConfig.parse("s3://my-bucket/p", {**ENV, "AWS_ENDPOINT_URL": "", "AWS_DEFAULT_REGION": "eu-west-1"})
    assert (aws.endpoint, aws.region, aws.allow_http) == (None, "eu-west-1", False)
    s3_only = StoreConfig.parse("s3://my-bucket", {**ENV, "AWS_ENDPOINT_URL_S3": "https://s3.example.com/",
                                                   "AWS_REGION": "r1"})
    assert (s3_only.endpoint, s3_only.region, s3_only.allow_http) == ("https://s3.example.com", "r1", False)


@pytest.mark.parametrize("url, says", [
    ("", "no store configured"),
    (None, "no store configured"),
    ("http://my-bucket/p", "s3://BUCKET/PREFIX"),
    ("my-bucket/p", "s3://BUCKET/PREFIX"),
    ("s3://", "no bucket"),
    ("s3:///prefix", "no bucket"),
    ("s3://Bad_Bucket/p", "not a valid bucket name"),
    ("s3://my-bucket/a//b", "empty, '.' or '..' segment"),
    ("s3://my-bucket/a/../b", "empty, '.' or '..' segment"),
    ("s3://my-bucket/p?x=1", "no user, query or fragment"),
])
def test_parse_refuses_a_bad_url(url, says):
    with pytest.raises(StoreConfigError) as err:
        StoreConfig.parse(url, ENV)
    assert says in str(err.value)
    assert err.value.exit_code == 2


def test_a_url_with_user_info_is_refused_without_echoing_it():
    with pytest.raises(StoreConfigError) as err:
        StoreConfig.parse("s3://AKIDINURL:hunter2secret@my-bucket/p", ENV)
    assert "hunter2secret" not in str(err.value) and "AKIDINURL" not in str(err.value)


@pytest.mark.parametrize("endpoint", ["ftp://host", "http://", "localhost:8333", "http://h:notaport",
                                      "http://user:pw@h:1"])
def test_parse_refuses_a_bad_endpoint(endpoint):
    with pytest.raises(StoreConfigError, match="AWS_ENDPOINT_URL must be http") as err:
        StoreConfig.parse("s3://my-bucket/p", {**ENV, "AWS_ENDPOINT_URL": endpoint})
    assert "pw" not in str(err.value)


def test_missing_credentials_are_named_never_shown():
    env = {k: v for k, v in ENV.items() if k != "AWS_SECRET_ACCESS_KEY"}
    with pytest.raises(StoreConfigError) as err:
        StoreConfig.parse("s3://my-bucket/p", env)
    assert "AWS_SECRET_ACCESS_KEY" in str(err.value) and "AWS_ACCESS_KEY_ID" not in str(err.value)
    assert not any(s in str(err.value) for s in SECRETS)
    with pytest.raises(StoreConfigError, match="AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"):
        StoreConfig.parse("s3://my-bucket/p", {"AWS_ACCESS_KEY_ID": "  "})


def test_repr_str_and_redact_show_no_secret():
    cfg = StoreConfig.parse("s3://my-bucket/p", ENV)
    shown = repr(cfg) + str(cfg) + repr(ObjectStore(cfg))
    assert "my-bucket" in shown and not any(s in shown for s in SECRETS)
    leak = f"sig for {SECRETS[0]} with {SECRETS[1]} or wJalr%2FXUtnFEMI%2BK7MDENG and token={SECRETS[2]}"
    assert cfg.redact(leak) == "sig for *** with *** or *** and token=***"


def test_an_invalid_key_is_a_caller_bug():
    store = ObjectStore(StoreConfig.parse("s3://my-bucket/p", ENV))
    for key in ("", "/abs", "trailing/", "a//b", "a/../b", "./a", "bad\nkey"):
        with pytest.raises(ValueError, match="invalid object key"):
            store.get(key)


# ---- against the server ----

@pytest.mark.slow
def test_put_if_absent_creates_once(objects):
    assert objects.put_if_absent("log/a.parquet", b"first") is True
    assert objects.put_if_absent("log/a.parquet", b"second") is False
    data, etag = objects.get("log/a.parquet")
    assert data == b"first" and etag == objects.head("log/a.parquet")


@pytest.mark.slow
def test_put_if_match_is_compare_and_swap(objects):
    e1 = objects.put_if_match("models/CURRENT", b'{"version": "v1"}', None)
    with pytest.raises(PreconditionFailed, match="models/CURRENT"):
        objects.put_if_match("models/CURRENT", b"create-only again", None)
    e2 = objects.put_if_match("models/CURRENT", b'{"version": "v2"}', e1)
    assert e2 != e1
    with pytest.raises(PreconditionFailed):
        objects.put_if_match("models/CURRENT", b'{"version": "stale"}', e1)
    assert objects.get("models/CURRENT") == (b'{"version": "v2"}', e2)


@pytest.mark.slow
def test_conditional_get(objects):
    etag = objects.put_if_match("models/CURRENT", b"one", None)
    assert objects.get("models/CURRENT", if_none_match=etag) is NOT_MODIFIED
    new = objects.put_if_match("models/CURRENT", b"two", etag)
    assert objects.get("models/CURRENT", if_none_match=etag) == (b"two", new)
    assert objects.get("models/CURRENT", if_none_match=new) is NOT_MODIFIED


@pytest.mark.slow
def test_a_missing_key_is_none(objects):
    assert objects.get("models/CURRENT") is None
    assert objects.get("models/CURRENT", if_none_match='"0123456789abcdef0123456789abcdef"') is None
    assert objects.head("models/CURRENT") is None
    objects.put_if_absent("models/v1/manifest.json", b"{}")
    assert objects.get("models/v1") is None  # a "directory" is no object
    assert objects.get("models/v1", if_none_match='"0123456789abcdef0123456789abcdef"') is None


@pytest.mark.slow
def test_list_gives_relative_keys_under_a_prefix(objects, s3_server, store_env):
    for key, data in [("log/decisions/date=2026-01-01/a.parquet", b"aa"),
                      ("log/decisions/date=2026-01-02/b.parquet", b"bbb"),
                      ("log/labels/date=2026-01-01/c.parquet", b"c"), ("logs/other", b"x")]:
        assert objects.put_if_absent(key, data)
    got = objects.list("log/decisions")
    assert [(o.key, o.size) for o in got] == [("log/decisions/date=2026-01-01/a.parquet", 2),
                                              ("log/decisions/date=2026-01-02/b.parquet", 3)]
    assert all(o.last_modified.tzinfo is not None for o in got)
    assert got[0].last_modified.astimezone(timezone.utc).year >= 2024
    assert [o.key for o in objects.list("log/")] == [o.key for o in objects.list("log")]
    assert len(objects.list("log")) == 3 and len(objects.list()) == 4
    assert objects.list("nothing/here") == []
    other = ObjectStore(StoreConfig.parse(store_env + "/log"))  # a deeper prefix sees keys relative to it
    assert [o.key for o in other.list("labels")] == ["labels/date=2026-01-01/c.parquet"]


@pytest.mark.slow
def test_delete(objects):
    objects.put_if_absent("log/redacted/x.parquet", b"x")
    objects.delete("log/redacted/x.parquet")
    assert objects.get("log/redacted/x.parquet") is None and objects.list("log") == []
    objects.delete("log/redacted/x.parquet")  # already gone: no error


@pytest.mark.slow
def test_contended_compare_and_swap_loses_no_update(objects):
    objects.put_if_match("counter", json.dumps({"n": 0}).encode(), None)
    threads, per_thread, conflicts = 4, 10, []

    def bump():
        for _ in range(per_thread):
            for _attempt in range(200):
                data, etag = objects.get("counter")
                n = json.loads(data)["n"]
                try:
                    objects.put_if_match("counter", json.dumps({"n": n + 1}).encode(), etag)
                    break
                except PreconditionFailed:
                    conflicts.append(1)
            else:
                raise AssertionError("no progress")

    workers = [threading.Thread(target=bump) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
    assert json.loads(objects.get("counter")[0]) == {"n": threads * per_thread}


def _assert_no_secret(text: str, *secrets: str) -> None:
    assert text and not any(s in text for s in secrets), text


@pytest.mark.slow
def test_an_unreachable_store_fails_fast_and_names_no_secret(s3_server):
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}", "AWS_ACCESS_KEY_ID": s3_server.access_key,
           "AWS_SECRET_ACCESS_KEY": s3_server.secret_key}
    store = ObjectStore(StoreConfig.parse("s3://flywheel-test/p", env))
    for call in (lambda: store.get("k"), lambda: store.put_if_absent("k", b"x"), lambda: store.list("k"),
                 lambda: store.head("k"), lambda: store.delete("k"), lambda: store.put_if_match("k", b"x", '"e"')):
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailable) as err:
            call()
        assert time.monotonic() - t0 < 5
        assert "s3://flywheel-test/p/k" in str(err.value)
        _assert_no_secret(str(err.value), s3_server.access_key, s3_server.secret_key)


@pytest.mark.slow
def test_a_silent_store_times_out():
    """A server that accepts connections and never answers: every call ends within its timeout."""
    srv, held = socket.socket(), []
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    threading.Thread(target=lambda: [held.append(srv.accept()) for _ in iter(int, 1)], daemon=True).start()
    env = {**ENV, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{srv.getsockname()[1]}"}
    store = ObjectStore(StoreConfig.parse("s3://flywheel-test/p", env), timeout_s=1.0)
    try:
        for call in (lambda: store.get("k"), lambda: store.put_if_absent("k", b"x")):
            t0 = time.monotonic()
            with pytest.raises(StoreUnavailable):
                call()
            assert time.monotonic() - t0 < 4
    finally:
        srv.close()
        for conn, _ in held:
            conn.close()


@pytest.mark.slow
def test_wrong_credentials_are_refused_without_echoing_them(s3_server, store_env):
    env = {"AWS_ENDPOINT_URL": s3_server.endpoint, "AWS_ACCESS_KEY_ID": s3_server.access_key,
           "AWS_SECRET_ACCESS_KEY": "not-the-secret-5e3b"}
    store = ObjectStore(StoreConfig.parse(store_env, env))
    with pytest.raises(FleetError, match="access denied") as err:
        store.put_if_absent("k", b"x")
    assert not isinstance(err.value, StoreUnavailable)
    _assert_no_secret(str(err.value), s3_server.access_key, "not-the-secret-5e3b", s3_server.secret_key)


@pytest.mark.slow
def test_the_parsed_credentials_win_over_the_process_environment(monkeypatch, store_env):
    store = ObjectStore(StoreConfig.parse(store_env))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "someone-else")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "stale-token")
    assert store.put_if_absent("k", b"x") and store.get("k")[0] == b"x"


@pytest.mark.slow
def test_the_server_restarts_with_its_data(s3_server, objects):
    etag = objects.put_if_match("models/CURRENT", b"kept", None)
    s3_server.stop()
    assert not s3_server.running
    t0 = time.monotonic()
    with pytest.raises(StoreUnavailable):
        objects.get("models/CURRENT")
    assert time.monotonic() - t0 < 5
    s3_server.start()
    assert s3_server.startup_s < 30
    assert objects.get("models/CURRENT") == (b"kept", etag)  # the same client, its old connections dead
    assert objects.put_if_absent("after-restart", b"y")


@pytest.mark.slow
def test_deleted_bytes_are_gone_after_a_vacuum(s3_server, objects):
    """What the retention tests rely on: a deleted object's bytes leave the volume files once
    the master vacuums (``<master_url>/vol/vacuum?garbageThreshold=...``)."""
    marker = b"raw-text-marker-" + bytes(str(time.time_ns()), "ascii")
    # random bytes around it: SeaweedFS gzips a compressible upload, which would hide the marker
    objects.put_if_absent("log/decisions/x.parquet", os.urandom(4096) + marker + os.urandom(4096))
    assert _found_in(s3_server.data_dir, marker)
    objects.delete("log/decisions/x.parquet")
    deadline = time.monotonic() + 20  # the filer passes a delete on to the volume server asynchronously
    while _found_in(s3_server.data_dir, marker):
        assert time.monotonic() < deadline, "the deleted bytes survived vacuums for 20 s"
        with urllib.request.urlopen(f"{s3_server.master_url}/vol/vacuum?garbageThreshold=0.0001", timeout=60) as r:
            assert r.status == 200
        time.sleep(0.25)


def _found_in(directory, needle: bytes) -> bool:
    return any(needle in p.read_bytes() for p in directory.rglob("*") if p.is_file())
