"""Tests of the simulated Ollama teacher (tests/support/simulated_ollama.py) through the
real OllamaTeacher."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from flywheel.classifier.errors import TeacherError
from flywheel.classifier.protocols import HistoryEntry, LabelOption, TeacherRequest
from flywheel.classifier.settings.label_names import OUT_OF_SCOPE
from flywheel.classifier.teachers import CircuitBreaker, OllamaTeacher
from tests.support.paths import ROOT
from tests.support.simulated_ollama import SimulatedOllama, load_clinc_truth, offered_labels, query_from_messages

LABELS = [f"intent_{i:02d}" for i in range(8)]
OPTIONS = tuple(LabelOption(n, f"the {n} intent", (f"example of {n}",)) for n in LABELS)


def make_truth(n: int = 300, oos_every: int = 5) -> dict[str, str | None]:
    """n texts; every ``oos_every``-th out of scope (half as None, half as "oos")."""
    truth: dict[str, str | None] = {}
    for i in range(n):
        if i % oos_every == 0:
            truth[f"query number {i}: something unrelated"] = None if i % 2 else "oos"
        else:
            truth[f"query number {i}: please do {LABELS[i % len(LABELS)]}"] = LABELS[i % len(LABELS)]
    return truth


TRUTH = make_truth()


def expected(label: str | None) -> str | None:
    return None if label in (None, "oos") else label


@pytest.fixture(scope="module")
def sim():
    with SimulatedOllama(TRUTH, accuracy=0.9, latency_scale=0.0, seed=7) as s:
        yield s


@pytest.fixture(autouse=True)
def _ok_mode(request):
    yield
    if "sim" in request.fixturenames:
        request.getfixturevalue("sim").set_mode("ok")


def teacher(url: str, timeout_s: float = 5.0, **kw) -> OllamaTeacher:
    return OllamaTeacher("sim-model:1b", host=url, timeout_s=timeout_s, **kw)


def ask(t: OllamaTeacher, text: str, options=OPTIONS, **kw) -> str | None:
    return t.label(TeacherRequest(text=text, options=options, **kw)).label


# --------------------------------------------------------------------------- accuracy

def test_accuracy_and_determinism_through_ollama_teacher(sim):
    t = teacher(sim.url)
    before = sim.requests
    answers = {text: ask(t, text) for text in TRUTH}
    assert sim.requests - before == len(TRUTH)
    right = sum(answers[x] == expected(y) for x, y in TRUTH.items())
    acc = right / len(TRUTH)
    assert 0.85 <= acc <= 0.95, acc           # binomial(300, 0.9): sd 1.7 points
    # the server's own grading agrees with ours
    assert sim.counts["right"] >= right and sim.counts["wrong"] >= len(TRUTH) - right
    # every answer is an offered label or out of scope
    assert set(answers.values()) <= set(LABELS) | {None}
    # wrong answers come in every flavour: another intent, OUT_OF_SCOPE, an intent for an OOS query
    wrong = [(x, y, answers[x]) for x, y in TRUTH.items() if answers[x] != expected(y)]
    assert any(expected(y) is not None and a is None for _, y, a in wrong)
    assert any(expected(y) is not None and a is not None for _, y, a in wrong)
    assert any(expected(y) is None and a is not None for _, y, a in wrong)

    # same query -> same answer, also in a fresh server with the same seed
    again = {text: ask(t, text) for text in list(TRUTH)[:30]}
    assert again == {k: answers[k] for k in again}
    with SimulatedOllama(TRUTH, accuracy=0.9, latency_scale=0.0, seed=7) as twin:
        t2 = teacher(twin.url)
        assert {x: ask(t2, x) for x in list(TRUTH)[:30]} == again
    t.close()


def test_seed_changes_answers_and_extreme_accuracies():
    texts = list(TRUTH)[:80]
    opts = OPTIONS
    a = SimulatedOllama(TRUTH, seed=1)
    b = SimulatedOllama(TRUTH, seed=2)
    offered = [o.name for o in opts] + [OUT_OF_SCOPE]
    assert [a.choose(x, offered)[0] for x in texts] != [b.choose(x, offered)[0] for x in texts]
    perfect = SimulatedOllama(TRUTH, accuracy=1.0)
    hopeless = SimulatedOllama(TRUTH, accuracy=0.0)
    for x, y in TRUTH.items():
        ans, truth, right = perfect.choose(x, offered)
        assert right and ans == (expected(y) or OUT_OF_SCOPE) and truth == expected(y)
        ans, _, right = hopeless.choose(x, offered)
        assert not right and ans != (expected(y) or OUT_OF_SCOPE)


def test_candidates_not_offered_and_no_out_of_scope():
    sim = SimulatedOllama(TRUTH, accuracy=1.0)
    text = next(x for x, y in TRUTH.items() if y == "intent_03")
    # the true intent is not among the offered candidates: a right teacher says OUT_OF_SCOPE
    assert sim.choose(text, ["intent_01", "intent_02", OUT_OF_SCOPE])[0] == OUT_OF_SCOPE
    # ... and when OUT_OF_SCOPE is not allowed it must pick an offered intent
    assert sim.choose(text, ["intent_01", "intent_02"])[0] in ("intent_01", "intent_02")
    oos_text = next(x for x, y in TRUTH.items() if y is None)
    assert sim.choose(oos_text, ["intent_01"])[0] == "intent_01"
    # wrong answers never repeat the true label, and depend only on the offered *set*
    wrong = SimulatedOllama(TRUTH, accuracy=0.0, wrong_oos_rate=0.0)
    assert wrong.choose(text, ["intent_03", "intent_05", OUT_OF_SCOPE])[0] == "intent_05"
    assert (wrong.choose(text, LABELS + [OUT_OF_SCOPE])[0]
            == wrong.choose(text, [OUT_OF_SCOPE] + LABELS[::-1])[0])
    # unknown texts count as out of scope; lookup tolerates the classifier's text cleaning
    assert sim.true_label("never seen before") == (None, False)
    assert sim.true_label("  QUERY number 3:\tplease do   intent_03 ") == ("intent_03", True)


def test_real_request_shape_with_history(sim):
    t = teacher(sim.url)
    text = next(x for x, y in TRUTH.items() if y == "intent_01")
    req = TeacherRequest(text=text, options=OPTIONS,
                         history=(HistoryEntry.of("intent_02", 'he said "Query: nope"'),))
    want = sim.choose(text, LABELS + [OUT_OF_SCOPE])[0]
    assert t.label(req).label == (None if want == OUT_OF_SCOPE else want)
    last = sim.answers[-1]
    assert last[0] == text and last[1] == "intent_01" and OUT_OF_SCOPE in last[3]
    assert query_from_messages([{"role": "user", "content": 'x\nQuery: "a \\"b\\""'}]) == 'a "b"'
    assert query_from_messages([{"role": "system", "content": "s"}]) is None
    assert offered_labels({"messages": [{"role": "system", "content":
                                         "Answer ... exactly one of: A, B, OUT_OF_SCOPE. Use"}]}) \
        == ["A", "B", OUT_OF_SCOPE]
    t.close()


def test_tags_version_and_latency():
    with SimulatedOllama(TRUTH, latency_s=0.2, latency_scale=0.25, seed=3) as sim:  # ~50 ms median
        tags = httpx.get(sim.url + "/api/tags", timeout=5).json()
        assert tags["models"][0]["name"] == sim.model
        assert "version" in httpx.get(sim.url + "/api/version", timeout=5).json()
        assert httpx.get(sim.url + "/", timeout=5).text == "Ollama is running"
        assert httpx.post(sim.url + "/api/generate", json={}, timeout=5).status_code == 404
        t = teacher(sim.url)
        took = []
        for x in list(TRUTH)[:8]:
            t0 = time.perf_counter()
            ask(t, x)
            took.append(time.perf_counter() - t0)
        took.sort()
        assert 0.02 < took[len(took) // 2] < 0.5, took
        t.close()
    # a latency_fn replaces the lognormal
    fixed = SimulatedOllama(TRUTH, latency_fn=lambda rng: 2.0, latency_scale=0.5)
    assert fixed._latency("x") == 1.0
    assert SimulatedOllama(TRUTH, latency_scale=0.0)._latency("x") == 0.0


# --------------------------------------------------------------------------- failure modes

@pytest.mark.parametrize("mode,kind", [("down", "unavailable"), ("http500", "unavailable"),
                                       ("garbage", "malformed"), ("unknown_label", "unknown_label"),
                                       ("slow", "timeout")])
def test_failure_modes_map_to_teacher_error_kinds(sim, mode, kind):
    sim.slow_s = 3.0
    t = teacher(sim.url, timeout_s=0.3 if mode == "slow" else 5.0)
    text = list(TRUTH)[1]
    sim.mode = mode
    with pytest.raises(TeacherError) as ei:
        ask(t, text)
    assert ei.value.kind == kind
    assert sim.counts.get(mode, 0) >= 1
    sim.mode = None
    assert sim.mode == "ok"
    assert ask(t, text) in set(LABELS) | {None}  # recovers at once
    t.close()


def test_mode_for_n_requests_and_circuit_breaker(sim):
    breaker = CircuitBreaker(failures=2, reset_s=60.0)
    t = teacher(sim.url, breaker=breaker)
    sim.set_mode("http500", times=2)
    text = list(TRUTH)[2]
    for _ in range(2):
        with pytest.raises(TeacherError) as ei:
            ask(t, text)
        assert ei.value.kind == "unavailable"
    n = sim.requests
    with pytest.raises(TeacherError) as ei:
        ask(t, text)
    assert ei.value.kind == "circuit_open" and sim.requests == n  # no call made
    assert sim.mode == "ok"
    assert ask(teacher(sim.url), text) in set(LABELS) | {None}
    with pytest.raises(ValueError):
        sim.set_mode("exploding")
    t.close()


def test_stop_interrupts_slow_handlers_and_refuses_after():
    sim = SimulatedOllama(TRUTH, slow_s=30.0).start()
    url = sim.url
    sim.mode = "slow"
    t = teacher(url, timeout_s=0.2)
    with pytest.raises(TeacherError):
        ask(t, list(TRUTH)[0])
    t0 = time.perf_counter()
    sim.stop()
    assert time.perf_counter() - t0 < 3.0
    sim.stop()  # idempotent
    with pytest.raises(TeacherError) as ei:
        ask(teacher(url, timeout_s=1.0), list(TRUTH)[0])
    assert ei.value.kind == "unavailable"


def test_invalid_arguments():
    for kw in ({"accuracy": 1.5}, {"latency_scale": -1}, {"max_parallel": 0},
               {"wrong_oos_rate": 2}):
        with pytest.raises(ValueError):
            SimulatedOllama(TRUTH, **kw)


def test_max_parallel_queues_requests():
    with SimulatedOllama(TRUTH, latency_fn=lambda rng: 0.15, max_parallel=1) as sim:
        from concurrent.futures import ThreadPoolExecutor

        t = teacher(sim.url)
        texts = list(TRUTH)[:3]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda x: ask(t, x), texts))
        assert time.perf_counter() - t0 >= 0.4  # 3 x 0.15 s, one at a time
        t.close()


# --------------------------------------------------------------------------- command line

def _write_clinc(path: Path) -> None:
    doc = {"train": [["book a table for two", "restaurant_reservation"], ["what's my balance", "balance"]],
           "val": [["how much money do i have", "balance"]],
           "test": [["reserve a table", "restaurant_reservation"]],
           "oos_train": [["what is the airspeed of a swallow", "oos"]], "oos_val": [],
           "oos_test": [["sing me a song about cheese", "oos"]]}
    path.write_text(json.dumps(doc), encoding="utf-8")


def test_load_clinc_truth(tmp_path):
    p = tmp_path / "data_full.json"
    _write_clinc(p)
    truth = load_clinc_truth(p)
    assert truth == {"book a table for two": "restaurant_reservation", "what's my balance": "balance",
                     "how much money do i have": "balance", "reserve a table": "restaurant_reservation",
                     "what is the airspeed of a swallow": None, "sing me a song about cheese": None}


@pytest.mark.slow   # a simulated Ollama process
def test_module_entry_point_serves_clinc(tmp_path):
    p = tmp_path / "data_full.json"
    _write_clinc(p)
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.simulated_ollama", "--clinc", str(p),
                             "--accuracy", "1.0", "--port", "0", "--latency-scale", "0",
                             "--duration", "20"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in line, line + proc.stderr.read()
        url = line.split("listening on ", 1)[1].split()[0]
        t = teacher(url)
        opts = (LabelOption("balance", "money"), LabelOption("restaurant_reservation", "tables"))
        assert ask(t, "reserve a table", opts) == "restaurant_reservation"
        assert ask(t, "sing me a song about cheese", opts) is None
        t.close()
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert "2 right" in out
    bad = subprocess.run([sys.executable, "-m", "tests.support.simulated_ollama", "--clinc",
                          str(tmp_path / "missing.json")], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "missing.json" in bad.stderr
