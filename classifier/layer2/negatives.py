"""Synthetic negatives: generated nonsense that trains layer 2's out-of-scope class.

A sentence encoder maps any string somewhere, and text that is no language at all
(keyboard mashing, a character repeated, random bytes, a bare URL or number) can land
near a short conversational example and be classified with high confidence. No intent
set lists such strings as out-of-scope examples, so the trainer adds them, generated:

- **keyboard mashing**: runs of letters from one or two keyboard rows ("sdfkjh lkjwer");
- **repeated characters**: one character, or a short non-word unit, many times;
- **random characters**: code points drawn from Latin, Greek, Cyrillic, CJK, symbols
  and control-free byte values;
- **bare URLs** and **bare numbers** (integers, decimals, phone- and id-like runs);
- **punctuation and symbol runs**.

They are *fit-only* rows, each weighing :data:`WEIGHT` (see
:meth:`classifier.layer2.head.IntentHead.fit`): they shape the
logistic regression's out-of-scope class but never the temperature, the gate or the
cutoffs, which stay fitted to real examples; so real queries' confidences and the
learned cutoffs are as before (BENCHMARKS.md, section 9, measures it). The generator is
seeded: the same texts in every fit. The test list of nonsense
(``tests/data/nonsense.txt``) is written by hand, not drawn from here.
"""

from __future__ import annotations

import random
import string

__all__ = ["FAMILIES", "DEFAULT_COUNT", "WEIGHT", "synthetic_negatives"]

#: Generated texts per fit (spread evenly over the families); ``out_of_scope.synthetic``
#: in an intent file overrides it, 0 turns them off.
DEFAULT_COUNT = 120
#: Sample weight of each generated row in the logistic regression (real rows weigh 1).
#: Chosen on the starter intents (BENCHMARKS.md, section 9): at 0.15 every listed
#: nonsense input but one is no_match and the held-out accuracies do not drop; at 0.2 and
#: above, short real turns ("hola", "y esto?") start to fall out of scope.
WEIGHT = 0.15

_ROWS = ("qwertyuiop", "asdfghjkl", "zxcvbnm", "1234567890")
_RANGES = ((0x21, 0x7E), (0xA1, 0xFF), (0x370, 0x3FF), (0x400, 0x4FF), (0x2000, 0x206F), (0x2190, 0x23FF),
           (0x2500, 0x25FF), (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xE000, 0xE0FF))
_TLDS = ("com", "net", "org", "io", "es", "dev", "co.uk", "info")


def _mash(rng: random.Random) -> str:
    words = []
    for _ in range(rng.randint(1, 4)):
        keys = "".join(rng.sample(_ROWS[:3], rng.randint(1, 2)))
        words.append("".join(rng.choice(keys) for _ in range(rng.randint(3, 12))))
    text = " ".join(words)
    return text.upper() if rng.random() < 0.2 else text


def _repeated(rng: random.Random) -> str:
    pool = string.ascii_letters + string.digits + ".-_!?*#=+~"
    unit = rng.choice(pool) if rng.random() < 0.6 else "".join(rng.sample("bcdfgklmnpqrstvwxzy", rng.randint(2, 3)))
    n = rng.choice((rng.randint(4, 30), rng.randint(30, 400)))
    sep = rng.choice(("", "", "", " "))
    return sep.join([unit] * max(2, n // len(unit)))


def _random_chars(rng: random.Random) -> str:
    lo, hi = rng.choice(_RANGES)
    mixed = rng.random() < 0.5
    out = []
    for _ in range(rng.randint(6, 120)):
        if mixed:
            lo, hi = rng.choice(_RANGES)
        out.append(chr(rng.randint(lo, hi)))
        if rng.random() < 0.1:
            out.append(" ")
    return "".join(out).strip() or "\u2591"


def _url(rng: random.Random) -> str:
    def token(k: int) -> str:
        return "".join(rng.choice(string.ascii_lowercase + string.digits) for _ in range(k))

    host = ".".join(token(rng.randint(3, 10)) for _ in range(rng.randint(1, 2)))
    path = "/".join(token(rng.randint(2, 8)) for _ in range(rng.randint(0, 3)))
    url = f"{rng.choice(('https://', 'http://', 'www.', ''))}{host}.{rng.choice(_TLDS)}"
    url += f"/{path}" if path else ""
    if rng.random() < 0.4:
        url += f"?{token(2)}={token(rng.randint(1, 6))}"
    return url


def _number(rng: random.Random) -> str:
    kind = rng.randrange(5)
    if kind == 0:
        return str(rng.randint(0, 10 ** rng.randint(1, 12)))
    if kind == 1:
        return f"{rng.uniform(-1e4, 1e4):.{rng.randint(1, 6)}f}"
    if kind == 2:
        return " ".join(str(rng.randint(0, 999)) for _ in range(rng.randint(2, 6)))
    if kind == 3:
        return "-".join(str(rng.randint(10, 9999)) for _ in range(rng.randint(2, 4)))
    return "+" + "".join(rng.choice(string.digits) for _ in range(rng.randint(8, 14)))


def _symbols(rng: random.Random) -> str:
    return "".join(rng.choice(string.punctuation + "¡¿«»…·•§¶") for _ in range(rng.randint(2, 30)))


#: The families, in generation order.
FAMILIES = {"keyboard-mash": _mash, "repeated": _repeated, "random-characters": _random_chars,
            "url": _url, "number": _number, "symbols": _symbols}


def synthetic_negatives(count: int = DEFAULT_COUNT, seed: int = 0) -> tuple[str, ...]:
    """``count`` distinct nonsense texts, the families taking turns; the same for the same seed."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    rng = random.Random(seed)
    makers = list(FAMILIES.values())
    out: dict[str, None] = {}
    attempts = 0
    while len(out) < count and attempts < 20 * count:
        out.setdefault(makers[attempts % len(makers)](rng))
        attempts += 1
    return tuple(out)
