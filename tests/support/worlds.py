"""Synthetic worlds the tests build on.

- :func:`blobs`: labelled Gaussian blobs of vectors (plus out-of-scope noise), for the head;
  :func:`blob_split` the same as texts a :class:`VectorTextEmbedder` reads (train and held out).
- The synthetic traffic world of the retrain tests: :data:`INTENT_DOC` (RETRIEVAL and
  PLATFORM questions built from templates, out-of-scope ones too), :data:`QUERIES` (every
  templated query that is not an example, with its true label) and :func:`sample` of them;
  :func:`record` (an LLM decision the teacher answered), :func:`write` (records through the
  real LogStore sink), :func:`human_labels`; :class:`World` (a log, a models home, the
  intent set and a :class:`CountingEmbedder`) with ``run()`` (one retrain) and
  ``seed_traffic()``.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import time
from pathlib import Path

import numpy as np

from flywheel.classifier.decision import Candidate, Decision, Layer, TeacherCall, Tier
from flywheel.classifier.protocols import DecisionRecord
from flywheel.classifier.settings.intents import parse_intents
from flywheel.classifier.text import normalise_key
from flywheel.classifier.versions.registry import ModelRegistry
from flywheel.logstore import LabelRecord, LogStore, label_records_to_table
from flywheel.training.retrain import RetrainOptions, retrain
from tests.support.fakes import HashEmbedder


def blobs(n_per=40, k=4, dim=32, noise=0.35, seed=0, with_oos=True):
    """``(X, y, centres)``: ``n_per`` points around each of ``k`` random centres (labels
    ``L0``..), plus ``n_per`` wider out-of-scope points (label ``None``) unless ``with_oos``
    is false."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((k, dim))
    X = np.vstack([c + noise * rng.standard_normal((n_per, dim)) for c in centres])
    y = [f"L{i}" for i in range(k) for _ in range(n_per)]
    if with_oos:
        oos = rng.standard_normal((n_per, dim)) * 1.5
        X = np.vstack([X, oos])
        y += [None] * n_per
    return X, y, centres


def blob_split(n_train=100, n_test=300, k=5, dim=16, noise=0.9, seed=1):
    """:func:`blobs` as texts (:func:`blob_text`), split into ``(train_texts, train_labels,
    test_texts, test_labels)``: the first ``n_train`` of each intent and of the out-of-scope
    points to train, the next ``n_test`` held out (the same centres)."""
    X, y, _ = blobs(n_per=n_train + n_test, k=k, dim=dim, noise=noise, seed=seed)
    n = n_train + n_test
    train = [i for g in range(k + 1) for i in range(g * n, g * n + n_train)]
    test = [i for g in range(k + 1) for i in range(g * n + n_train, (g + 1) * n)]
    return ([blob_text(X[i]) for i in train], [y[i] for i in train],
            [blob_text(X[i]) for i in test], [y[i] for i in test])


def blob_text(vector) -> str:
    """A vector spelt as a text that :class:`VectorTextEmbedder` reads back: ``"v 0.1234 -1.5 ..."``."""
    return "v " + " ".join(f"{x:.5f}" for x in vector)


class VectorTextEmbedder:
    """The blob world as an encoder: a :func:`blob_text` text's vector, normalised (no model);
    any other text (a synthetic negative) a random one its hash seeds, noise like out of scope."""

    def __init__(self, dim: int = 16) -> None:
        self._dim = dim

    @property
    def id(self) -> str:
        return f"fake:vector-text-{self._dim}"

    @property
    def dim(self) -> int:
        return self._dim

    def encode(self, texts, *, batch_size=None, progress=False) -> np.ndarray:
        out = np.array([[float(x) for x in t.split()[1:]] if t.startswith("v ") else np.random.default_rng(
            int(hashlib.md5(t.encode()).hexdigest()[:8], 16)).standard_normal(self._dim) for t in texts],
            dtype=np.float32).reshape(-1, self._dim)
        return out / np.clip(np.linalg.norm(out, axis=1, keepdims=True), 1e-12, None)


# ----------------------------------------------------------------- the synthetic traffic world
FUNCS = ["addvar", "addparam", "addresult", "getlist", "itemfromlist", "variablefromjson", "ormaccess",
         "requestpost", "requestget", "randomstring", "encodesha256", "gettimestamp", "replace", "substring"]
DOC_TEMPLATES = ["what does {} do", "how do i call {}", "explain the {} function", "documentation for {}",
                 "what parameters does {} take", "example of {} in avap", "what does {} return",
                 "is {} deprecated"]
THINGS = ["invoice", "subscription", "plan", "payment method", "billing address", "receipt", "account",
          "api key", "team seats", "credit card", "refund", "tax id", "billing cycle", "discount"]
ACC_TEMPLATES = ["show my {}", "where can i find my {}", "update my {}", "cancel my {}",
                 "problem with my {}", "download the {} pdf", "change the {} details", "how much is my {}"]
OOS_FILLS = ["paris", "tokyo", "lima", "oslo", "cairo", "rome", "pasta", "sushi", "tacos", "football",
             "tennis", "chess", "french", "german"]
