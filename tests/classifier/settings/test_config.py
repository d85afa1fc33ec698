"""Configuration: flag > environment > config file > default, for the fleet-mode keys and the
home the encoders cache under."""

import pytest

from flywheel.classifier.errors import ConfigError
from flywheel.classifier.settings.config import load_config
from flywheel.classifier.settings.intents import parse_intents


def test_fleet_keys_default_to_one_machine(monkeypatch):
    for var in ("FLYWHEEL_STORE", "FLYWHEEL_MASK_PII", "FLYWHEEL_LOG_RETENTION_DAYS"):
        monkeypatch.delenv(var, raising=False)
    cfg = load_config()
    assert cfg.store is None and cfg.mask_pii is False and cfg.log_retention_days is None
    assert cfg.store_poll_s == 5.0 and cfg.ship_interval_s == 5.0 and cfg.spool_max_mb == 256.0
    assert cfg.replica is None   # the fleet's pointer moves are signed user@host


def _host(cfg, backend="ollama"):
    from flywheel.classifier.teachers import build_teacher
    from tests.support.docs import DOC

    doc = {**DOC, "teacher": {"backend": backend, "model": "m"}}
    return build_teacher(cfg, parse_intents(doc)).host


def test_teacher_host_is_one_setting_for_either_backend(monkeypatch, tmp_path):
    """``--teacher-host`` arrives as ``teacher_host`` and reaches the ollama backend too, from
    a flag, ``FLYWHEEL_TEACHER_HOST`` or the config file; the old ``ollama_host`` (key, and
    ``OLLAMA_HOST``) still reaches ollama, where it comes from a higher source."""
    monkeypatch.setenv("OLLAMA_HOST", "http://ollama-env:11434")
    assert _host(load_config(teacher_host="http://flag:11434")) == "http://flag:11434"
    assert _host(load_config(teacher_host="http://flag:8000/v1"), "openai") == "http://flag:8000/v1"
    assert _host(load_config()) == "http://ollama-env:11434"                 # OLLAMA_HOST as before
    monkeypatch.setenv("FLYWHEEL_TEACHER_HOST", "http://teacher-env:11434")
    assert _host(load_config()) == "http://teacher-env:11434"                # the same source: teacher_host
    monkeypatch.delenv("FLYWHEEL_TEACHER_HOST")
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("FLYWHEEL_HOME", str(home))
    (home / "config.toml").write_text('teacher_host = "http://teacher-file:11434"\n')
    assert _host(load_config()) == "http://ollama-env:11434"                 # env beats the file
    monkeypatch.delenv("OLLAMA_HOST")
    assert _host(load_config()) == "http://teacher-file:11434"
    (home / "config.toml").write_text('ollama_host = "http://old-key:11434"\n')  # the old key still works
    assert _host(load_config()) == "http://old-key:11434"
    assert load_config().teacher_host is None


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


