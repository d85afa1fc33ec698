"""Tests of the ``shadow`` section of ``flywheel stats`` (training.stats.shadow) on a
hand-built traffic log.

Champion sure = ``layer = 'embedding' AND degraded IS NULL``. Shadow ``v2`` answers
(``S`` = sure, ``u`` = unsure), with the reference label (human if any, else teacher):

====  ===========================  ========  ==================  ==========  ===========
id    champion (served)            sure      shadow v2           kind        reference
====  ===========================  ========  ==================  ==========  ===========
s01   embedding billing            S         S billing           agree       -
s02   embedding billing            S         S refund            flip        human refund
s03   embedding refund             S         u billing           abstaining  teacher refund
s04   llm shipping (l2 refund)     u         S shipping          permissive  inline shipping
s05   embedding billing, degraded  u         S None              permissive  -
s06   llm None (l2 refund)         u         u refund            agree       inline None
s07   embedding None               S         S None              agree       -
s08   embedding shipping           S         S billing           flip        human billing
                                                                             (teacher shipping later)
s09   embedding refund             S         u billing, then     agree       -
                                             S refund (latest)
s10   embedding billing            S         (v3 only)           -           -
s11   rules refund                 -         -                   -           -
====  ===========================  ========  ==================  ==========  ===========

n 9; agree 4 (s01 s06 s07 s09), permissive 2, abstaining 1, flips 2. Disagreements: 5
(s02 s03 s04 s05 s08), 4 labelled (s05 is not): the champion's served label is right on
s03 s04 (2/4), the shadow's on s02 s04 s08 (3/4). Champion unsure on s04 s05 s06 (3/9),
shadow on s03 s06 (2/9). A v2 answer for a decision not in the log and v3's answers
count nowhere.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from flywheel.classifier.decision import Decision, Layer, Layer2Answer, TeacherCall, Tier
from flywheel.classifier.protocols import DecisionRecord
from flywheel.classifier.shadow import ShadowAnswer
from flywheel.classifier.versions.registry import ModelRegistry
from flywheel.logstore import LabelRecord, LogStore, label_records_to_table
from flywheel.training.stats.shadow import count_shadow, empty_shadow, format_shadow, shadow_section
from flywheel.training.stats.traffic import convergence, empty_stats, format_table, stats_for_path

T0 = datetime(2024, 5, 1, tzinfo=timezone.utc).timestamp()
H = 3600.0


def rec(n: int, layer: Layer, label: str | None, *, l2: tuple[str | None, Tier] | None = None,
        teacher: TeacherCall | None = None, degraded: str | None = None,
        pending: bool = False) -> DecisionRecord:
    tier = Tier.CONFIDENT if label else Tier.NO_MATCH
    d = Decision(label=label, confidence=0.9, tier=tier, layer=layer, reason="test", model_version="v1",
                 teacher=teacher, degraded=degraded, id=f"s{n:02d}")
    if l2 is None and layer is Layer.EMBEDDING:  # layer 2 decided: its answer is the decision
        l2 = (label, tier)
    return DecisionRecord(decision=d, text=f"text {n}", created_at=T0 + n * H, pending=pending,
                          layer2=None if l2 is None else Layer2Answer(l2[0], 0.5, l2[1]))


def shadow(n: int | str, version: str, label: str | None, sure: bool, *, at: float) -> LabelRecord:
    did = n if isinstance(n, str) else f"s{n:02d}"
    tier = "confident" if sure else "weak"
    r = LabelRecord.shadow(did, version, label, 0.9 if sure else 0.3, tier, sure)
    return dataclasses.replace(r, created_at=at)


def answer(n: int, label: str | None, sure: bool) -> ShadowAnswer:
    return ShadowAnswer(f"s{n:02d}", "v3", label, 0.9 if sure else 0.3, "confident" if sure else "weak", sure)


def fill(store: LogStore) -> None:
    E, L = Layer.EMBEDDING, Layer.LLM
    decisions = [
        rec(1, E, "billing"),
        rec(2, E, "billing"),
        rec(3, E, "refund"),
        rec(4, L, "shipping", l2=("refund", Tier.AMBIGUOUS), teacher=TeacherCall("m", "shipping", True, 300.0)),
        rec(5, E, "billing", l2=("billing", Tier.WEAK), degraded="timeout", pending=True,
            teacher=TeacherCall("m", None, False, 5000.0, "timeout: no answer")),
        rec(6, L, None, l2=("refund", Tier.WEAK), teacher=TeacherCall("m", None, True, 280.0)),
        rec(7, E, None),
        rec(8, E, "shipping"),
        rec(9, E, "refund"),
        rec(10, E, "billing"),
        rec(11, Layer.RULES, "refund"),
    ]
    sink = store.open_sink(ingest_interval_s=None, fsync=False)
    for r in decisions:
        sink.write(r)
    # v3's answers go through the live path: the sink's add_shadow_answer
    sink.add_shadow_answer(answer(1, "refund", True))
    sink.add_shadow_answer(answer(10, "refund", True))
    sink.flush()
    sink.close()
    store.add_human_label("s02", "refund", author="ann")
    store.add_teacher_label("s03", "refund", "m", True)
    store.add_human_label("s08", "billing", author="ann")
    store.add_teacher_label("s08", "shipping", "m", True)     # later, but a human label wins

    at = {n: T0 + n * H + 30 for n in range(1, 12)}
    v2 = [
        shadow(1, "v2", "billing", True, at=at[1]),
        shadow(2, "v2", "refund", True, at=at[2]),
        shadow(3, "v2", "billing", False, at=at[3]),
        shadow(4, "v2", "shipping", True, at=at[4]),
        shadow(5, "v2", None, True, at=at[5]),
        shadow(6, "v2", "refund", False, at=at[6]),
        shadow(7, "v2", None, True, at=at[7]),
        shadow(8, "v2", "billing", True, at=at[8]),
        shadow(9, "v2", "billing", False, at=at[9] - 20),   # an older answer: the latest one counts
        shadow(9, "v2", "refund", True, at=at[9] + 10),
        shadow("zz-elsewhere", "v2", "refund", True, at=T0 + 20 * H),  # decision not in the log
    ]
    store.insert_objects([("test-shadow", "labels", label_records_to_table(v2))])
    # the same records shipped again (same label_uid) count once
    store.insert_objects([("test-shadow-again", "labels", label_records_to_table(v2[:3]))])


@pytest.fixture(scope="module")
def log_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("shadow") / "log" / "flywheel.duckdb"
    fill(LogStore(path))
    return path


EXPECTED = {
    "version": "v2",
    "n": 9,
    "agree": 4,
    "permissive": 2,
    "abstaining": 1,
    "flips": 2,
    "agreement": round(4 / 9, 6),
    "on_disagreements": {"n": 5, "n_labelled": 4, "champion_accuracy": 0.5, "shadow_accuracy": 0.75},
    "llm_share": {"champion": round(3 / 9, 6), "shadow": round(2 / 9, 6)},
    "first": "2024-05-01T01:00:30Z",
    "last": "2024-05-01T09:00:40Z",
}


def test_section_by_hand(log_path):
    s = shadow_section(LogStore(log_path), "v2")
    assert s == EXPECTED
    assert list(s) == list(EXPECTED)
    assert s["agree"] + s["permissive"] + s["abstaining"] + s["flips"] == s["n"]


def test_other_versions_and_counts(log_path):
    store = LogStore(log_path)
    assert shadow_section(store, None) is None
    # 10 answers of v2 for 9 decisions in the log (s09 twice counts once; the duplicate
    # shipment and the decision elsewhere are not counted); v3's two came through the sink
    assert count_shadow(store, "v2") == 9 == shadow_section(store, "v2")["n"]
    assert count_shadow(store, "v3") == 2
    assert count_shadow(store, "nope") == 0
    v3 = shadow_section(store, "v3")
    # s01 and s10: both sure, champion billing, v3 refund: two flips
    assert (v3["n"], v3["agree"], v3["flips"], v3["permissive"], v3["abstaining"]) == (2, 0, 2, 0, 0)
    assert v3["on_disagreements"] == {"n": 2, "n_labelled": 0, "champion_accuracy": None,
                                      "shadow_accuracy": None}
    assert v3["llm_share"] == {"champion": 0.0, "shadow": 0.0}
    assert shadow_section(store, "nope") == empty_shadow("nope")
    assert empty_shadow("x") == {
        "version": "x", "n": 0, "agree": 0, "permissive": 0, "abstaining": 0, "flips": 0, "agreement": None,
        "on_disagreements": {"n": 0, "n_labelled": 0, "champion_accuracy": None, "shadow_accuracy": None},
        "llm_share": {"champion": None, "shadow": None}, "first": None, "last": None}


def test_shadow_rows_are_not_training_labels(log_path):
    store = LogStore(log_path)
    assert {r.decision_id for r in store.labelled_rows()} == {"s02", "s03", "s04", "s06", "s08"}


def test_in_convergence_and_the_table(log_path, tmp_path):
    store = LogStore(log_path)
    s = convergence(store, window="day", shadow_version="v2")
    assert s["total"] == 11 and s["shadow"] == EXPECTED
    assert list(s)[-3:] == ["anchoring", "shadow", "windows"]
    assert convergence(store)["shadow"] is None
    assert "shadow" not in format_table(convergence(store))
    text = format_table(s)
    assert ("  shadow v2: agrees with the champion on 4/9 44.4% (2 permissive, 1 abstaining, 2 flipped); "
            "LLM share 33.3% -> 22.2%") in text.splitlines()
    assert "    on the 5 disagreements, 4 labelled: champion right 50.0%, shadow right 75.0%" in text.splitlines()
    assert format_shadow(empty_shadow("v9")) == "shadow v9: no answers in the log yet"
    v3 = format_shadow(shadow_section(store, "v3"))
    assert v3.splitlines()[1] == "  on the 2 disagreements, none labelled yet"
    # an empty log and a missing one
    empty = convergence(LogStore(tmp_path / "empty.duckdb"), shadow_version="v2")
    assert empty == empty_stats("day", "v2") | {"n_windows": 0}
    assert empty["shadow"] == empty_shadow("v2")
    assert convergence(LogStore(tmp_path / "empty.duckdb"))["shadow"] is None
    missing = stats_for_path(tmp_path / "none.duckdb", shadow_version="v2")
    assert missing["missing"] is True and missing["shadow"] == empty_shadow("v2")
    assert stats_for_path(tmp_path / "none.duckdb")["shadow"] is None
    assert stats_for_path(log_path, shadow_version="v2")["shadow"] == EXPECTED


# --------------------------------------------------------------------------- the command

def _home(tmp_path, log_path, name: str):
    import shutil

    home = tmp_path / name
    (home / "log").mkdir(parents=True)
    shutil.copy(log_path, home / "log" / "flywheel.duckdb")
    return home


def test_cli_reads_the_shadow_pointer(log_path, tmp_path):
    from flywheel.cli import build_app

    app = build_app()
    home = _home(tmp_path, log_path, "home")
    r = CliRunner().invoke(app, ["stats", "--json", "--home", str(home)])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["shadow"] is None          # no SHADOW pointer

    (home / "models" / "v2").mkdir(parents=True)           # a version (not loaded: verify=False)
    ModelRegistry(home / "models").set_shadow("v2", verify=False)
    r = CliRunner().invoke(app, ["stats", "--json", "--home", str(home)])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["shadow"] == EXPECTED
    r = CliRunner().invoke(app, ["stats", "--home", str(home)])
    assert r.exit_code == 0 and "shadow v2: agrees with the champion on 4/9" in r.stdout

    # --shadow overrides the pointer
    r = CliRunner().invoke(app, ["stats", "--json", "--home", str(home), "--shadow", "v3"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)["shadow"]
    assert (out["version"], out["n"], out["flips"]) == ("v3", 2, 2)


def test_cli_explicit_shadow_and_errors(log_path, tmp_path):
    from flywheel.classifier.errors import InvalidInputError
    from flywheel.cli import build_app

    app = build_app()
    r = CliRunner().invoke(app, ["stats", "--json", "--log-db", str(log_path), "--shadow", "v2"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["shadow"] == EXPECTED
    missing = tmp_path / "none.duckdb"
    r = CliRunner().invoke(app, ["stats", "--json", "--log-db", str(missing), "--shadow", "v2"])
    assert r.exit_code == 0 and json.loads(r.stdout)["shadow"] == empty_shadow("v2")
    r = CliRunner().invoke(app, ["stats", "--log-db", str(missing), "--shadow", " "])
    assert isinstance(r.exception, InvalidInputError) and "--shadow" in str(r.exception)

    # a registry that cannot be read: a warning, and no section
    home = _home(tmp_path, log_path, "bad-home")
    (home / "models").write_text("not a directory")
    r = CliRunner().invoke(app, ["stats", "--json", "--home", str(home)])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["shadow"] is None and "cannot read the shadow version" in r.stderr


def test_fleet_registry_down_leaves_the_section_out(capsys):
    from flywheel.fleet.errors import StoreUnavailable
    from flywheel.training.cli.offline import _registry_shadow

    class Down:   # a fleet site whose store does not answer
        fleet = True

        def registry(self, models=None):
            raise StoreUnavailable("store unreachable")

    assert _registry_shadow(Down()) is None
    assert "cannot read the shadow version (store unreachable)" in capsys.readouterr().err

    class Up:
        fleet = True

        def registry(self, models=None):
            return SimpleNamespace(shadow=lambda: "v7")

    assert _registry_shadow(Up()) == "v7"
