"""Intent documents and texts the tests share.

- :data:`DOC`: a tiny intent document (two intents, one rule, a few out-of-scope
  examples), the one most tests fit on a :class:`~tests.support.fakes.HashEmbedder`.
- :data:`ALWAYS_SURE` / :data:`ALWAYS_UNSURE`: thresholds under which layer 2 always
  decides / always asks the teacher.
- :data:`TOPICS`, :data:`OOS_WORDS`, :func:`topic_examples`: a toy intent set of three
  topics whose examples share no words with one another or with the out-of-scope ones.
- :func:`nonsense`: tests/data/nonsense.txt plus long, random-byte and random-code-point
  inputs (also read by benchmarks/nonsense_sweep.py).
"""

from __future__ import annotations

import codecs
import random

from tests.support.paths import DATA

DOC = {
    "name": "tiny",
    "rules": [{"id": "quota-rule", "intent": "PLATFORM", "contains": "quota"}],
    "intents": [
        {"name": "RETRIEVAL", "description": "docs", "examples": [
            "what is addvar", "explain addparam", "what does addresult return", "how do loops work",
            "what types exist", "documentation for requests"]},
        {"name": "PLATFORM", "description": "account", "examples": [
            "show my invoices", "what plan am i on", "cancel subscription", "my billing history",
            "upgrade my plan", "payment method"]},
    ],
    # synthetic: 0 -- the tests' hash encoder puts nonsense and unseen words alike; synthetic
    # negatives are tested with the real encoders (tests/classifier/layer2/test_nonsense.py)
    "out_of_scope": {"examples": ["weather tomorrow", "cook pasta", "football score", "capital of france"],
                     "synthetic": 0},
}

ALWAYS_UNSURE = {"confident": 1.0, "ambiguous_ratio": 0.0, "oos": 1.0}   # layer 2 always asks the teacher
ALWAYS_SURE = {"confident": 0.0, "ambiguous_ratio": 1.0, "oos": 1.0}     # layer 2 always decides

TOPICS = {
    "weather": ["weather", "rain", "forecast", "sunny", "temperature", "umbrella"],
    "music": ["song", "play", "album", "playlist", "guitar", "singer"],
    "banking": ["balance", "account", "transfer", "bank", "deposit", "money"],
}
OOS_WORDS = ["zebra", "volcano", "pyramid", "galaxy", "origami", "chess"]


def topic_examples(words: list[str], n: int = 12) -> list[str]:
    """``n`` three-word examples made of ``words``."""
    return [f"{words[i % len(words)]} {words[(i + 1) % len(words)]} {words[(i + 3) % len(words)]}"
            for i in range(n)]


def toy_embedder():
    """The bag-of-words HashEmbedder (64 buckets) :data:`TOPICS` are separated by."""
    from tests.support.fakes import HashEmbedder

    return HashEmbedder(64, "test:hash-64", bag_of_words=True)


def write_jsonl(path, rows: list[dict]):
    """``rows`` as a JSON-lines file at ``path`` (returned)."""
    import json

    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def toy_train_file(path):
    """A training file of :data:`TOPICS` (12 examples each) and out-of-scope rows, at ``path``."""
    rows = [{"text": t, "label": name} for name, words in TOPICS.items() for t in topic_examples(words)]
    rows += [{"text": t, "label": "oos"} for t in topic_examples(OOS_WORDS)]
    return write_jsonl(path, rows)


NONSENSE_LIST = DATA / "nonsense.txt"


def nonsense() -> list[str]:
    """The hand-written lines of tests/data/nonsense.txt (``\\u`` escapes decoded), then a
    2,000,000-character line, 400 random bytes, 300 random code points and a line of 20
    random numbers."""
    lines = [ln for ln in NONSENSE_LIST.read_text(encoding="utf-8").splitlines()
             if ln.strip() and not ln.startswith("#")]
    texts = [codecs.decode(ln, "unicode_escape") if "\\u" in ln else ln for ln in lines]
    rng = random.Random(2026)
    texts += [
        "a" * 2_000_000,
        bytes(rng.randrange(256) for _ in range(400)).decode("latin-1"),
        "".join(chr(rng.randrange(0x20, 0xD7FF)) for _ in range(300)),
        " ".join(str(rng.randrange(10 ** 6)) for _ in range(20)),
    ]
    return texts
