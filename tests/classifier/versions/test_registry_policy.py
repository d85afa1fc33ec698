"""classifier.versions.registry_policy: the prune and rollback rules both registries follow (the
local home here; the bucket's in tests/fleet/test_registry_bucket.py, same scenario)."""

from __future__ import annotations

import pytest

from flywheel.classifier.errors import InvalidInputError
from flywheel.classifier.versions.registry_policy import (
    check_keep_counts,
    history_without,
    prune_plan,
    rollback_target,
    versions_to_keep,
)

NAMES = [f"v{i}" for i in range(1, 9)]


def test_prune_keeps_the_served_the_shadow_the_last_promoted_and_the_newest():
    hist = ["v1", "v2", "v3"]
    keep = versions_to_keep(NAMES, hist, served="v3", shadow="v5", keep_promoted=2, keep_recent=2)
    assert keep == {"v2", "v3", "v5", "v7", "v8"}
    assert prune_plan(NAMES, hist, served="v3", shadow="v5", keep_promoted=2, keep_recent=2) == ["v1", "v4", "v6"]
    # 0 keeps none of that kind; the served version and the shadow stay whatever the counts
    assert prune_plan(NAMES, hist, served="v3", shadow=None, keep_promoted=0, keep_recent=0) == \
        [n for n in NAMES if n != "v3"]
    for bad in (-1, True, 1.5):
        with pytest.raises(InvalidInputError, match="keep_recent must be"):
            check_keep_counts(2, bad)
        with pytest.raises(InvalidInputError, match="keep_promoted must be"):
            prune_plan(NAMES, hist, served=None, shadow=None, keep_promoted=bad, keep_recent=1)


def test_the_history_drops_pruned_versions_and_merges_what_then_repeats():
    assert history_without(["v1", "v2", "v1", "v3"], {"v2"}) == ["v1", "v3"]
    assert history_without(["v1", "v2"], set()) == ["v1", "v2"]


def test_rollback_goes_to_the_previous_promotion_past_the_served_version():
    assert rollback_target(["v1", "v2", "v3"], "v3") == ("v2", ["v1", "v2"])
    assert rollback_target(["v1", "v2", "v2"], "v2") == ("v1", ["v1"])
    assert rollback_target(["v1", "v2"], "v9") == ("v2", ["v1", "v2"])   # served by hand: back to the last promotion
    assert rollback_target(["v1"], "v1") is None and rollback_target([], None) is None


def test_the_local_registry_prunes_and_rolls_back_by_the_policy(tmp_path):
    from flywheel.classifier.layer2.fitter import fit_model
    from flywheel.classifier.settings.intents import parse_intents
    from flywheel.classifier.versions.registry import ModelRegistry
    from tests.support.bucket import save_version
    from tests.support.docs import DOC
    from tests.support.fakes import HashEmbedder

    trained = fit_model(parse_intents(DOC), embedder=HashEmbedder(), version="base")
    reg = ModelRegistry(tmp_path / "models")
    for name in NAMES:
        save_version(reg, trained, name)
    for name in ("v1", "v2", "v3", "v4"):
        reg.promote(name, verify=False)
    assert reg.rollback() == "v3" == rollback_target(["v1", "v2", "v3", "v4"], "v4")[0]
    reg.set_shadow("v5")
    plan = prune_plan(NAMES, reg.history(), served="v3", shadow="v5", keep_promoted=2, keep_recent=2)
    assert reg.prune(keep_promoted=2, keep_recent=2) == plan == ["v1", "v4", "v6"]
    assert reg.history() == history_without(["v1", "v2", "v3"], plan) == ["v2", "v3"]
    assert reg.rollback() == "v2"
