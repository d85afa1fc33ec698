"""Configuration: flag > environment > config file > default, for the fleet-mode keys."""

import pytest

from classifier.config import load_config
from classifier.errors import ConfigError


def test_fleet_keys_default_to_one_machine(monkeypatch):
    for var in ("FLYWHEEL_STORE", "FLYWHEEL_MASK_PII", "FLYWHEEL_LOG_RETENTION_DAYS"):
        monkeypatch.delenv(var, raising=False)
    cfg = load_config()
    assert cfg.store is None and cfg.mask_pii is False and cfg.log_retention_days is None
    assert cfg.store_poll_s == 5.0 and cfg.ship_interval_s == 5.0 and cfg.spool_max_mb == 256.0
    assert cfg.replica_name   # the host name when not configured


def test_env_beats_file_and_flag_beats_env(monkeypatch, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text('store = "s3://from-file/p"\nmask_pii = true\nstore_poll_s = 9\n'
                                      'log_retention_days = 30\n')
    monkeypatch.setenv("FLYWHEEL_HOME", str(home))
    monkeypatch.setenv("FLYWHEEL_STORE", "s3://from-env/prefix")
    monkeypatch.setenv("FLYWHEEL_MASK_PII", "off")
    cfg = load_config()
    assert cfg.store == "s3://from-env/prefix" and cfg.sources["store"] == "env"
    assert cfg.mask_pii is False and cfg.sources["mask_pii"] == "env"
    assert cfg.store_poll_s == 9.0 and cfg.log_retention_days == 30.0 and cfg.sources["store_poll_s"] == "file"
    assert load_config(store="s3://from-flag/x").store == "s3://from-flag/x"


@pytest.mark.parametrize("var, value, words", [
    ("FLYWHEEL_STORE", "/var/lib/bucket", "s3://"),
    ("FLYWHEEL_MASK_PII", "maybe", "mask_pii must be true or false"),
    ("FLYWHEEL_SPOOL_MAX_MB", "0", "spool_max_mb must be > 0"),
    ("FLYWHEEL_STORE_POLL", "soon", "store_poll_s must be a number"),
    ("FLYWHEEL_LOG_RETENTION_DAYS", "-1", "log_retention_days must be >= 0"),
])
def test_bad_fleet_settings_name_the_key(monkeypatch, var, value, words):
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError, match=words):
        load_config()
