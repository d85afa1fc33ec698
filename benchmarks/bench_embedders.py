#!/usr/bin/env python
"""Benchmark the embedders on CPU: latency, cache, throughput, and bge-m3's cost without its weights.

Parts (``--parts``, comma-separated; default all):

- ``minilm``: MiniLM single-query latency (p50/p99, uncached, distinct queries) per
  thread count, next to plain ``nn.Linear`` weights and ``SentenceTransformer.encode``;
- ``cached``: a repeated query served by :class:`CachedEmbedder`;
- ``throughput``: MiniLM batch throughput (queries/s at ``--batch``) per thread count;
- ``bge``: a model with bge-m3's architecture (XLM-RoBERTa large: 24 layers, hidden 1024,
  16 heads, intermediate 4096, vocab 250002, 8194 positions) and RANDOM weights, saved
  to a temp dir with a word-level tokenizer built from the queries, and loaded through
  :class:`BGEM3Embedder`: single-query p50/p99 and batch-32 throughput, fp32 versus
  ``quantize=True`` (int8). Cost depends on shapes, not weight values, so this is
  bge-m3's CPU cost, up to tokenization (tokens per query are reported).

Wall times on a shared machine suffer from other processes; the "CPU p50" column (CPU
time of the calling thread) is much less sensitive, and ``--wait-quiet`` waits for idle
CPUs before each part. The load average and CPU busy share are reported.

Example::

    .venv/bin/python benchmarks/bench_embedders.py --json-out .bench/embedders.json
    .venv/bin/python benchmarks/bench_embedders.py --parts bge --bge-layers 6   # quick look
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from flywheel.classifier import encoders as E  # noqa: E402

PARTS = ("minilm", "cached", "throughput", "bge")

_STARTS = ["how do I", "how can I", "can you help me", "I want to", "is it possible to", "please",
           "what is the best way to", "show me how to", "why can't I", "where do I"]
_VERBS = ["reset", "change", "cancel", "update", "delete", "export", "find", "declare", "track", "renew"]
_OBJECTS = ["my password", "the invoice", "a constant", "my subscription", "the last order",
            "an API key", "the shipping address", "a for loop", "my account email", "the report"]
_TAILS = ["", "today", "in avap", "from the dashboard", "without losing data", "quickly", "on mobile",
          "for my team", "before friday", "in the settings"]


def make_queries(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct short queries (4-14 words), deterministic for a seed."""
    combos = list(itertools.product(_STARTS, _VERBS, _OBJECTS, _TAILS))
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(combos), size=min(n, len(combos)), replace=False)
    return [" ".join(w for w in combos[i] if w) + "?" * int(rng.integers(0, 2)) for i in picks]


def percentiles(seconds: list[float], cpu_seconds: list[float] | None = None) -> dict[str, float]:
    a = np.asarray(seconds) * 1e3
    out = {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
           "mean_ms": float(a.mean()), "n": int(a.size)}
    if cpu_seconds is not None:  # CPU time of the calling thread: robust to other load
        out["cpu_p50_ms"] = float(np.percentile(np.asarray(cpu_seconds) * 1e3, 50))
    return out


def time_each(fn: Callable[[str], Any], queries: list[str], warmup: int = 5) -> dict[str, float]:
    for q in queries[:warmup]:
        fn(q)
    wall, cpu = [], []
    for q in queries:
        c0, t0 = time.thread_time(), time.perf_counter()
        fn(q)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    return percentiles(wall, cpu)


def busy_fraction(seconds: float = 1.0) -> float | None:
    """Share of all CPUs busy over ``seconds`` (from /proc/stat), or None off Linux."""
    def snap() -> tuple[int, int]:
        with open("/proc/stat", encoding="ascii") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]  # total, idle + iowait

    try:
        t1, i1 = snap()
        time.sleep(seconds)
        t2, i2 = snap()
    except OSError:
        return None
    return 1.0 - (i2 - i1) / max(1, t2 - t1)


def wait_quiet(max_wait: float, threshold: float = 0.15) -> float | None:
    """Wait (at most ``max_wait`` s) until other processes leave the CPUs mostly idle."""
    deadline = time.monotonic() + max_wait
    busy = busy_fraction()
    while busy is not None and busy > threshold and time.monotonic() < deadline:
        busy = busy_fraction()
    return busy


def throughput(enc: Callable[[list[str]], Any], queries: list[str], batch: int) -> dict[str, float]:
    enc(queries[:batch])  # warm-up
    t0 = time.perf_counter()
    for s in range(0, len(queries), batch):
        enc(queries[s:s + batch])
    dt = time.perf_counter() - t0
    return {"queries_per_s": len(queries) / dt, "batch": batch, "n": len(queries), "seconds": dt}


