"""Issue 41's scripted walk: a shop's deployment through its life, in one process (the
sidecar in process, every command through ``flywheel.cli.main``), on the tests' hash
encoders. A made-up intent set, traffic, an edit, the README's cron line, two rollbacks,
an encoder switch and sidecar restarts: at every check no process serves an intent the
configured file lacks, and no restart fails while a stored version matches the file.

Between an edit of the file and the retrain that trains it, a running sidecar has no model
of the new file and keeps serving the last one; ``flywheel check`` says so (exit 1), and the
walk checks what is served once the cron line has run, as a deploy would.
"""

from __future__ import annotations

import copy
import time
from contextlib import contextmanager
from typing import Any, Iterator

import pytest

import flywheel.classifier.encoders as encoders
from flywheel.classifier.settings.config import load_config
from flywheel.classifier.settings.intents import parse_intents
from flywheel.classifier.versions.registry import ModelRegistry
from flywheel.cli import main
from flywheel.service.server import ServerOptions, create_server
from tests.support.fakes import HashEmbedder
from tests.support.intent_sets import NEW_DOC, OLD_DOC, write_doc
from tests.support.sidecar import LOCAL, client

pytestmark = pytest.mark.slow   # a sidecar, several retrains

HASH, OTHER = HashEmbedder(), HashEmbedder(128, "fake:other-128")
PROBES = ["when do you open", "are you open on sunday", "show my invoices", "what is addvar",
          "cancel subscription", "explain addparam", "weather tomorrow", "holiday opening times"]
TRAFFIC = [*PROBES, "what plan am i on", "how do loops work", "my billing history", "what types exist",
           "opening hours on sunday", "upgrade my plan", "documentation for requests", "payment method"]


def _encoder(settings: Any, cache_root: Any = None) -> HashEmbedder:
    return OTHER if settings.backend == "e5-multilingual" else HASH


@contextmanager
def sidecar() -> Iterator[Any]:
    """A sidecar started with the configuration as it is now (a restart is a new one)."""
    server = create_server(load_config(), ServerOptions(address=LOCAL))
    try:
        server.start()
        with client(server) as fw:
            yield server, fw
    finally:
        server.stop(grace_s=1.0)


def cli(capsys: Any, *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def labels_of(doc: dict[str, Any]) -> set[str | None]:
    return {*parse_intents(doc).labels, None}


def serves_only(fw: Any, doc: dict[str, Any]) -> str:
    """Every probe's answer is an intent of ``doc`` (or out of scope); the version serving."""
    allowed = labels_of(doc)
    decisions = [fw.classify(t) for t in PROBES]
    assert {d.label for d in decisions} <= allowed, [(d.label, d.model_version) for d in decisions]
    return decisions[-1].model_version


def follows(fw: Any, version: str, timeout_s: float = 15.0) -> None:
    end = time.monotonic() + timeout_s
    while fw.classify("show my invoices").model_version != version:
        assert time.monotonic() < end, f"the sidecar never swapped in {version}"
        time.sleep(0.05)


def test_a_shops_deployment_never_serves_an_intent_its_file_lacks(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    home.mkdir()
    shop = write_doc(tmp_path / "shop.yaml", OLD_DOC)
    (home / "config.toml").write_text(f'intents = "{shop}"\nteacher = "off"\n')
    monkeypatch.setenv("FLYWHEEL_HOME", str(home))
    monkeypatch.delenv("FLYWHEEL_INTENTS", raising=False)
    monkeypatch.setattr(encoders, "make_embedder", _encoder)
    reg = ModelRegistry(home / "models")
    cron = ("retrain", "--min-new-labels", "1", "--quiet")      # the README's crontab line, a smaller N

    with sidecar() as (server, fw):
        # traffic on the first intent set, a few human corrections
        ids = [fw.classify(t).id for t in TRAFFIC * 4]
        for decision_id, text in zip(ids[:16], TRAFFIC):
            fw.feedback(decision_id, "OPENING_HOURS" if "open" in text else None if "weather" in text
                        else "PLATFORM" if any(w in text for w in ("plan", "invoice", "billing", "payment",
                                                                      "subscription")) else "RETRIEVAL")
        serves_only(fw, OLD_DOC)
        server.runtime.sink.flush(timeout=10)                   # the decisions and labels are in the log
        rc, out, err = cli(capsys, *cron, "--promote-untested", "--tolerance", "1")   # few rows: the shop asks
        assert rc == 0 and out.startswith("promoted "), (out, err)
        first = reg.current_name()
        follows(fw, first)                                       # the first promotion, without a restart
        serves_only(fw, OLD_DOC)

        # the shop removes OPENING_HOURS; the next cron run trains the edited file and promotes it
        write_doc(shop, NEW_DOC)
        rc, out, err = cli(capsys, "check")                      # the window until the retrain: says so
        assert rc == 1 and f"serves {first}, trained on another intent set" in out and "agree:      NO" in out, out
        rc, out, err = cli(capsys, *cron)
        assert rc == 0 and out.startswith("promoted "), (out, err)
        edited = reg.current_name()
        follows(fw, edited)
        assert serves_only(fw, NEW_DOC) == edited
        assert cli(capsys, "check")[0] == 0

        # rollback one: the version before is of the old set: refused, nothing moves
        rc, out, err = cli(capsys, "models", "rollback")
        assert rc == 2 and reg.current_name() == edited, err
        assert f"refusing to roll back to {first}" in err and "--force" in err, err
        # rollback two: the default model of the configured file, then back to the retrained one
        rc, out, err = cli(capsys, "models", "rollback", "--to-default")
        assert rc == 0, err
        default = reg.current_name()
        follows(fw, default)
        serves_only(fw, NEW_DOC)
        rc, out, err = cli(capsys, "models", "rollback")
        assert rc == 0 and reg.current_name() == edited, err
        follows(fw, edited)
        serves_only(fw, NEW_DOC)

    with sidecar() as (server, fw):                              # a restart: the file's version
        assert serves_only(fw, NEW_DOC) == edited

        # an encoder switch in the file: the retrain gates it against the champion on its own encoder
        switched = {**copy.deepcopy(NEW_DOC), "embedder": {"backend": "e5-multilingual"}}
        write_doc(shop, switched)
        rc, out, err = cli(capsys, *cron, "--json")
        assert rc == 0, err
        assert "encoder switch: champion" in out and "first model" not in out, out
        now = reg.current_name()
        if now != edited:
            follows(fw, now)
        serves_only(fw, switched)

    with sidecar() as (server, fw):                              # a restart after the switch: never exit 2
        assert server.metrics.registry.get_sample_value("flywheel_serving_other_intent_set") == 0
        version = serves_only(fw, switched)
        bundled = ModelRegistry(home / "models").load(version).intents
        assert bundled.embedder.backend == "e5-multilingual"
    assert cli(capsys, "check")[0] in (0, 1)
