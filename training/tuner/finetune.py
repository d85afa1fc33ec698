"""Fine-tuning the encoder itself on layer 2's labels (issue 22): :class:`EncoderTuner`.

The retrain fits a head on a frozen encoder; this module tunes the encoder (a Hugging
Face BERT-like directory, MiniLM's by default) on the same labelled texts, so that the
head that follows fits vectors from an encoder that has learned the intents.

- **Pooling**: attention-masked mean of the last hidden state, then L2 normalisation,
  exactly what :class:`~classifier.encoders.torch_runner.MeanPoolRunner` computes, so a
  tuned directory written by :meth:`EncoderTuner.save` serves the vectors it was tuned on.
- **Objectives** (``objective``):

  - ``cross_entropy`` (the default): a cosine-softmax classifier on the pooled vector,
    ``scale * cos(v, w_c)``, trained jointly with the encoder; its class weights start at
    the frozen encoder's class centroids, so the first steps already point the right way.
    Out of scope (label ``None``) is a class of its own, so out-of-scope rows are
    negatives for every intent. The encoder probe of 2026-11-26 measured it first on
    every seed, label variant and shot count (+1.5 to +4.0 points over the frozen encoder):
    one softmax over all intents pushes every row away from all the other intents at
    once, with a gradient at every row, where a contrastive loss sees only the few
    classes that share a batch.
  - ``contrastive``: supervised batch-contrastive loss (SupCon, Khosla et al. 2020) on the
    pooled vectors at ``temperature``; batches are built from chunks of 4 rows of one
    intent so that every anchor has positives. Out-of-scope rows are negatives in every
    denominator but never anchors or positives (out of scope is not one topic, so it is
    not pulled together). Second in the probe.

- **Hard negatives** (``hard_pairs``): a list of ``(intent_a, intent_b)`` confusion pairs
  (say, the champion's most confused intents; ``None`` names out of scope). Every epoch
  adds, per pair, extra chunks holding up to 4 rows of each intent side by side, so the
  two intents meet in the same batches (in ``cross_entropy`` their rows are seen twice
  per epoch; in ``contrastive`` they are each other's in-batch negatives). Pairs that name
  an intent the data does not have are skipped and counted in ``report_``.
- **Budget** (``budget_s``): wall-clock seconds for the whole ``fit`` (loading included).
  Before each step it checks whether the step would end past the budget (elapsed time
  plus the mean step so far); if so it stops there, between steps, with a consistent
  model, and sets ``stopped_early_``.
- **Then the head** (:func:`fit_model_tuned`, what ``flywheel eval --tune-encoder`` runs): the
  tuner sees the intent examples but not the out-of-scope examples, which stay honest
  evidence for the head's out-of-scope gate (an encoder tuned on them memorises them and
  the gate, fitted out of fold, stops working on unseen out-of-scope queries; see there).
- **Determinism**: ``seed`` seeds torch (inside a forked RNG state, so the caller's global
  torch RNG is untouched) and the numpy generator that shuffles the batches; the same
  data, seed and device give the same model.

torch and transformers are imported inside the functions that need them
(``tests/test_architecture.py`` allows model libraries here and under
``classifier.encoders`` only).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np

from flywheel.classifier.encoders.backends import BACKENDS, MODEL_DIRECTORY, TuningRecipe, resolve_backend
from flywheel.classifier.encoders.base import check_texts
from flywheel.classifier.encoders.torch_runner import hub_offline, minilm_model_dir
from flywheel.classifier.errors import TrainingError

if TYPE_CHECKING:
    from flywheel.classifier.settings.intents import EmbedderSettings

__all__ = ["CENTROID_ROWS", "EncoderTuner", "TunedEmbedder", "TuningError", "OBJECTIVES", "centroid_rows", "mean_pool",
           "load_trainable", "plan_batches", "torch_session", "tunable_base", "tuning_recipe", "warmup_linear"]

OBJECTIVES = ("cross_entropy", "contrastive")
CHUNK = 4           # rows of one intent kept together in a batch (contrastive, hard pairs)
PROGRESS_LINES = 10  # progress lines per epoch (at most)
LOSS_WINDOW = 10    # steps averaged into report_["loss_first"] and ["loss_last"]
CENTROID_ROWS = 64  # rows a class at most that its starting centroid is the mean of (cross_entropy)


class TuningError(TrainingError, ValueError):
    """The texts, labels or parameters cannot tune an encoder (a :class:`TrainingError`
    for the CLI's exit code, a :class:`ValueError` as scikit-learn expects)."""


def centroid_rows(y: np.ndarray, per_class: int, rng: np.random.Generator) -> np.ndarray:
    """Row indices for the classes' starting centroids: every row of a class with at most
    ``per_class`` rows, else a seeded draw of ``per_class`` of them; sorted."""
    out = []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        out.append(idx if len(idx) <= per_class else rng.choice(idx, size=per_class, replace=False))
    return np.sort(np.concatenate(out)) if out else np.zeros(0, dtype=int)


def plan_batches(y: np.ndarray, oos_index: int | None, batch_size: int, objective: str,
                 pairs: Sequence[tuple[int, int]], rng: np.random.Generator) -> list[np.ndarray]:
    """One epoch's batches (arrays of row indices) for class indices ``y``.

    Rows are grouped into chunks that must share a batch: single rows for
    ``cross_entropy``; for ``contrastive``, chunks of up to :data:`CHUNK` rows of one
    intent (out-of-scope rows stay single). Each hard pair ``(a, b)`` adds chunks of up to
    :data:`CHUNK` rows of ``a`` beside as many of ``b``. The chunks are shuffled and packed
    into batches of at most ``batch_size`` rows, in order.
    """
    chunks: list[np.ndarray] = []
    if objective == "contrastive":
        for c in np.unique(y):
            idx = rng.permutation(np.flatnonzero(y == c))
            size = 1 if c == oos_index else CHUNK
            chunks += [idx[k:k + size] for k in range(0, len(idx), size)]
    else:
        chunks = [np.array([i]) for i in rng.permutation(len(y))]
    for a, b in pairs:
        ia, ib = rng.permutation(np.flatnonzero(y == a)), rng.permutation(np.flatnonzero(y == b))
        for k in range(0, min(len(ia), len(ib)), CHUNK):
            chunks.append(np.concatenate([ia[k:k + CHUNK], ib[k:k + CHUNK]]))
    batches: list[np.ndarray] = []
    current: list[np.ndarray] = []
    filled = 0
    for j in rng.permutation(len(chunks)):
        chunk = chunks[j]
        if filled and filled + len(chunk) > batch_size:
            batches.append(np.concatenate(current))
            current, filled = [], 0
        current.append(chunk)
        filled += len(chunk)
    if current:
        batches.append(np.concatenate(current))
    return batches


@contextlib.contextmanager
def torch_session(device: str, seed: int, num_threads: int | None) -> Iterator[None]:
    """One fit's torch state: ``num_threads`` intra-op threads (``None``: as they are),
    restored afterwards (torch's setting is process-wide), and the RNG forked and seeded
    with ``seed``, so the caller's global torch RNG is untouched."""
    import torch

    fork_devices = [torch.device(device).index or 0] if device.startswith("cuda") else []
    threads = torch.get_num_threads()
    try:
        if num_threads is not None:
            torch.set_num_threads(int(num_threads))
        with torch.random.fork_rng(devices=fork_devices):
            torch.manual_seed(int(seed))
            yield
    finally:
        torch.set_num_threads(threads)


def load_trainable(base: Path, device: str, freeze_word_embeddings: bool) -> tuple[Any, Any]:
    """``(tokenizer, model)`` of the Hugging Face directory ``base``, in fp32 on ``device``;
    with ``freeze_word_embeddings`` the token-embedding matrix gets no gradient."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(base), local_files_only=True)
    model = AutoModel.from_pretrained(str(base), local_files_only=True).float().to(device)
    if freeze_word_embeddings:
        model.get_input_embeddings().weight.requires_grad_(False)
    return tokenizer, model


def warmup_linear(opt: Any, total: int) -> Any:
    """A ``LambdaLR`` over ``total`` steps: linear warm-up over the first 10%, then linear decay to 0."""
    import torch

    warm = max(1, int(0.1 * total))
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warm, max(0.0, (total - s) / max(1, total - warm))))


def mean_pool(hidden: Any, mask: Any) -> Any:
    """Masked mean of ``hidden`` (batch, tokens, dim) over tokens, L2-normalised: the
    pooling of :class:`~classifier.encoders.torch_runner.MeanPoolRunner`."""
    import torch

    m = mask.unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled.float(), p=2.0, dim=-1)


def _encode(model: Any, tokenizer: Any, texts: list[str], max_length: int, device: str,
            batch_size: int = 64) -> np.ndarray:
    """Unit-norm float32 vectors of ``texts`` (model in eval mode; batches of similar length)."""
    import torch

    dim = int(model.config.hidden_size)
    out = np.zeros((len(texts), dim), dtype=np.float32)
    order = np.argsort([len(t) for t in texts], kind="stable")
    with torch.inference_mode():
        for k in range(0, len(texts), batch_size):
            idx = order[k:k + batch_size]
            batch = tokenizer([texts[i] for i in idx], padding=True, truncation=True, max_length=max_length,
                              return_tensors="pt").to(device)
            hidden = model(**batch).last_hidden_state
            out[idx] = mean_pool(hidden, batch["attention_mask"]).cpu().numpy()
    return out


def _supcon(v: Any, y: Any, anchor: Any, weight: Any, temperature: float) -> Any:
    """Supervised contrastive loss over a batch of unit vectors ``v`` with classes ``y``:
    rows where ``anchor`` is true are anchors (their positives are the other rows of
    their class); every other row is in the denominator. Weighted mean over anchors
    that have a positive; ``None`` when none has."""
    import torch

    n = len(y)
    sim = (v @ v.T) / temperature
    eye = torch.eye(n, dtype=torch.bool, device=v.device)
    sim = sim.masked_fill(eye, float("-inf"))
    log_prob = sim - torch.logsumexp(sim, dim=1, keepdim=True)
    pos = (y[:, None] == y[None, :]) & ~eye & anchor[:, None] & anchor[None, :]
    n_pos = pos.sum(dim=1)
    use = n_pos > 0
    if not bool(use.any()):
        return None
    per_anchor = -(log_prob.masked_fill(~pos, 0.0).sum(dim=1)[use] / n_pos[use])
    w = weight[use]
    return (per_anchor * w).sum() / w.sum()


def tunable_base(settings: EmbedderSettings) -> Path:
    """The model directory an intent set's ``embedder`` settings
    (:class:`~classifier.settings.intents.EmbedderSettings`) can be tuned from, as the
    backend's spec says (:attr:`~classifier.encoders.backends.BackendSpec.tune_from`):
    MiniLM's, the converted multilingual-e5-small (from the machine cache, converted on first
    use; see :func:`tuning_recipe` for its prefix and frozen word embeddings), or the
    directory of a mean-pooling sentence-transformers model.

    Raises
    ------
    EmbedderError
        e5 without its package, or a failed conversion.
    TuningError
        A backend that cannot be fine-tuned in place (USE runs in numpy; bge-m3 pools CLS),
        or MiniLM with ``embedder.layers`` (tuning pools the last layer only).
    """
    spec = resolve_backend(settings.backend)   # auto: English, as make_embedder has it
    if spec.tune_from == MODEL_DIRECTORY and settings.model:
        path = Path(settings.model).expanduser()
        pooling = path / "1_Pooling" / "config.json"
        if (path / "config.json").is_file() and pooling.is_file():
            cfg = json.loads(pooling.read_text(encoding="utf-8"))
            mode = cfg.get("pooling_mode")
            if mode in ("mean", ["mean"]) or (mode is None and cfg.get("pooling_mode_mean_tokens") is True
                                               and not cfg.get("pooling_mode_cls_token")):
                return path
        raise TuningError(f"{path} is not a mean-pooling {spec.id} directory: it cannot be tuned here")
    if spec.tunable and spec.tune_from != MODEL_DIRECTORY:
        if spec.layers and settings.layers:
            raise TuningError("the tuned encoder mean-pools the last layer only: unset embedder.layers to tune it")
        return spec.tuning_base()
    tunable = [s.id if s.tune_from != MODEL_DIRECTORY else f"a {s.id} directory" for s in BACKENDS.values()
               if s.tunable]
    raise TuningError(f"embedder.backend {settings.backend!r} cannot be fine-tuned in place (tuning needs a BERT-like "
                      f"mean-pooling encoder: {', '.join(tunable[:-1])}, or {tunable[-1]}); "
                      "embedder.tune.objective: adapter trains an adapter on its frozen vectors instead")


def tuning_recipe(settings: EmbedderSettings) -> TuningRecipe:
    """What tuning :func:`tunable_base`'s model takes beyond its weights, from the backend's
    spec: e5's ``query: `` prefix (put before every text by the tuner and, recorded in the
    export, by serving), its frozen word embeddings (the 250k x 384 token table stays as
    converted, as in the e5 probe) and its licence notice; other backends: none of these."""
    return resolve_backend(settings.backend).recipe


class EncoderTuner:
    """Fine-tune a Hugging Face encoder on labelled texts (scikit-learn conventions:
    ``__init__`` stores the parameters, :meth:`fit` returns ``self`` and sets the fitted
    attributes; nothing changes them afterwards).

    Parameters
    ----------
    base_model : str or Path, optional
        A local Hugging Face model directory (BERT-like, ``AutoModel``); default MiniLM's
        (:func:`~classifier.encoders.torch_runner.minilm_model_dir`).
    objective : {"cross_entropy", "contrastive"}
        See the module docstring; ``cross_entropy`` won the probe.
    epochs : int
        Passes over the rows (hard-pair chunks come on top).
    batch_size : int
    learning_rate : float
        AdamW learning rate of the encoder (linear warm-up over the first 10% of the
        steps, then linear decay to 0).
    head_learning_rate : float
        Learning rate of the cosine classifier's weights (``cross_entropy``).
    max_length : int
        Tokens per text (64 is plenty for queries); saved as ``max_seq_length``.
    scale : float
        Cosine-softmax scale of ``cross_entropy`` (logits are ``scale * cos``).
    temperature : float
        Temperature of ``contrastive``.
    oos_class : bool
        ``cross_entropy`` only. ``True``: out of scope is a class of its own in the loss.
        ``False``: out-of-scope rows are pushed towards the uniform distribution over the
        intents (outlier exposure, Hendrycks et al. 2019): away from every intent, without
        being pulled together into one cluster.
    weight_decay : float
    budget_s : float or None
        Wall-clock budget of :meth:`fit` in seconds (``None``: none).
    hard_pairs : sequence of (str or None, str or None), optional
        Confusion pairs whose rows are oversampled together in batches.
    seed : int
    device : str, optional
        ``None``: ``cuda`` when torch sees a GPU, else ``cpu``.
    progress : callable(str), optional
        Called with lines such as ``"epoch 2/3, step 40/120, loss 0.83"``.
    num_threads : int, optional
        torch's intra-op threads while ``fit`` runs (restored afterwards; torch's setting is
        process-wide). ``None`` leaves it alone. One thread is far faster for tiny models and
        on a CPU other processes share (the threads' barriers spin).
    query_prefix : str
        Put before every text in ``fit`` and by :meth:`embedder` (e5's ``query: ``:
        :func:`tuning_recipe`); recorded in ``report_`` and the id. ``""``: none.
    freeze_word_embeddings : bool
        Keep the token-embedding matrix as loaded (no gradient, not in the optimiser).

    Attributes
    ----------
    model_ : transformers.PreTrainedModel
        The tuned encoder, in eval mode, on CPU.
    tokenizer_ : transformers tokenizer
    classes_ : list of str or None
        The classes of the loss, in index order (``None``, out of scope, last when present).
    encoder_id_ : str
        ``tuned:<12 hex digits>``, a hash of the tuned weights, the tokenizer's vocabulary
        and the pooling settings.
    stopped_early_ : bool
        The budget stopped the run before its last planned step.
    report_ : dict
        ``objective``, ``device``, ``epochs_done``, ``steps``, ``steps_planned``,
        ``seconds``, ``stopped_early``, ``n_rows``, ``n_labels``, ``loss_first``,
        ``loss_last`` (mean loss of the first and last 10 steps; ``None`` without a step),
        ``base_model``, ``hard_pairs_used``, ``hard_pairs_skipped``.

    Examples
    --------
    >>> tuner = EncoderTuner(epochs=2, budget_s=300)                    # doctest: +SKIP
    >>> tuner.fit(texts, labels)                                        # doctest: +SKIP
    >>> vectors = tuner.embedder().encode(["cancel my order"])          # doctest: +SKIP
    >>> tuner.save("encoder/")   # a directory MeanPoolRunner serves    # doctest: +SKIP
    """

    def __init__(self, base_model: str | Path | None = None, *, objective: str = "cross_entropy",
                 epochs: int = 4, batch_size: int = 32, learning_rate: float = 1e-4,
                 head_learning_rate: float = 2e-3, max_length: int = 64, scale: float = 20.0,
                 temperature: float = 0.1, oos_class: bool = True, weight_decay: float = 0.01,
                 budget_s: float | None = 600.0,
                 hard_pairs: Sequence[tuple[str | None, str | None]] | None = None, seed: int = 0,
                 device: str | None = None, progress: Callable[[str], None] | None = None,
                 num_threads: int | None = None, query_prefix: str = "",
                 freeze_word_embeddings: bool = False) -> None:
        self.base_model = base_model
        self.objective = objective
        self.epochs = epochs
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.head_learning_rate = head_learning_rate
        self.max_length = max_length
        self.scale = scale
        self.temperature = temperature
        self.oos_class = oos_class
        self.weight_decay = weight_decay
        self.budget_s = budget_s
        self.hard_pairs = hard_pairs
        self.seed = seed
        self.device = device
        self.progress = progress
        self.num_threads = num_threads
        self.query_prefix = query_prefix
        self.freeze_word_embeddings = freeze_word_embeddings

    # ---------------------------------------------------------------- checking
    def _check_params(self) -> None:
        if self.objective not in OBJECTIVES:
            raise TuningError(f"objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if int(self.epochs) < 1:
            raise TuningError(f"epochs must be at least 1, got {self.epochs}")
        if int(self.batch_size) < 2:
            raise TuningError(f"batch_size must be at least 2, got {self.batch_size}")
        if int(self.max_length) < 4:
            raise TuningError(f"max_length must be at least 4, got {self.max_length}")
        for name in ("learning_rate", "head_learning_rate", "scale", "temperature"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise TuningError(f"{name} must be a positive number, got {value!r}")
        if self.num_threads is not None and int(self.num_threads) < 1:
            raise TuningError(f"num_threads must be at least 1 or None, got {self.num_threads}")
        if self.budget_s is not None and not (math.isfinite(self.budget_s) and self.budget_s > 0):
            raise TuningError(f"budget_s must be a positive number of seconds or None, got {self.budget_s!r}")

    @staticmethod
    def _check_data(texts: Sequence[str], labels: Sequence[str | None],
                    sample_weight: Any) -> tuple[list[str], list[str | None], np.ndarray]:
        try:
            texts = check_texts(texts)
        except Exception as exc:  # noqa: BLE001 - InvalidInputError worded for encode()
            raise TuningError(f"texts must be a sequence of strings: {exc}") from None
        labels = [None if v is None else str(v) for v in labels]
        if not texts:
            raise TuningError("no texts to tune on")
        if len(texts) != len(labels):
            raise TuningError(f"{len(texts)} texts but {len(labels)} labels")
        distinct = set(labels)
        if not distinct - {None}:
            raise TuningError("no in-scope examples to tune on (every label is None)")
        if len(distinct) < 2:
            raise TuningError(f"need at least two classes to tune on (an intent and another intent or out-of-scope "
                              f"rows), got only {next(iter(distinct))!r}")
        if sample_weight is None:
            w = np.ones(len(texts))
        else:
            w = np.asarray(sample_weight, dtype=np.float64)
            if w.shape != (len(texts),) or not np.all(np.isfinite(w)) or (w <= 0).any():
                raise TuningError(f"sample_weight must be one positive finite number per text ({len(texts)})")
        return texts, labels, w

    def _say(self, line: str) -> None:
        if self.progress is not None:
            self.progress(line)

    # ---------------------------------------------------------------- fitting
    def fit(self, texts: Sequence[str], labels: Sequence[str | None],
            sample_weight: Sequence[float] | None = None) -> "EncoderTuner":
        """Tune the encoder on ``texts`` labelled ``labels`` (intent names; ``None``: out of scope).

        ``sample_weight`` (one positive number per text) weighs each row's loss.

        Raises
        ------
        TuningError
            Empty data, texts and labels of different lengths, a single class, bad weights
            or bad parameters.
        """
        t0 = time.perf_counter()
        self._check_params()
        texts, labels, w = self._check_data(texts, labels, sample_weight)
        texts = [self.query_prefix + t for t in texts] if self.query_prefix else texts
        hub_offline()
        import torch

        base = Path(self.base_model) if self.base_model is not None else minilm_model_dir()
        if not (base / "config.json").is_file():
            raise TuningError(f"{base} is not a Hugging Face model directory (no config.json)")
        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        intents = sorted({v for v in labels if v is not None})
        classes: list[str | None] = [*intents, *([None] if None in labels else [])]
        index = {c: i for i, c in enumerate(classes)}
        y = np.array([index[v] for v in labels])
        oos_index = index.get(None)
        pairs, skipped = [], []
        for pair in self.hard_pairs or ():
            a, b = pair
            if a in index and b in index and a != b:
                pairs.append((index[a], index[b]))
            else:
                skipped.append([a, b])

        rng = np.random.default_rng(self.seed)
        plan = [plan_batches(y, oos_index, int(self.batch_size), self.objective, pairs, rng)
                for _ in range(int(self.epochs))]
        if self.objective == "contrastive":  # a batch of one row has no pair
            plan = [[b for b in epoch if len(b) > 1] for epoch in plan]
        total = sum(len(epoch) for epoch in plan)

        with torch_session(device, int(self.seed), self.num_threads):
            tokenizer, model = load_trainable(base, device, self.freeze_word_embeddings)
            losses, stopped, epochs_done = self._train(model, tokenizer, texts, y, w, classes, oos_index,
                                                       plan, total, device, t0)
        model.eval().to("cpu")
        self.model_ = model
        self.tokenizer_ = tokenizer
        self.classes_ = classes
        self.stopped_early_ = stopped
        self.encoder_id_ = f"tuned:{self._content_hash()}"
        window = min(LOSS_WINDOW, len(losses))
        self.report_ = {
            "objective": self.objective, "device": device, "epochs_done": epochs_done,
            "epochs": int(self.epochs), "steps": len(losses), "steps_planned": total,
            "seconds": round(time.perf_counter() - t0, 2), "stopped_early": stopped,
            "budget_s": self.budget_s, "n_rows": len(texts), "n_labels": len(classes),
            "loss_first": round(float(np.mean(losses[:window])), 4) if losses else None,
            "loss_last": round(float(np.mean(losses[-window:])), 4) if losses else None,
            "base_model": str(base), "encoder_id": self.encoder_id_,
            "hard_pairs_used": len(pairs), "hard_pairs_skipped": skipped,
            "query_prefix": self.query_prefix, "word_embeddings_frozen": bool(self.freeze_word_embeddings),
        }
        if stopped:
            self._say(f"tuning stopped by its budget ({self.budget_s:g} s) after {len(losses)} of {total} steps")
        return self

    def _train(self, model: Any, tokenizer: Any, texts: list[str], y: np.ndarray, w: np.ndarray,
               classes: list[str | None], oos_index: int | None, plan: list[list[np.ndarray]], total: int,
               device: str, t0: float) -> tuple[list[float], bool, int]:
        """The optimisation loop; returns the per-step losses, whether the budget stopped
        it, and the epochs completed."""
        import torch

        F = torch.nn.functional
        y_t = torch.as_tensor(y, device=device)
        w_t = torch.as_tensor(w, dtype=torch.float32, device=device)
        decay: list[torch.nn.Parameter] = []
        no_decay: list[torch.nn.Parameter] = []
        for name, p in model.named_parameters():
            if not p.requires_grad:   # the frozen word embeddings
                continue
            (no_decay if p.ndim < 2 or "LayerNorm" in name or "norm" in name.lower() else decay).append(p)
        groups: list[dict[str, Any]] = [
            {"params": decay, "weight_decay": float(self.weight_decay), "lr": float(self.learning_rate)},
            {"params": no_decay, "weight_decay": 0.0, "lr": float(self.learning_rate)}]
        weights = None
        if self.objective == "cross_entropy":
            # the classifier starts at the frozen encoder's class centroids, centred (less the
            # mean of the centroids): raw centroids share a large common part, which makes the
            # gradient (the difference between class weights) vanish where classes start close
            # (from at most CENTROID_ROWS rows a class: at 100k logged rows, encoding every row
            # once took the whole budget before the first step, BENCHMARKS.md §14.11)
            model.eval()
            rows = centroid_rows(y, CENTROID_ROWS, np.random.default_rng(int(self.seed)))
            start = torch.as_tensor(_encode(model, tokenizer, [texts[i] for i in rows], int(self.max_length), device),
                                    device=device)
            y_s = y_t[torch.as_tensor(rows, device=device)]
            counts = torch.bincount(y_s, minlength=len(classes)).clamp(min=1).unsqueeze(1).float()
            cent = torch.zeros(len(classes), start.shape[1], device=device).index_add_(0, y_s, start) / counts
            if oos_index is not None and not self.oos_class:
                cent = cent[:oos_index]   # no out-of-scope class: its rows aim at the uniform distribution
            weights = torch.nn.Parameter(F.normalize(cent - cent.mean(dim=0, keepdim=True), dim=-1))
            groups.append({"params": [weights], "weight_decay": 0.0, "lr": float(self.head_learning_rate)})
        opt = torch.optim.AdamW(groups)
        sched = warmup_linear(opt, total)
        anchor_all = torch.as_tensor(y != (-1 if oos_index is None else oos_index), device=device)

        losses: list[float] = []
        step_s: list[float] = []
        stopped, epochs_done = False, 0
        for e, batches in enumerate(plan, start=1):
            model.train()
            every = max(1, len(batches) // PROGRESS_LINES)
            for s, idx in enumerate(batches, start=1):
                elapsed = time.perf_counter() - t0
                if self.budget_s is not None and elapsed + (np.mean(step_s) if step_s else 0.0) > self.budget_s:
                    stopped = True
                    break
                ts = time.perf_counter()
                batch = tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                  max_length=int(self.max_length), return_tensors="pt").to(device)
                v = mean_pool(model(**batch).last_hidden_state, batch["attention_mask"])
                it = torch.as_tensor(idx, device=device)
                if weights is not None:
                    logits = float(self.scale) * (v @ F.normalize(weights, dim=-1).T)
                    if len(weights) == len(classes):
                        per_row = F.cross_entropy(logits, y_t[it], reduction="none")
                    else:  # out-of-scope rows: cross-entropy against the uniform distribution
                        assert oos_index is not None, "fewer class weights than classes: no out-of-scope class"
                        yb = y_t[it]
                        is_oos = yb == oos_index
                        logp = F.log_softmax(logits, dim=-1)
                        per_row = torch.where(is_oos, -logp.mean(dim=-1),
                                              -logp.gather(1, yb.clamp(max=len(weights) - 1)[:, None])[:, 0])
                    loss = (per_row * w_t[it]).sum() / w_t[it].sum()
                else:
                    loss = _supcon(v, y_t[it], anchor_all[it], w_t[it], float(self.temperature))
                opt.zero_grad(set_to_none=True)
                if loss is not None:
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_([p for g in groups for p in g["params"]], 1.0)
                    opt.step()
                    losses.append(float(loss.detach()))
                sched.step()
                step_s.append(time.perf_counter() - ts)
                if (s % every == 0 or s == len(batches)) and losses:
                    self._say(f"epoch {e}/{len(plan)}, step {s}/{len(batches)}, loss {losses[-1]:.2f}")
            if stopped:
                break
            epochs_done = e
        return losses, stopped, epochs_done

    # ------------------------------------------------------------- after fitting
    def _check_fitted(self) -> None:
        if not hasattr(self, "model_"):
            from flywheel.classifier.errors import NotFittedError

            raise NotFittedError("EncoderTuner is not fitted; call fit() first")

    def _content_hash(self) -> str:
        h = hashlib.sha256()
        recipe: dict[str, Any] = {"pooling": "mean", "normalize": True, "max_length": int(self.max_length)}
        if self.query_prefix:
            recipe["query_prefix"] = self.query_prefix
        h.update(json.dumps(recipe, sort_keys=True).encode())
        for name, tensor in sorted(self.model_.state_dict().items()):
            h.update(name.encode())
            h.update(tensor.detach().cpu().float().contiguous().numpy().tobytes())
        vocab = self.tokenizer_.get_vocab()
        h.update(json.dumps(sorted(vocab.items()), ensure_ascii=False).encode())
        return h.hexdigest()[:12]

    def embedder(self) -> "TunedEmbedder":
        """An in-process :class:`~classifier.protocols.Embedder` over the tuned model (CPU,
        fp32, the pooling MeanPoolRunner uses): the offline side can encode with the tuned
        encoder before it is exported."""
        self._check_fitted()
        return TunedEmbedder(self.model_, self.tokenizer_, int(self.max_length), self.encoder_id_,
                             query_prefix=self.query_prefix)

    def save(self, directory: str | Path) -> Path:
        """Write the tuned encoder as a Hugging Face model directory: ``config.json``,
        ``model.safetensors``, the tokenizer files (``tokenizer.json`` among them),
        ``sentence_bert_config.json`` (``max_seq_length``), the sentence-transformers
        ``modules.json`` + ``1_Pooling`` (mean pooling, so sentence-transformers loads the same
        stack) and ``tuning.json`` (``report_`` and ``classes_``). Returns the directory."""
        self._check_fitted()
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        self.model_.save_pretrained(str(out), safe_serialization=True)
        self.tokenizer_.save_pretrained(str(out))
        if not (out / "tokenizer.json").is_file():  # a slow tokenizer: write the fast one's file
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(str(out), use_fast=True, local_files_only=True).save_pretrained(str(out))
        dim = int(self.model_.config.hidden_size)
        files = {
            "sentence_bert_config.json": {"max_seq_length": int(self.max_length), "do_lower_case": False},
            "modules.json": [
                {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}],
            "1_Pooling/config.json": {"word_embedding_dimension": dim, "pooling_mode_cls_token": False,
                                      "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
                                      "pooling_mode_mean_sqrt_len_tokens": False},
            "tuning.json": {"report": self.report_, "classes": self.classes_},
        }
        for name, doc in files.items():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        return out


class TunedEmbedder:
    """An :class:`~classifier.protocols.Embedder` over a tuned model held in memory (from
    :meth:`EncoderTuner.embedder`): ``encode`` gives float32 unit-norm rows, masked mean
    pooling, on CPU."""

    def __init__(self, model: Any, tokenizer: Any, max_length: int, encoder_id: str,
                 batch_size: int = 64, *, query_prefix: str = "") -> None:
        self.model = model
        self.query_prefix = query_prefix
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.batch_size = batch_size
        self._id = encoder_id
        self._lock = threading.Lock()  # fast tokenizers are not re-entrant

    @property
    def id(self) -> str:
        return self._id

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    def encode(self, texts: Sequence[str], *, batch_size: int | None = None,
               progress: bool = False) -> np.ndarray:
        items = check_texts(texts)
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self.query_prefix:
            items = [self.query_prefix + t for t in items]
        with self._lock:
            out = _encode(self.model, self.tokenizer, items, self.max_length, "cpu", batch_size or self.batch_size)
        return np.ascontiguousarray(out, dtype=np.float32)

    def __repr__(self) -> str:
        return f"TunedEmbedder({self._id!r}, dim={self.dim})"