def set_threads(n: int | None) -> int:
    import torch

    if n:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def bench_minilm(args: argparse.Namespace, queries: list[str], rows: list[dict]) -> None:
    t0 = time.perf_counter()
    emb = E.MiniLMEmbedder(device="cpu").load()
    load_s = time.perf_counter() - t0
    plain = E.MiniLMEmbedder(device="cpu", pack_weights=False).load()
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(E.minilm_model_dir()), device="cpu")
    a = emb.encode(queries[:64])
    b = st.encode(queries[:64], convert_to_numpy=True, normalize_embeddings=True)
    agree = float((a * b).sum(axis=1).min())
    for n in args.threads:
        used = set_threads(n)
        r = time_each(lambda q: emb.encode([q]), queries)
        rows.append({"part": "minilm", "what": "MiniLM single query (uncached)", "threads": used, **r,
                     "load_s": load_s, "min_cosine_vs_sentence_transformers": agree})
        few = queries[: args.compare_n]
        r = time_each(lambda q: plain.encode([q]), few)
        rows.append({"part": "minilm", "what": "same, pack_weights=False (plain nn.Linear)", "threads": used, **r})
        r = time_each(lambda q: st.encode([q], show_progress_bar=False), few)
        rows.append({"part": "minilm", "what": "same, via SentenceTransformer.encode", "threads": used, **r})


def bench_cached(args: argparse.Namespace, queries: list[str], rows: list[dict]) -> None:
    set_threads(max(args.threads))
    cached = E.CachedEmbedder(E.MiniLMEmbedder(device="cpu"))
    hot = queries[:50]
    cached.encode(hot)
    rng = np.random.default_rng(1)
    reps = [hot[i] for i in rng.integers(0, len(hot), size=5000)]
    r = time_each(lambda q: cached.encode([q]), reps, warmup=50)
    rows.append({"part": "cached", "what": "repeated query, CachedEmbedder hit", "threads": None, **r,
                 "hits": cached.hits, "misses": cached.misses})