def test_the_resolved_home_decides_the_encoder_caches(monkeypatch, tmp_path):
    """A ``--home`` flag reaches the encoder's per-home cache (the USE tokenizer), for the
    served model and for the default model trained on first use; ONNX exports go to one
    cache for every home (the user cache dir, or FLYWHEEL_ONNX_CACHE). Nothing is loaded."""
    import flywheel.classifier.layer2.fitter
    from flywheel.classifier.assembly import build_classifier
    from flywheel.classifier.layer2.fitter import fit_model
    from flywheel.classifier.versions.default import served_model
    from tests.support.docs import DOC
    from tests.support.fakes import HashEmbedder

    env_home, flag_home = tmp_path / "env-home", tmp_path / "flag-home"
    monkeypatch.setenv("FLYWHEEL_HOME", str(env_home))
    monkeypatch.delenv("FLYWHEEL_ONNX_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))   # platformdirs' user cache dir on Linux
    cfg = load_config(home=flag_home, teacher="off")
    assert cfg.cache_root == flag_home / "cache"

    # a served English model: MiniLM on ONNX Runtime, exports in the machine's cache, not the home's
    model_dir = fit_model(parse_intents(DOC), embedder=HashEmbedder(384, "minilm:all-MiniLM-L6-v2:int8"),
                          version="en-v1").save(tmp_path / "en-v1")
    served = build_classifier(load_config(home=flag_home, model=str(model_dir), teacher="off"))
    assert served.embedder.inner.onnx_cache_dir == tmp_path / "xdg" / "flywheel" / "onnx"
    assert not served.embedder.inner.is_loaded
    monkeypatch.setenv("FLYWHEEL_ONNX_CACHE", str(tmp_path / "shared"))
    shared = build_classifier(load_config(home=flag_home, model=str(model_dir), teacher="off"))
    assert shared.embedder.inner.onnx_cache_dir == tmp_path / "shared"

    # the starter set (multilingual) trained on first use: its encoder caches under the flag's home
    seen = {}

    def stop(intents, *, embedder, **kwargs):
        seen["embedder"] = embedder
        raise RuntimeError("stop before training")

    monkeypatch.setattr(flywheel.classifier.layer2.fitter, "fit_model", stop)
    with pytest.raises(RuntimeError, match="stop before training"):
        served_model(cfg, progress=False)
    assert seen["embedder"].inner.cache_dir == flag_home / "cache" / "use"
    assert not env_home.exists()


@pytest.mark.parametrize("var, value, words", [
    ("FLYWHEEL_TEACHER_HOST", "http://127.0.0.1:99999/v1",
     "teacher_host 'http://127.0.0.1:99999/v1' (from env) is not a usable address: Port out of range"),
    ("OLLAMA_HOST", "127.0.0.1:70000", "ollama_host '127.0.0.1:70000' (from env) is not a usable address"),
    ("OLLAMA_HOST", "http://localhost:port", "ollama_host 'http://localhost:port' (from env)"),
])
def test_a_teacher_host_with_a_port_out_of_range_is_refused(monkeypatch, tmp_path, var, value, words):
    """Issue 41, item 7: a port outside 0-65535 is refused wherever one is read, here the
    teacher's address (flag, variable or config file), not taken modulo 65536 by a client."""
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError) as info:
        load_config()
    assert words in str(info.value)
    monkeypatch.delenv(var)
    (tmp_path / "config.toml").write_text('teacher_host = "http://10.0.0.2:65536"\n')
    with pytest.raises(ConfigError, match=r"teacher_host 'http://10.0.0.2:65536' \(from file\)"):
        load_config(home=tmp_path)
    assert load_config(teacher_host="http://10.0.0.2:65535/v1").teacher_host == "http://10.0.0.2:65535/v1"
    assert load_config(ollama_host="localhost").ollama_host == "localhost"        # no port: the default one


def test_check_port_and_split_address_refuse_what_a_socket_would_wrap():
    from flywheel.classifier.settings.listen import check_port, split_address

    assert check_port("0", "--port") == 0 and check_port(65535, "--port") == 65535
    for bad, words in [(65536, "port 65536 is out of range"), (-1, "port -1 is out of range"),
                       ("8o80", "port '8o80' is not a whole number"), (True, "is not a whole number"),
                       ("\u0661\u0662", "is not a whole number")]:
        with pytest.raises(ConfigError, match=words):
            check_port(bad, "--port")
    assert split_address("[::1]:50051", "--address") == ("[::1]", 50051)
    with pytest.raises(ConfigError, match=r"--address 127.0.0.1:99999: port 99999 is out of range \(0 to 65535\)"):
        split_address("127.0.0.1:99999", "--address")
    with pytest.raises(ConfigError, match="expected host:port"):
        split_address("localhost", "--address")


def test_an_unknown_flag_is_refused_naming_it_and_the_known_ones(tmp_path):
    """A misspelt flag used to change nothing and say nothing (``tune_encoders`` for
    ``tune_encoder``); each setting is one flag (:class:`ConfigFlags`) and nothing else is taken."""
    from dataclasses import fields

    from flywheel.classifier.settings.config import Config, ConfigFlags

    settings = {f.name for f in fields(Config)} - {"sources"}
    assert set(ConfigFlags.__annotations__) == settings
    with pytest.raises(TypeError) as info:
        load_config(home=tmp_path, tune_encoders=False)
    message = str(info.value)
    assert message.startswith("load_config() got an unknown flag 'tune_encoders'; did you mean 'tune_encoder'?")
    assert all(name in message for name in settings)
    with pytest.raises(TypeError, match=r"unknown flag 'verbose' \(known: audit_rate, home, intents"):
        load_config(verbose=True)
    assert load_config(home=tmp_path, tune_encoder=False).tune_encoder is False
