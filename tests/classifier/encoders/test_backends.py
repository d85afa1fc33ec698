"""Each encoder backend is described once, in classifier/encoders/backends.py: the intent
file's parser accepts exactly the backends that have a spec, each spec has a builder and an
embedder, an unknown name is one named error, and no other library module spells a
backend's name (the scanner below, with a planted violation to show that it can fail).

The values a spec gives the rest of the library are pinned to what the code said before the
specs (encoder ids and model keys: heads, logged vectors and caches are keyed by them)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from flywheel.classifier.encoders import backends, base, embedders, factory
from flywheel.classifier.encoders.backends import (
    BACKENDS,
    MODEL_DIRECTORY,
    TuningRecipe,
    backend_spec,
    load_ref,
    resolve_backend,
)
from flywheel.classifier.errors import EmbedderError, IntentFileError, UnknownBackendError
from flywheel.classifier.settings.intents import (
    EMBEDDER_BACKENDS,
    TUNED_BY_DEFAULT,
    EmbedderSettings,
    parse_intents,
)
from flywheel.training.tuner.finetune import TuningError, tuning_recipe
from tests.support.paths import ROOT

LIBRARY = ("classifier", "logstore", "fleet", "service", "training", "flywheel")
SPEC_MODULE = Path("classifier/encoders/backends.py")
# names too common to scan for: "auto" is also every other setting's "choose for me"
UNSCANNED = {"auto"}
# quoted backend names that are not the backend: (file, name, why)
ALLOWED = {(Path("classifier/versions/model.py"), "sentence-transformers"): "the pip distribution, in a version's "
           "library versions"}
INTENTS = [{"name": "A", "examples": ["uno", "dos"]}, {"name": "B", "examples": ["x", "y"]}]


def _doc(**embedder: object) -> dict:
    return {"version": 1, "languages": ["en", "es"], "embedder": embedder, "intents": INTENTS}


# ------------------------------------------------------------------- one spec a backend


def test_the_parser_accepts_exactly_the_backends_with_a_spec():
    assert EMBEDDER_BACKENDS == tuple(BACKENDS)
    for name in BACKENDS:
        parsed = parse_intents(_doc(backend=name)).embedder.backend
        assert parsed == resolve_backend(name, ["en", "es"]).id and not backend_spec(parsed).resolves
    with pytest.raises(IntentFileError, match="embedder.backend must be one of auto, minilm, "):
        parse_intents(_doc(backend="e5"))
    assert {s.id for s in BACKENDS.values()} == set(BACKENDS)   # each under its own name


def test_every_backend_has_its_builder_and_embedder_and_auto_resolves_to_one():
    served = {s.id for s in BACKENDS.values() if not s.resolves}
    assert set(factory.BUILDERS) == served
    classes = {cls.spec.id for cls in vars(embedders).values()
               if isinstance(cls, type) and isinstance(getattr(cls, "spec", None), backends.BackendSpec)}
    assert classes == served
    assert [s.id for s in BACKENDS.values() if s.resolves] == ["auto"]
    assert resolve_backend("auto").id == "minilm" and resolve_backend("auto", ["en"]).id == "minilm"
    assert resolve_backend("auto", ["en", "es"]).id == resolve_backend("auto", ["sw"]).id == "use-multilingual"
    assert resolve_backend("bge-m3", ["es"]) is backend_spec("bge-m3")


def test_what_the_specs_say_is_what_the_branches_said():
    assert TUNED_BY_DEFAULT == ("minilm", "e5-multilingual")
    assert (base.MINILM_ID, base.USE_ID, base.E5_ID, base.BGE_M3_HUB_ID) == (
        "minilm:all-MiniLM-L6-v2", "use-multilingual:v3", "e5-multilingual:multilingual-e5-small", "BAAI/bge-m3")
    # quantize: auto, as default_quantize had it (unknown names aside)
    for name in BACKENDS:
        for runtime in ("onnx", "torch"):
            for layers in (None, (3, 6)):
                old = runtime == "onnx" if name == "e5-multilingual" else (
                    name == "minilm" and runtime == "onnx" and not layers)
                assert base.default_quantize(name, runtime, layers) is old, (name, runtime, layers)
    assert tuning_recipe(EmbedderSettings(backend="e5-multilingual")) == TuningRecipe(
        query_prefix="query: ", freeze_word_embeddings=True, licence="LICENSE-NOTICE.txt")
    for name in ("auto", "minilm", "use-multilingual", "sentence-transformers", "bge-m3"):
        assert tuning_recipe(EmbedderSettings(backend=name)) == TuningRecipe("", False, None)
    assert backend_spec("minilm").model_names == {"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"}
    assert backend_spec("e5-multilingual").model_names == {"multilingual-e5-small", "intfloat/multilingual-e5-small"}
    assert not backend_spec("use-multilingual").model_names and not backend_spec("bge-m3").model_names


def test_model_keys_and_ids_are_those_of_before(tmp_path):
    """The process-wide model registry's keys and the encoder ids: the same tuples as the
    literals they were (a head, logged vectors and caches are keyed by these)."""
    where = (str(None), str(tmp_path))
    e5 = embedders.E5Embedder(device="cpu", runtime="torch", onnx_cache_dir=tmp_path)
    assert e5._key() == ("e5-multilingual", "cpu", False, False, True, *where)
    assert embedders.E5Embedder(runtime="onnx", num_threads=1, quantize=True, onnx_cache_dir=tmp_path)._key() == (
        "e5-multilingual", "onnx", True, 1, *where)
    assert embedders.MiniLMEmbedder(device="cpu", runtime="torch")._key() == ("minilm", "cpu", False, False, True, None)
    assert embedders.MiniLMEmbedder(runtime="onnx", layers=(3, 6), onnx_cache_dir=tmp_path)._key() == (
        "minilm", "onnx", False, None, (3, 6), str(tmp_path))
    assert embedders.USEMultilingualEmbedder()._key() == ("use-multilingual",)
    st = embedders.SentenceTransformerEmbedder(tmp_path, device="cpu", runtime="torch")
    assert st._key() == ("sentence-transformers", str(tmp_path.resolve()), "cpu", False, False, True)
    assert st.id == f"sentence-transformers:{tmp_path.name}"
    bge = embedders.BGEM3Embedder("org/model", device="cpu", runtime="torch")
    assert bge._key() == ("bge-m3", "org/model", 512, "cpu", False, False, True) and bge.id == "bge-m3:org/model"
    assert e5.dim == 384 and embedders.USEMultilingualEmbedder().dim == 512
    assert embedders.MiniLMEmbedder(layers=(3, 6)).dim == 768


def test_the_code_a_spec_names_is_there():
    refs = [(s.id, ref) for s in BACKENDS.values() for ref in (s.int8_keep_fp32, s.tune_from)
            if ref and ref != MODEL_DIRECTORY]
    assert refs, "some spec names code"
    for name, ref in refs:
        assert callable(load_ref(ref)), (name, ref)
    from flywheel.classifier.encoders.e5_convert import ffn_down_projections

    assert backend_spec("e5-multilingual").keep_fp32() is ffn_down_projections
    assert backend_spec("minilm").keep_fp32() is None


def test_the_spec_module_imports_nothing_of_the_project_but_its_errors():
    """The intent-file parser imports it (tests/test_architecture.py allows that one module of
    the encoders wing), so it must stay a leaf: no cycle through the wing."""
    tree = ast.parse((ROOT / SPEC_MODULE).read_text(encoding="utf-8"))
    project = sorted({node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
                      and node.module.split(".")[0] == "flywheel"})
    assert project == ["flywheel.classifier.errors"]


# ------------------------------------------------------------------- unknown names


def test_an_unknown_backend_is_one_named_error():
    with pytest.raises(UnknownBackendError, match=r"unknown embedder backend 'word2vec' \(known: auto, minilm") as err:
        backend_spec("word2vec")
    assert isinstance(err.value, EmbedderError) and err.value.name == "word2vec" and err.value.known == tuple(BACKENDS)
    with pytest.raises(UnknownBackendError):
        backend_spec("E5-Multilingual")          # names are as the intent file spells them: no second normalisation
    with pytest.raises(UnknownBackendError):
        backend_spec(None)                       # type: ignore[arg-type]
    with pytest.raises(UnknownBackendError, match="unknown embedder backend 'word2vec'"):
        factory.make_embedder(EmbedderSettings(backend="word2vec"))
    with pytest.raises(UnknownBackendError):
        base.default_quantize("word2vec", "onnx")


def test_settings_a_backend_cannot_take_are_refused_as_its_spec_says(tmp_path):
    with pytest.raises(IntentFileError, match=r"does not apply to the use-multilingual backend \(a numpy forward "
                                              r"pass\): leave it unset or 'auto'"):
        parse_intents(_doc(runtime="onnx"))
    with pytest.raises(EmbedderError, match=r"the use-multilingual backend takes no embedder.model or "
                                            r"embedder.runtime \(its numpy model ships in fast-universal-"):
        factory.make_embedder(EmbedderSettings(backend="use-multilingual", model="x"))
    with pytest.raises(EmbedderError, match="only supported by the minilm backend, not 'bge-m3'"):
        factory.make_embedder(EmbedderSettings(backend="bge-m3", layers=(3,)))
    for name in ("minilm", "e5-multilingual"):
        assert factory.make_embedder(EmbedderSettings(backend=name, model=f" {backend_spec(name).hub_id.upper()} "),
                                     cache=False).id.startswith(name)
    from flywheel.training.tuner.finetune import tunable_base

    with pytest.raises(TuningError, match=r"'bge-m3' cannot be fine-tuned in place \(tuning needs a BERT-like "
                                          r"mean-pooling encoder: minilm, e5-multilingual, or a sentence-transformers "
                                          r"directory\)"):
        tunable_base(EmbedderSettings(backend="bge-m3"))


# ------------------------------------------------------------------- the scanner

def _backend_literals(source: str, names: set[str]) -> list[tuple[int, str]]:
    """``(line, name)`` for every backend name in quotes (``"bge-m3"``, ``'minilm'``) in ``source``."""
    pattern = re.compile(r"""(["'])(%s)\1""" % "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)))
    return [(n, m.group(2)) for n, line in enumerate(source.splitlines(), start=1) for m in pattern.finditer(line)]


def _spelled_outside_the_specs(files: dict[Path, str], names: set[str]) -> list[str]:
    """``file:line: "name"`` for every quoted backend name outside the spec module (and :data:`ALLOWED`)."""
    return [f"{path}:{n}: {name!r}" for path, source in sorted(files.items()) if path != SPEC_MODULE
            for n, name in _backend_literals(source, names) if (path, name) not in ALLOWED]


def _library_sources() -> dict[Path, str]:
    # rglob does not follow flywheel/<room> (links): every file is read once
    return {p.relative_to(ROOT): p.read_text(encoding="utf-8") for top in LIBRARY for p in (ROOT / top).rglob("*.py")}


def test_no_library_module_spells_a_backend_name():
    names = set(BACKENDS) - UNSCANNED
    files = _library_sources()
    assert SPEC_MODULE in files and len(files) > 100       # the scan reads the library
    assert _backend_literals(files[SPEC_MODULE], names)     # ... and sees the specs' own names
    bad = _spelled_outside_the_specs(files, names)
    assert bad == [], ("backend names belong to classifier/encoders/backends.py; read the spec "
                       "(backend_spec(name), its fields) instead:\n" + "\n".join(bad))


def test_the_scanner_can_fail():
    names = set(BACKENDS) - UNSCANNED
    planted = {
        Path("training/tuner/planted.py"): 'x = 1\nif backend == "e5-multilingual":\n    pass\n',
        Path("classifier/encoders/other.py"): "ok = 'e5-multilingual:multilingual-e5-small'\nkey = ('bge-m3',)\n",
        Path("fleet/msg.py"): 'say = "use backend \'sentence-transformers\' here"\nfine = "minilm is prose"\n',
        Path("classifier/versions/model.py"): 'pkgs = ("torch", "sentence-transformers")\n',   # allowed
        SPEC_MODULE: 'MINILM = "minilm"\n',
    }
    assert _spelled_outside_the_specs(planted, names) == [
        "classifier/encoders/other.py:2: 'bge-m3'",
        "fleet/msg.py:1: 'sentence-transformers'",
        "training/tuner/planted.py:2: 'e5-multilingual'",
    ]
