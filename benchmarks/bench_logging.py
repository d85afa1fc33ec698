"""Per-call cost of logging a decision, and what the background writer costs.

Measures, on realistic records (60-char text, 3-turn history, 3 alternatives, a
teacher call on 10%, a 384-d float32 embedding):

- ``write()`` per call (p50/p99/p99.9/max, and the mean from an untimed loop);
- end-to-end writer throughput (first write -> ``flush()`` returned);
- per 1,000-row batch: building the Arrow table, writing the fsynced spool segment,
  ingesting one segment into DuckDB (open + insert + close), and, for comparison, the
  "open the database on every flush" design (open + Arrow insert + close);
- open/close overhead of a DuckDB connection and of a small ``LogStore`` read.

    python benchmarks/bench_logging.py                      # 100k records
    python benchmarks/bench_logging.py --records 20000 --json-out bench.json
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import duckdb  # noqa: E402

from flywheel.classifier.decision import Candidate, Decision, Layer, TeacherCall, Tier  # noqa: E402
from flywheel.classifier.protocols import DecisionRecord, HistoryEntry  # noqa: E402
from flywheel.logstore import LogStore  # noqa: E402
from flywheel.logstore.connection import connect, stats  # noqa: E402
from flywheel.logstore.segments import records_to_table, write_segment  # noqa: E402

LABELS = ["billing", "refund", "shipping", "account", "cancel", "upgrade", "support"]


def make_records(n: int, dim: int, seed: int = 0) -> list[DecisionRecord]:
    rng = np.random.default_rng(seed)
    emb = rng.standard_normal((n, dim)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    out = []
    now = time.time()
    for i in range(n):
        lab = LABELS[i % len(LABELS)]
        teacher = (TeacherCall("llama3.1:8b", lab, i % 20 != 0, 640.0 + i % 100)
                   if i % 10 == 0 else None)
        d = Decision(label=lab, confidence=0.5 + (i % 50) / 100, tier=Tier.CONFIDENT,
                     layer=Layer.LLM if teacher else Layer.EMBEDDING,
                     reason="nearest centroid above the confident cutoff",
                     alternatives=[Candidate(LABELS[(i + k) % 7], 0.3 / k) for k in (1, 2, 3)],
                     model_version="v12", latency_ms={"rules": 0.02, "embedding": 3.1},
                     teacher=teacher)
        out.append(DecisionRecord(
            decision=d, text=f"hi, I was charged twice for my order #{i}, can you refund it?",
            created_at=now + i * 1e-3, session_id=f"s{i // 5}",
            history=tuple(HistoryEntry.of(LABELS[(i + k) % 7], f"earlier turn {k} of session")
                          for k in range(3)),
            encoder_id="minilm:all-MiniLM-L6-v2", embedding=emb[i], audit=i % 50 == 0))
    return out


def pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q))


def median_time(fn, repeat: int) -> float:
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def run(args) -> dict:
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench-logging-"))
    work.mkdir(parents=True, exist_ok=True)
    res: dict = {"records": args.records, "dim": args.dim, "batch_size": args.batch_size,
                 "fsync": not args.no_fsync, "python": platform.python_version(),
                 "duckdb": duckdb.__version__, "machine": platform.machine()}
    records = make_records(args.records, args.dim)
    fsync = not args.no_fsync

    # 1. write() per call, writer thread running as in production
    store = LogStore(work / "a" / "log.duckdb")
    sink = store.open_sink(batch_size=args.batch_size, fsync=fsync, max_spool_bytes=None)
    ns = np.empty(len(records), dtype=np.int64)
    clock = time.perf_counter_ns
    write = sink.write
    t_start = time.perf_counter()
    for i, r in enumerate(records):
        t0 = clock()
        write(r)
        ns[i] = clock() - t0
    t_enq = time.perf_counter() - t_start
    written = sink.flush()
    t_total = time.perf_counter() - t_start
    sink.close()
    assert written == len(records), (written, len(records))
    us = ns / 1e3
    res["write_us"] = {"p50": pct(us, 50), "p99": pct(us, 99), "p99.9": pct(us, 99.9),
                       "max": float(us.max()), "mean": float(us.mean())}
    res["writer_rows_per_s"] = len(records) / t_total
    res["enqueue_total_s"] = t_enq
    res["writer_total_s"] = t_total

    # mean per call without per-call timers (second sink, same records)
    store_b = LogStore(work / "b" / "log.duckdb")
    sink_b = store_b.open_sink(batch_size=args.batch_size, fsync=fsync, ingest_interval_s=None,
                               max_spool_bytes=None)
    write = sink_b.write
    t0 = time.perf_counter()
    for r in records:
        write(r)
    res["write_us"]["mean_untimed"] = (time.perf_counter() - t0) / len(records) * 1e6
    sink_b.close()

    # 2. ingest everything that is still spooled (the writer ingests every 10 s)
    t0 = time.perf_counter()
    n_in = store_b.ingest()
    dt = time.perf_counter() - t0
    res["ingest_rows"] = n_in
    res["ingest_rows_per_s"] = n_in / dt if n_in else None

    # 3. per 1,000-row batch
    bs = 1000
    batches = [records[i:i + bs] for i in range(0, min(len(records), bs * args.batches), bs)]
    spool = work / "spool-bench"
    spool.mkdir(exist_ok=True)
    conv, seg, ingest_one, direct = [], [], [], []
    for b in batches:
        t0 = time.perf_counter()
        table = records_to_table(b)
        t1 = time.perf_counter()
        write_segment(spool, table, fsync=fsync)
        t2 = time.perf_counter()
        conv.append(t1 - t0)
        seg.append(t2 - t1)
    # ingest one segment at a time into the (already large) database b
    for p in sorted(spool.glob("*.arrow")):
        shutil.move(str(p), store_b.spool_dir / p.name)
        t0 = time.perf_counter()
        store_b.ingest()
        ingest_one.append(time.perf_counter() - t0)
    # the alternative design: open the database on every flush
    direct_path = work / "direct.duckdb"
    LogStore(direct_path)
    for b in batches:
        table = records_to_table(b)
        t0 = time.perf_counter()
        con = connect(direct_path)
        con.register("t", table)
        con.execute("BEGIN")
        con.execute("INSERT INTO decisions BY NAME SELECT * EXCLUDE (embedding) FROM t")
        con.execute("INSERT INTO embeddings SELECT decision_id, encoder_id, len(embedding), "
                    "embedding FROM t WHERE embedding IS NOT NULL")
        con.execute("COMMIT")
        con.close()
        direct.append(time.perf_counter() - t0)
    ms = lambda xs: 1e3 * statistics.median(xs)  # noqa: E731
    res["per_1000_ms"] = {
        "arrow_table": ms(conv), "spool_segment_write": ms(seg),
        "flush_total": ms([a + b for a, b in zip(conv, seg)]),
        "ingest_one_segment": ms(ingest_one),
        "direct_open_insert_close": ms(direct),
        "direct_open_insert_close_p90": 1e3 * float(np.percentile(direct, 90)),
    }

    # 4. open/close overhead
    db = store_b.path
    res["open_close_ms"] = {
        "duckdb_connect_close": 1e3 * median_time(lambda: connect(db).close(), 15),
        "logstore_count": 1e3 * median_time(store_b.count, 15),
    }
    res["db_rows"] = store_b.count()
    res["db_size_mb"] = Path(db).stat().st_size / 1e6
    res["lock_retries"] = stats["lock_retries"]
    if not args.dir and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return res


def print_table(res: dict) -> None:
    w = res["write_us"]
    p = res["per_1000_ms"]
    o = res["open_close_ms"]
    rows = [
        ("write() p50", f"{w['p50']:.2f} us"),
        ("write() p99", f"{w['p99']:.2f} us"),
        ("write() p99.9", f"{w['p99.9']:.2f} us"),
        ("write() max", f"{w['max'] / 1e3:.2f} ms"),
        ("write() mean (timed)", f"{w['mean']:.2f} us"),
        ("write() mean (untimed loop)", f"{w['mean_untimed']:.2f} us"),
        ("target", "<= 50 us per call"),
        ("writer end-to-end", f"{res['writer_rows_per_s']:,.0f} rows/s"),
        ("ingest spool -> DuckDB", f"{res['ingest_rows_per_s'] or 0:,.0f} rows/s"),
        ("1k batch: build Arrow table", f"{p['arrow_table']:.1f} ms"),
        ("1k batch: write spool segment", f"{p['spool_segment_write']:.1f} ms"
         + (" (fsync)" if res["fsync"] else "")),
        ("1k batch: flush total (writer)", f"{p['flush_total']:.1f} ms"),
        ("1k batch: ingest 1 segment", f"{p['ingest_one_segment']:.1f} ms"),
        ("1k batch: open+insert+close", f"{p['direct_open_insert_close']:.1f} ms "
         f"(p90 {p['direct_open_insert_close_p90']:.1f})"),
        ("DuckDB connect+close", f"{o['duckdb_connect_close']:.1f} ms"),
        ("LogStore.count() (open..close)", f"{o['logstore_count']:.1f} ms"),
        ("rows / file size", f"{res['db_rows']:,} / {res['db_size_mb']:.0f} MB"),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"bench_logging: {res['records']:,} records, dim {res['dim']}, "
          f"batch {res['batch_size']}, duckdb {res['duckdb']}, python {res['python']}")
    print(f"{'metric':<{width}}  value")
    print(f"{'-' * width}  {'-' * 24}")
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--batch-size", type=int, default=1000, help="sink batch_size")
    ap.add_argument("--batches", type=int, default=20, help="1k batches for per-batch timings")
    ap.add_argument("--no-fsync", action="store_true", help="skip fsync of spool segments")
    ap.add_argument("--dir", help="work directory (default: a temp dir, removed)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    ap.add_argument("--json-out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    res = run(args)
    print_table(res)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(res, indent=2))
        print(f"wrote {args.json_out}")
    return 0 if res["write_us"]["mean"] <= 50 else 1


if __name__ == "__main__":
    sys.exit(main())
