"""How right each kind of served decision was in a flywheel benchmark run's log.

Reads a copy of ``<workdir>/log.duckdb`` of a ``bench_flywheel.py`` run and scores every
logged decision against the CLINC150 labels, per slice of the stream: layer 2's
in-scope answers, layer 2's out-of-scope answers, and the LLM's answers.

    python benchmarks/flywheel_log_accuracy.py --workdir .bench/fw-v5
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parent.parent

KINDS = {
    "layer 2, in scope": lambda layer, label: layer == "embedding" and label is not None,
    "layer 2, out of scope": lambda layer, label: layer == "embedding" and label is None,
    "LLM": lambda layer, label: layer == "llm",
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--data", default=str(ROOT.parent / "shared/datasets/clinc150/data_full.json"))
    ap.add_argument("--slice", type=int, default=3000, help="queries per slice of the stream")
    args = ap.parse_args()
    data = json.loads(Path(args.data).read_text())
    truth = {t: (None if lab == "oos" else lab) for sp in ("train", "oos_train") for t, lab in data[sp]}
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "log.duckdb"
        shutil.copy(Path(args.workdir) / "log.duckdb", db)   # never lock the run's own file
        con = duckdb.connect(str(db), read_only=True)
        rows = con.execute("SELECT text, layer, label FROM decisions ORDER BY created_at").fetchall()
        con.close()
    print(f"{len(rows):,} logged decisions (segments not yet ingested are not counted)")
    print("| queries | " + " | ".join(f"{k}: n, accuracy" for k in KINDS) + " |")
    print("|---|" + "---:|" * len(KINDS))
    for lo in range(0, len(rows), args.slice):
        part = rows[lo:lo + args.slice]
        cells = []
        for pick in KINDS.values():
            sel = [(t, lab) for t, layer, lab in part if pick(layer, lab)]
            right = sum(truth.get(t, "?") == lab for t, lab in sel)
            cells.append(f"{len(sel):,}, {right / len(sel):.1%}" if sel else "0")
        print(f"| {lo + 1:,}–{lo + len(part):,} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
