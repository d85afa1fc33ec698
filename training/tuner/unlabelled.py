"""The self-supervised stage on unlabelled texts (issue 35): :class:`ContrastivePretrainer`.

Before the supervised tuning (:class:`training.tuner.finetune.EncoderTuner`) the encoder
can learn from queries nobody labelled: the logged traffic in a retrain, a file of texts
in ``flywheel eval --unlabelled FILE``. The objective is unsupervised SimCSE (Gao et al.
2021): each text is encoded twice with dropout on, and the two views of a text must be
each other's nearest neighbour among the batch's texts (an in-batch InfoNCE loss at
``temperature``). With ``word_deletion`` (the retrain's and eval's stage:
:data:`STAGE_WORD_DELETION`) the second view also loses some of its words, since a
sentence encoder already matches two dropout views of a text almost perfectly.
CPFT (Zhang et al. 2021) adds a masked-language objective to the same contrastive
pre-training; that needs a language-model head MiniLM's and e5's sentence checkpoints do
not ship, so it is not offered here.

- **Bounded**: at most ``max_rows`` texts (:func:`stage_pool`: distinct, non-empty, a seeded
  draw) and ``budget_s`` seconds, checked before each step as the tuner checks its own.
- **Pooling and prefix** as the tuner's (masked mean, L2-normalised; e5's ``query: ``), so
  the stage trains the vectors the tuner and serving use; frozen word embeddings stay frozen.
- **Gated, never assumed**: the stage only changes where the supervised tuning starts; the
  challenger it leads to goes to the retrain's gate like any other.

torch and transformers are imported inside the functions that need them.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from flywheel.classifier.encoders.torch_runner import hub_offline, minilm_model_dir
from flywheel.training.tuner.finetune import (
    LOSS_WINDOW,
    PROGRESS_LINES,
    TuningError,
    load_trainable,
    mean_pool,
    torch_session,
    warmup_linear,
)

__all__ = ["MIN_STAGE_ROWS", "STAGE_WORD_DELETION", "ContrastivePretrainer", "delete_words", "distinct_texts",
           "stage_pool"]

MIN_STAGE_ROWS = 16   # fewer distinct texts than this teach the stage nothing: it is skipped
#: the retrain's and eval's stage: the second view loses this share of its words (BENCHMARKS.md §20)
STAGE_WORD_DELETION = 0.15


def distinct_texts(texts: Iterable[str | None]) -> list[str]:
    """The distinct non-blank ``texts`` in their first order (retention-erased rows are ``''``)."""
    return list(dict.fromkeys(t for t in texts if isinstance(t, str) and t.strip()))


def stage_pool(texts: Iterable[str | None], max_rows: int, seed: int = 0) -> list[str]:
    """The stage's texts: the distinct non-blank ``texts`` (retention-erased rows are ``''``
    and never used), at most ``max_rows`` of them drawn with ``seed``, in their first order."""
    if int(max_rows) < 1:
        raise TuningError(f"the unlabelled stage's row limit must be at least 1, got {max_rows!r}")
    distinct = distinct_texts(texts)
    if len(distinct) <= max_rows:
        return distinct
    keep = np.sort(np.random.default_rng(seed).choice(len(distinct), size=int(max_rows), replace=False))
    return [distinct[i] for i in keep]


def delete_words(text: str, p: float, rng: np.random.Generator, keep: str = "") -> str:
    """``text`` with each word dropped with probability ``p`` (at least one word kept), the
    prefix ``keep`` (e5's ``query: ``) untouched: the second view of the stage with
    ``word_deletion``, harder to match than dropout noise alone."""
    body = text[len(keep):] if keep and text.startswith(keep) else text
    words = body.split()
    if len(words) < 2:
        return text
    kept = [w for w in words if rng.random() >= p] or [words[int(rng.integers(len(words)))]]
    return (keep if keep and text.startswith(keep) else "") + " ".join(kept)


class ContrastivePretrainer:
    """Unsupervised SimCSE on unlabelled texts (scikit-learn conventions: ``__init__``
    stores the parameters; :meth:`fit` returns ``self`` and sets ``model_``,
    ``tokenizer_`` and ``report_``; nothing changes them afterwards).

    Parameters
    ----------
    base_model : str or Path, optional
        A local Hugging Face model directory; default MiniLM's.
    epochs : int
        Passes over the texts (the budget may stop it sooner).
    batch_size : int
        Texts a batch; each is the others' negative.
    learning_rate : float
        AdamW learning rate (linear warm-up over 10% of the steps, then linear decay).
    temperature : float
        InfoNCE temperature (SimCSE's 0.05).
    word_deletion : float
        Probability of dropping each word from the second view (:func:`delete_words`); 0:
        both views differ by dropout only (plain SimCSE). A sentence encoder such as MiniLM
        already matches two dropout views almost perfectly (loss near 0 from the first
        step: BENCHMARKS.md §20), so plain SimCSE gives it little to learn.
    max_length : int
    budget_s : float or None
        Wall-clock seconds for :meth:`fit`, loading included; checked before each step.
    seed : int
    device : str, optional
    progress : callable(str), optional
    num_threads : int, optional
        torch's intra-op threads while ``fit`` runs (restored afterwards).
    query_prefix : str
        Put before every text (e5's ``query: ``).
    freeze_word_embeddings : bool
        Keep the token-embedding matrix as loaded.

    Attributes
    ----------
    model_, tokenizer_
        The encoder after the stage (CPU, eval mode) and its tokenizer.
    report_ : dict
        ``objective`` (``simcse``), ``rows``, ``steps``, ``steps_planned``, ``seconds``,
        ``stopped_early``, ``budget_s``, ``loss_first``, ``loss_last``, ``base_model``.
    """

    def __init__(self, base_model: str | Path | None = None, *, epochs: int = 1, batch_size: int = 64,
                 learning_rate: float = 3e-5, temperature: float = 0.05, word_deletion: float = 0.0,
                 max_length: int = 64,
                 budget_s: float | None = 300.0, seed: int = 0, device: str | None = None,
                 progress: Callable[[str], None] | None = None, num_threads: int | None = None,
                 query_prefix: str = "", freeze_word_embeddings: bool = False) -> None:
        self.base_model = base_model
        self.epochs = epochs
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.temperature = temperature
        self.word_deletion = word_deletion
        self.max_length = max_length
        self.budget_s = budget_s
        self.seed = seed
        self.device = device
        self.progress = progress
        self.num_threads = num_threads
        self.query_prefix = query_prefix
        self.freeze_word_embeddings = freeze_word_embeddings

    def _check(self, texts: list[str]) -> None:
        if int(self.epochs) < 1:
            raise TuningError(f"epochs must be at least 1, got {self.epochs}")
        if int(self.batch_size) < 2:
            raise TuningError(f"batch_size must be at least 2 (a text's negatives are the batch's others), "
                              f"got {self.batch_size}")
        if not (isinstance(self.word_deletion, (int, float)) and 0.0 <= self.word_deletion < 1.0):
            raise TuningError(f"word_deletion must be in [0, 1), got {self.word_deletion!r}")
        for name in ("learning_rate", "temperature"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise TuningError(f"{name} must be a positive number, got {value!r}")
        if self.budget_s is not None and not (math.isfinite(self.budget_s) and self.budget_s > 0):
            raise TuningError(f"budget_s must be a positive number of seconds or None, got {self.budget_s!r}")
        if len(texts) < MIN_STAGE_ROWS:
            raise TuningError(f"the unlabelled stage needs at least {MIN_STAGE_ROWS} distinct texts, "
                              f"got {len(texts)}")

    def _say(self, line: str) -> None:
        if self.progress is not None:
            self.progress(line)

    def fit(self, texts: Iterable[str]) -> "ContrastivePretrainer":
        """Train on ``texts`` (distinct, non-blank; see :func:`stage_pool`).

        Raises
        ------
        TuningError
            Fewer than :data:`MIN_STAGE_ROWS` texts, bad parameters, or a base that is not a
            Hugging Face model directory.
        """
        t0 = time.perf_counter()
        items = distinct_texts(texts)
        self._check(items)
        if self.query_prefix:
            items = [self.query_prefix + t for t in items]
        hub_offline()
        import torch

        base = Path(self.base_model) if self.base_model is not None else minilm_model_dir()
        if not (base / "config.json").is_file():
            raise TuningError(f"{base} is not a Hugging Face model directory (no config.json)")
        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        rng = np.random.default_rng(int(self.seed))
        size = int(self.batch_size)
        plan = [[order[k:k + size] for k in range(0, len(order), size) if len(order[k:k + size]) > 1]
                for order in (rng.permutation(len(items)) for _ in range(int(self.epochs)))]
        total = sum(len(epoch) for epoch in plan)
        with torch_session(device, int(self.seed), self.num_threads):
            tokenizer, model = load_trainable(base, device, self.freeze_word_embeddings)
            losses, stopped = self._train(model, tokenizer, items, plan, total, device, t0)
        self.model_ = model.eval().to("cpu")
        self.tokenizer_ = tokenizer
        window = min(LOSS_WINDOW, len(losses))
        self.report_ = {
            "objective": "simcse", "rows": len(items), "steps": len(losses), "steps_planned": total,
            "seconds": round(time.perf_counter() - t0, 2), "stopped_early": stopped, "budget_s": self.budget_s,
            "loss_first": round(float(np.mean(losses[:window])), 4) if losses else None,
            "loss_last": round(float(np.mean(losses[-window:])), 4) if losses else None,
            "base_model": str(base), "temperature": float(self.temperature),
            "word_deletion": float(self.word_deletion),
            "learning_rate": float(self.learning_rate)}
        if stopped:
            self._say(f"unlabelled stage stopped by its budget ({self.budget_s:g} s) after {len(losses)} of "
                      f"{total} steps")
        return self

    def _train(self, model: Any, tokenizer: Any, texts: list[str], plan: list[list[np.ndarray]], total: int,
               device: str, t0: float) -> tuple[list[float], bool]:
        """SimCSE's loop: per batch, two dropout views of every text; each view's positive is
        the other view of its own text, the batch's other texts are its negatives."""
        import torch

        F = torch.nn.functional
        rng = np.random.default_rng(int(self.seed) + 1)   # the deleted words' draw
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=float(self.learning_rate), weight_decay=0.0)
        sched = warmup_linear(opt, total)
        losses: list[float] = []
        step_s: list[float] = []
        model.train()   # dropout on: it makes the two views
        for e, batches in enumerate(plan, start=1):
            every = max(1, len(batches) // PROGRESS_LINES)
            for s, idx in enumerate(batches, start=1):
                if self.budget_s is not None and \
                        time.perf_counter() - t0 + (float(np.mean(step_s)) if step_s else 0.0) > self.budget_s:
                    return losses, True
                ts = time.perf_counter()
                batch = tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                  max_length=int(self.max_length), return_tensors="pt").to(device)
                a = mean_pool(model(**batch).last_hidden_state, batch["attention_mask"])
                if self.word_deletion > 0:   # a harder second view: some of its words gone
                    batch = tokenizer([delete_words(texts[i], float(self.word_deletion), rng, keep=self.query_prefix)
                                       for i in idx], padding=True, truncation=True,
                                      max_length=int(self.max_length), return_tensors="pt").to(device)
                b = mean_pool(model(**batch).last_hidden_state, batch["attention_mask"])
                logits = (a @ b.T) / float(self.temperature)
                target = torch.arange(len(idx), device=device)
                loss = (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
                sched.step()
                losses.append(float(loss.detach()))
                step_s.append(time.perf_counter() - ts)
                if s % every == 0 or s == len(batches):
                    self._say(f"unlabelled stage, epoch {e}/{len(plan)}, step {s}/{len(batches)}, "
                              f"loss {losses[-1]:.2f}")
        return losses, False

    def save(self, directory: str | Path) -> Path:
        """Write the encoder after the stage as a Hugging Face model directory (weights,
        config, tokenizer): the base the supervised tuner starts from. Returns it."""
        if not hasattr(self, "model_"):
            from flywheel.classifier.errors import NotFittedError

            raise NotFittedError("ContrastivePretrainer is not fitted; call fit() first")
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        self.model_.save_pretrained(str(out), safe_serialization=True)
        self.tokenizer_.save_pretrained(str(out))
        return out