def bench_throughput(args: argparse.Namespace, queries: list[str], rows: list[dict]) -> None:
    emb = E.MiniLMEmbedder(device="cpu")
    data = (queries * (1 + args.throughput_n // len(queries)))[: args.throughput_n]
    for n in args.threads:
        used = set_threads(n)
        r = throughput(lambda b: emb.encode(b, batch_size=args.batch), data, args.batch)
        rows.append({"part": "throughput", "what": f"MiniLM batch {args.batch}", "threads": used, **r})


def build_random_bge_m3(path: Path, corpus: list[str], layers: int) -> dict[str, Any]:
    """Save an XLM-RoBERTa-large-shaped model with random weights and a word-level tokenizer.

    One token per word or punctuation run, plus ``<s>``/``</s>``: about what bge-m3's
    250k-piece SentencePiece vocabulary gives for common English words.
    """
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, XLMRobertaConfig, XLMRobertaModel

    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    words = sorted({w for q in corpus for w, _ in pre_tokenizers.Whitespace().pre_tokenize_str(q)})
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(specials + words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<mask>"])
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", bos), ("</s>", eos)])
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", sep_token="</s>",
                                     cls_token="<s>", unk_token="<unk>", pad_token="<pad>", mask_token="<mask>",
                                     model_max_length=8192)
    hf_tok.save_pretrained(str(path))
    config = XLMRobertaConfig(vocab_size=250002, hidden_size=1024, num_hidden_layers=layers,
                              num_attention_heads=16, intermediate_size=4096, max_position_embeddings=8194,
                              type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0,
                              eos_token_id=2)
    torch.manual_seed(0)
    model = XLMRobertaModel(config)  # with the pooler, like the real checkpoint
    n_params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(str(path))
    del model
    gc.collect()
    lengths = [len(hf_tok(q)["input_ids"]) for q in corpus]
    return {"params": n_params, "tokens_per_query": float(np.mean(lengths))}


def encode_one(emb: E.BGEM3Embedder, q: str) -> np.ndarray:
    return emb.encode([q])


def encode_batch32(emb: E.BGEM3Embedder, batch: list[str]) -> np.ndarray:
    return emb.encode(batch, batch_size=32)


def bench_bge(args: argparse.Namespace, queries: list[str], rows: list[dict]) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-bge-m3-"))
    try:
        t0 = time.perf_counter()
        info = build_random_bge_m3(tmp / "bge-m3-random", queries, args.bge_layers)
        build_s = time.perf_counter() - t0
        print(f"[bge] built random model ({info['params'] / 1e6:.0f}M params, "
              f"{info['tokens_per_query']:.1f} tokens/query) in {build_s:.0f}s", file=sys.stderr, flush=True)
        single = queries[: args.bge_single]
        batch_data = queries[args.bge_single: args.bge_single + args.bge_batches * 32]
        # (label, quantize, pack_weights, full): the plain nn.Linear baseline is timed on
        # single queries at the first thread count only.
        variants = [("fp32 (default: packed weights)", False, True, True),
                    ("int8 dynamic (quantize=True)", True, True, True),
                    ("fp32, plain nn.Linear (pack_weights=False)", False, False, False)]
        fp32_vecs = None
        for label, quantize, pack, full in variants:
            emb = E.BGEM3Embedder(str(tmp / "bge-m3-random"), device="cpu", quantize=quantize, pack_weights=pack)
            set_threads(max(args.threads))
            t0 = time.perf_counter()
            emb.load()
            load_s = time.perf_counter() - t0
            vecs = emb.encode(single[:32])
            if fp32_vecs is None:
                fp32_vecs = vecs
            cos = float((vecs * fp32_vecs).sum(axis=1).min())
            if args.wait_quiet > 0:
                wait_quiet(args.wait_quiet)
            for n in args.threads if full else args.threads[:1]:
                used = set_threads(n)
                r = time_each(partial(encode_one, emb), single, warmup=3)
                rows.append({"part": "bge", "what": f"bge-m3 shape, random weights, {label}, single query",
                             "threads": used, **r, "load_s": load_s, "layers": args.bge_layers,
                             "tokens_per_query": info["tokens_per_query"], "min_cosine_vs_fp32": cos})
                print(f"[bge] {label} threads={used}: p50 {r['p50_ms']:.0f} ms", file=sys.stderr, flush=True)
            if full:
                used = set_threads(max(args.threads))
                r = throughput(partial(encode_batch32, emb), batch_data, 32)
                rows.append({"part": "bge", "what": f"bge-m3 shape, random weights, {label}, batch 32",
                             "threads": used, **r, "layers": args.bge_layers})
            del emb  # free the model before loading the next variant
            E.clear_loaded_models()
            gc.collect()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _ms(v: float | None) -> str:
    return "-" if v is None else (f"{v:.3f}" if v < 1 else f"{v:.1f}")


def markdown(rows: list[dict]) -> str:
    lines = ["| measurement | threads | p50 ms | p99 ms | CPU p50 ms | queries/s | notes |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        notes = []
        for k, fmt in (("load_s", "load {:.1f}s"), ("tokens_per_query", "{:.1f} tokens/query"),
                       ("min_cosine_vs_sentence_transformers", "min cos vs ST {:.5f}"),
                       ("min_cosine_vs_fp32", "min cos vs fp32 {:.4f}"),
                       ("n", "n={}"), ("hits", "hits={}")):
            if r.get(k) is not None:
                notes.append(fmt.format(r[k]))
        qps = r.get("queries_per_s")
        cells = [r["what"], "-" if r["threads"] is None else str(r["threads"]), _ms(r.get("p50_ms")),
                 _ms(r.get("p99_ms")), _ms(r.get("cpu_p50_ms")), "-" if qps is None else f"{qps:.1f}",
                 ", ".join(notes)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {', '.join(PARTS)}")
    p.add_argument("--queries", type=int, default=300, help="distinct queries for single-query latency")
    p.add_argument("--compare-n", type=int, default=100,
                   help="queries for the MiniLM comparison rows (plain nn.Linear, SentenceTransformer)")
    p.add_argument("--threads", default="1,2", help="torch thread counts to time single queries with")
    p.add_argument("--batch", type=int, default=64, help="MiniLM throughput batch size")
    p.add_argument("--throughput-n", type=int, default=1024, help="queries encoded for MiniLM throughput")
    p.add_argument("--bge-layers", type=int, default=24, help="transformer layers of the random bge-m3 (24 = real)")
    p.add_argument("--bge-single", type=int, default=30, help="single queries timed per bge-m3 variant")
    p.add_argument("--bge-batches", type=int, default=3, help="batches of 32 timed per bge-m3 variant")
    p.add_argument("--wait-quiet", type=float, default=20.0,
                   help="before each part, wait up to this many seconds for other load to stop (0: don't)")
    p.add_argument("--json-out", type=Path, help="write all results as JSON here")
    args = p.parse_args(argv)
    parts = [s.strip() for s in args.parts.split(",") if s.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        p.error(f"unknown part(s) {unknown}; choose from {PARTS}")
    args.threads = [int(t) for t in args.threads.split(",")]

    import torch

    queries = make_queries(max(args.queries, args.bge_single + args.bge_batches * 32))
    env = {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
           "torch_default_threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
           "loadavg_start": os.getloadavg(), "argv": sys.argv[1:], "busy_before": {}}
    rows: list[dict] = []
    started = time.perf_counter()
    runners = {"minilm": bench_minilm, "cached": bench_cached, "throughput": bench_throughput, "bge": bench_bge}
    for part in PARTS:
        if part in parts:
            busy = wait_quiet(args.wait_quiet) if args.wait_quiet > 0 else busy_fraction()
            env["busy_before"][part] = busy
            print(f"[{part}] CPUs {100 * (busy or 0):.0f}% busy before starting", file=sys.stderr, flush=True)
            runners[part](args, queries[: args.queries] if part != "bge" else queries, rows)
    env["loadavg_end"] = os.getloadavg()
    env["total_s"] = time.perf_counter() - started
    table = markdown(rows)
    print(table)
    print(f"\n{env['cpus']} CPUs, torch {env['torch']}, load average at start "
          f"{env['loadavg_start'][0]:.2f}, at end {env['loadavg_end'][0]:.2f}; total {env['total_s']:.0f}s")
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps({"env": env, "results": rows}, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
