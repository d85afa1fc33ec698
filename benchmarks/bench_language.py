"""What detecting a query's language costs, beside layer 2's encoder (issue 34 item 4).

On the project's held-out queries (tests/data/heldout_queries.jsonl, English, and
heldout_queries_es.jsonl, Spanish), one query per call, interleaved so machine noise hits
both alike:

- ``detect (high accuracy)``: :class:`classifier.language.LanguageDetector` for the starter
  set's ``[en, es]`` (lingua, high-accuracy mode: what the classifier serves with);
- ``detect (low accuracy)``: lingua's low-accuracy mode on the same languages (measured, not used);
- ``encoder``: the starter set's default encoder (``embedder.backend: auto`` for ``[en, es]``),
  uncached, one text per ``encode`` call.

Prints the p50 and p95 per query, each detector's accuracy against the rows' ``lang`` and the
time to build each detector (its first query included). One run, no warm-up beyond one call.

    python benchmarks/bench_language.py [--rounds 5]
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


def _low_accuracy(languages: tuple[str, ...]):
    from lingua import IsoCode639_1, Language, LanguageDetectorBuilder

    langs = [Language.from_iso_code_639_1(IsoCode639_1.from_str(c)) for c in languages]
    det = LanguageDetectorBuilder.from_languages(*langs).with_low_accuracy_mode().build()
    codes = {lang: c for lang, c in zip(langs, languages)}
    return lambda text: codes.get(det.detect_language_of(text), "unknown")


def _timed(fn, text: str) -> float:
    t0 = time.perf_counter()
    fn(text)
    return (time.perf_counter() - t0) * 1000.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="passes over the held-out queries")
    args = ap.parse_args(argv)
    intents = load_intents(starter_intents_path())
    rows = heldout()
    t0 = time.perf_counter()
    high = LanguageDetector(intents.languages)
    high.detect("warm-up")
    build_high = (time.perf_counter() - t0) * 1000.0
    t0 = time.perf_counter()
    low = _low_accuracy(intents.languages)
    low("warm-up")
    build_low = (time.perf_counter() - t0) * 1000.0
    enc = make_embedder(intents.embedder, cache=False)
    enc.encode(["warm-up"])
    runs: dict[str, list[float]] = {"detect (high accuracy)": [], "detect (low accuracy)": [],
                                    f"encoder {enc.id}": []}
    fns = list(zip(runs, (high.detect, low, lambda t: enc.encode([t]))))
    for _ in range(args.rounds):
        for r in rows:
            for name, fn in fns:
                runs[name].append(_timed(fn, r["text"]))
    right_high = sum(high.detect(r["text"]) == r["lang"] for r in rows)
    right_low = sum(low(r["text"]) == r["lang"] for r in rows)
    n_en = sum(r["lang"] == "en" for r in rows)
    print(f"{len(rows)} held-out queries ({n_en} en, {len(rows) - n_en} es), {args.rounds} rounds, "
          f"one query per call, interleaved; languages {list(intents.languages)}")
    for name, ms in runs.items():
        a = np.asarray(ms)
        print(f"  {name:<40} p50 {np.percentile(a, 50):8.3f} ms   p95 {np.percentile(a, 95):8.3f} ms")
    enc_p50 = float(np.percentile(runs[f"encoder {enc.id}"], 50))
    high_p50 = float(np.percentile(runs["detect (high accuracy)"], 50))
    print(f"  detection (high accuracy) / encoder p50: {100 * high_p50 / enc_p50:.2f}%")
    print(f"  accuracy: high {right_high}/{len(rows)}, low {right_low}/{len(rows)}")
    print(f"  build + first query: high {build_high:.0f} ms, low {build_low:.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