OOS_TEMPLATES = ["weather in {} tomorrow", "best recipe with {}", "who won the {} match",
                 "tell me a joke about {}", "translate hello into {}", "flights to {} next week"]
PREFIXES = ["", "hi ", "hey ", "quick question "]
SUFFIXES = ["", " please", " thanks", " asap"]

INTENT_DOC = {
    "name": "synthetic",
    "intents": [
        {"name": "RETRIEVAL", "description": "questions about the AVAP docs", "examples": [
            t.format(f) for t, f in zip(DOC_TEMPLATES * 2, FUNCS)]},
        {"name": "PLATFORM", "description": "account and billing", "examples": [
            t.format(f) for t, f in zip(ACC_TEMPLATES * 2, THINGS)]},
    ],
    # synthetic: 0 -- the hash encoder puts nonsense and unseen words alike (see tests/support/docs.py)
    "out_of_scope": {"examples": [t.format(f) for t, f in zip(OOS_TEMPLATES * 2, OOS_FILLS[::-1])], "synthetic": 0},
}
ENC = HashEmbedder()  # for the vectors written into the log (not counted)


class CountingEmbedder(HashEmbedder):
    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    def encode(self, texts, *, batch_size=None, progress=False):
        self.texts.extend(texts)
        return super().encode(texts, batch_size=batch_size, progress=progress)


def all_queries() -> list[tuple[str, str | None]]:
    out = []
    for label, temps, fills in (("RETRIEVAL", DOC_TEMPLATES, FUNCS), ("PLATFORM", ACC_TEMPLATES, THINGS),
                                (None, OOS_TEMPLATES, OOS_FILLS)):
        for p, t, f, s in itertools.product(PREFIXES, temps, fills, SUFFIXES):
            out.append((p + t.format(f) + s, label))
    examples = {normalise_key(t) for i in INTENT_DOC["intents"] for t in i["examples"]}
    examples |= {normalise_key(t) for t in INTENT_DOC["out_of_scope"]["examples"]}
    return [(t, y) for t, y in out if normalise_key(t) not in examples]


QUERIES = all_queries()


def sample(n: int, seed: int, exclude: set[str] = frozenset()) -> list[tuple[str, str | None]]:
    pool = [q for q in QUERIES if q[0] not in exclude]
    return random.Random(seed).sample(pool, n)


CLOCK = itertools.count()   # keeps the created_at of hand-built records distinct and increasing


def record(text: str, *, teacher: str | None = "__true__", true: str | None = None, valid: bool = True,
           embed: bool = False, created_at: float | None = None) -> DecisionRecord:
    """An LLM decision whose teacher answered ``teacher`` (default: the true label)."""
    label = true if teacher == "__true__" else teacher
    call = TeacherCall("fake-llm", label, valid, 15.0, None if valid else "malformed answer")
    d = Decision(label=label, confidence=0.9, tier=Tier.CONFIDENT, layer=Layer.LLM,
                 reason="test", alternatives=[Candidate("RETRIEVAL", 0.4), Candidate("PLATFORM", 0.35)],
                 model_version="v0", latency_ms={"embedding": 1.0}, teacher=call)
    vec = ENC.encode([text])[0] if embed else None
    ts = created_at if created_at is not None else time.time() - 3600 + next(CLOCK) * 1e-3
    return DecisionRecord(decision=d, text=text, created_at=ts, encoder_id=ENC.id if embed else None,
                          embedding=vec)


def write(store: LogStore, records) -> list[str]:
    sink = store.open_sink(ingest_interval_s=None, fsync=False)
    for r in records:
        sink.write(r)
    sink.flush()
    sink.close()
    return [r.decision.id for r in records]


def human_labels(store: LogStore, pairs) -> None:
    """Bulk version of ``add_human_label``: one transaction through the store's public bulk
    insert instead of one open per label."""
    records = [LabelRecord.human(did, lab, author="tester") for did, lab in pairs]
    if records:
        store.insert_objects([(f"test-labels-{records[0].label_uid}", "labels", label_records_to_table(records))])


class World:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.store = LogStore(tmp_path / "log" / "traffic.duckdb")
        self.registry = ModelRegistry(tmp_path / "models")
        self.intents = parse_intents(INTENT_DOC, source="synthetic.yaml")
        self.embedder = CountingEmbedder()

    def run(self, **kw):
        return retrain(store=self.store, registry=self.registry, intents=self.intents,
                       embedder=self.embedder, options=RetrainOptions(**kw))

    def seed_traffic(self, n_teacher: int = 600, n_human: int = 40, seed: int = 0):
        """Teacher-labelled traffic (every third row with its logged embedding) and a few
        correct human labels. Returns (records, human ids)."""
        items = sample(n_teacher + n_human, seed)
        recs = [record(t, true=y, embed=(i % 3 == 0)) for i, (t, y) in enumerate(items)]
        write(self.store, recs)
        human = [(r.decision.id, y) for r, (_, y) in zip(recs[n_teacher:], items[n_teacher:])]
        human_labels(self.store, human)
        return recs, items
