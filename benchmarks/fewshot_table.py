"""Few-shot runs over several seeds as one table: mean ± sample standard deviation per arm.

Reads the ``--json-out`` files of ``bench_fewshot_tuning.py`` (one list of rows each; the
file's name or ``--name`` says which data set) and prints a Markdown table per data set and
shot count: frozen, tuned, and tuned after the unlabelled stage at each share, with the
seeds each mean is over and the gains over frozen, paired by seed::

    python benchmarks/fewshot_table.py .bench/c10-s*.json --name CLINC150
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

METRICS = ("accuracy", "top1", "oos_recall")


def arm(row: dict[str, Any]) -> str:
    """The arm a row belongs to: ``frozen``, ``tuned`` or ``tuned + stage S``."""
    if not row.get("tuned"):
        return "frozen"
    share = row.get("unlabelled_share")
    return "tuned" if not share else f"tuned + stage {share:g}"


def _fmt(values: list[float], sign: str = "") -> str:
    """Percentages: the mean, and ± the sample standard deviation over two or more."""
    if not values:
        return ""
    mean = f"{100 * statistics.fmean(values):{sign}.2f}"
    return mean if len(values) == 1 else f"{mean} ± {100 * statistics.stdev(values):.2f}"


def table(rows: list[dict[str, Any]], shots: int) -> list[str]:
    """Markdown lines for one shot count."""
    by: dict[str, dict[int, dict[str, Any]]] = {}
    for r in rows:
        if r["shots"] == shots:
            by.setdefault(arm(r), {})[int(r["seed"])] = r
    frozen = by.get("frozen", {})
    lines = [f"| {shots} shots | seeds | accuracy | top-1 | OOS recall | accuracy gain over frozen (paired) |",
             "|---|---|---:|---:|---:|---:|"]
    for name in sorted(by, key=lambda a: (a != "frozen", a != "tuned", a)):
        runs = by[name]
        seeds = sorted(runs)
        cells = [_fmt([runs[s][m] for s in seeds if runs[s].get(m) is not None]) for m in METRICS]
        gains = [runs[s]["accuracy"] - frozen[s]["accuracy"] for s in seeds if s in frozen and name != "frozen"]
        lines.append(f"| {name} | {','.join(map(str, seeds))} | {' | '.join(cells)} | {_fmt(gains, '+')} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path, help="bench_fewshot_tuning.py --json-out files")
    ap.add_argument("--name", default="", help="the data set's name for the heading")
    args = ap.parse_args(argv)
    rows = [r for f in args.files for r in json.loads(f.read_text(encoding="utf-8"))]
    if not rows:
        ap.error("no rows in the files given")
    for shots in sorted({int(r["shots"]) for r in rows}):
        print(f"\n{args.name} ({len({r['seed'] for r in rows if r['shots'] == shots})} seeds)\n".strip())
        print("\n".join(table(rows, shots)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
