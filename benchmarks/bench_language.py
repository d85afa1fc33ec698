"""What detecting a query's language costs, beside layer 2's encoder (issue 34 item 4), and
whether the served two-pass detector answers as high-accuracy lingua does (issue 44).

On the project's held-out queries (tests/data/heldout_queries.jsonl, English, and
heldout_queries_es.jsonl, Spanish), one query per call, interleaved so machine noise hits
them alike:

- ``detect (served, two passes)``: :class:`classifier.language.LanguageDetector` for the
  starter set's ``[en, es]`` (lingua's low-accuracy mode, then high accuracy below
  :data:`~classifier.language.CASCADE_CONFIDENCE`: what the classifier serves with);
- ``detect (high accuracy)`` / ``detect (low accuracy)``: lingua's two modes alone;
- ``encoder``: the starter set's default encoder (``embedder.backend: auto`` for ``[en, es]``),
  uncached, one text per ``encode`` call.

Prints the p50 and p95 per query, each detector's accuracy against the rows' ``lang`` and the
time to build each detector (its first query included, each in a fresh process: lingua keeps
loaded models process-wide). One run, no warm-up beyond one call.

``--agreement``: how often the served detector answers as high accuracy alone, and how many
queries needed the second pass, for ``[en, es]`` and ``[en, es, de]`` on the held-out and the
follow-up benchmark's queries (benchmarks/data/followups, en/es/de, with their ``lang``) and on
CLINC150's first 3,000 test queries (English).

    python benchmarks/bench_language.py [--rounds 5] [--agreement]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flywheel.classifier.encoders import make_embedder  # noqa: E402
from flywheel.classifier.language import LanguageDetector  # noqa: E402
from flywheel.classifier.settings.config import starter_intents_path  # noqa: E402
from flywheel.classifier.settings.intents import load_intents  # noqa: E402

DATA = ROOT / "tests" / "data"


def heldout() -> list[dict]:
    return [json.loads(line) for name in ("heldout_queries.jsonl", "heldout_queries_es.jsonl")
            for line in (DATA / name).read_text(encoding="utf-8").splitlines() if line.strip()]


def _lingua(languages: tuple[str, ...], low: bool):
    """lingua alone, in one mode, restricted to ``languages``: text -> code or ``unknown``."""
    from lingua import IsoCode639_1, Language, LanguageDetectorBuilder

    langs = [Language.from_iso_code_639_1(IsoCode639_1.from_str(c)) for c in languages]
    builder = LanguageDetectorBuilder.from_languages(*langs)
    det = (builder.with_low_accuracy_mode() if low else builder).build()
    codes = {lang: c for lang, c in zip(langs, languages)}
    return lambda text: codes.get(det.detect_language_of(text), "unknown")


BUILD_CODE = """
import sys, time
sys.path.insert(0, {root!r})
from flywheel.classifier.language import LanguageDetector
from benchmarks.bench_language import _lingua
import lingua
t0 = time.perf_counter()
if {which!r} == "served":
    LanguageDetector({langs!r}).detect("What is addVar in AVAP?")
else:
    _lingua({langs!r}, {which!r} == "low")("What is addVar in AVAP?")
print((time.perf_counter() - t0) * 1000.0)
"""


def _build_ms(which: str, languages: tuple[str, ...]) -> float:
    """Build a detector and answer one query, in a fresh process (lingua's models are
    loaded once per process)."""
    import subprocess

    code = BUILD_CODE.format(root=str(ROOT), which=which, langs=tuple(languages))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def agreement() -> None:
    """The ``--agreement`` part (see the module docs)."""
    from flywheel.classifier import language as lang_mod

    fu_dir = ROOT / "benchmarks" / "data" / "followups"
    followups = [json.loads(line) for path in sorted(fu_dir.glob("*_sessions.jsonl"))
                 for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    clinc_path = ROOT.parent / "shared" / "datasets" / "clinc150" / "data_full.json"
    clinc = [{"text": t, "lang": "en"} for t, _ in json.loads(clinc_path.read_text())["test"][:3000]] \
        if clinc_path.is_file() else []
    sets = {"held-out + follow-ups": heldout() + followups, "CLINC150 test[:3000]": clinc}
    print("agreement of the served two passes with high accuracy alone "
          f"(second pass below confidence {lang_mod.CASCADE_CONFIDENCE}):")
    for declared in (("en", "es"), ("en", "es", "de")):
        high = _lingua(declared, low=False)
        for name, rows in sets.items():
            rows = [r for r in rows if r["lang"] in declared]
            if not rows:
                continue
            served = lang_mod.LanguageDetector(declared)
            low = served._build()   # the first pass alone, to count the queries that need the second
            firm = sum(v[0].value >= lang_mod.CASCADE_CONFIDENCE for r in rows
                       if (v := low.compute_language_confidence_values(r["text"])))
            got = [served.detect(r["text"]) for r in rows]
            want = [high(r["text"]) for r in rows]
            agree = sum(a == b for a, b in zip(got, want))
            right_served = sum(a == r["lang"] for a, r in zip(got, rows))
            right_high = sum(b == r["lang"] for b, r in zip(want, rows))
            print(f"  {','.join(declared):<9} {name:<22} n {len(rows):>5}  agree {agree:>5}  second pass "
                  f"{len(rows) - firm:>4}  right: served {right_served}, high {right_high}")


def _timed(fn, text: str) -> float:
    t0 = time.perf_counter()
    fn(text)
    return (time.perf_counter() - t0) * 1000.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="passes over the held-out queries")
    ap.add_argument("--agreement", action="store_true", help="also the served detector's agreement part")
    args = ap.parse_args(argv)
    intents = load_intents(starter_intents_path())
    langs = tuple(intents.languages)
    rows = heldout()
    builds = {which: _build_ms(which, langs) for which in ("served", "high", "low")}
    served, high, low = LanguageDetector(langs), _lingua(langs, low=False), _lingua(langs, low=True)
    for fn in (served.detect, high, low):
        fn("warm-up")
    enc = make_embedder(intents.embedder, cache=False)
    enc.encode(["warm-up"])
    runs: dict[str, list[float]] = {"detect (served, two passes)": [], "detect (high accuracy)": [],
                                    "detect (low accuracy)": [], f"encoder {enc.id}": []}
    fns = list(zip(runs, (served.detect, high, low, lambda t: enc.encode([t]))))
    for _ in range(args.rounds):
        for r in rows:
            for name, fn in fns:
                runs[name].append(_timed(fn, r["text"]))
    right = {name: sum(fn(r["text"]) == r["lang"] for r in rows) for name, fn in fns[:3]}
    n_en = sum(r["lang"] == "en" for r in rows)
    print(f"{len(rows)} held-out queries ({n_en} en, {len(rows) - n_en} es), {args.rounds} rounds, "
          f"one query per call, interleaved; languages {list(langs)}")
    for name, ms in runs.items():
        a = np.asarray(ms)
        print(f"  {name:<40} p50 {np.percentile(a, 50):8.3f} ms   p95 {np.percentile(a, 95):8.3f} ms")
    enc_p50 = float(np.percentile(runs[f"encoder {enc.id}"], 50))
    served_p50 = float(np.percentile(runs["detect (served, two passes)"], 50))
    print(f"  detection (served) / encoder p50: {100 * served_p50 / enc_p50:.2f}%")
    print("  accuracy: " + ", ".join(f"{name.removeprefix('detect ')} {n}/{len(rows)}" for name, n in right.items()))
    print("  build + first query, fresh process: " + ", ".join(f"{k} {v:.0f} ms" for k, v in builds.items()))
    if args.agreement:
        agreement()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
