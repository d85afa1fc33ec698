"""A screenshot of the ``flywheel ui`` dashboard (issue 25) for the README, from a real log.

Serves the dashboard (:class:`training.review.app.ReviewApp`, read-only) over a flywheel benchmark's
log and models home on a free loopback port, and has Debian's headless chromium save it::

    python benchmarks/dashboard_screenshot.py --log-db /tmp/flywheel-bench-XXXX/log.duckdb \\
        --models /tmp/flywheel-bench-XXXX/models --window 1000 --out docs/dashboard.png

(``bench_flywheel.py`` leaves its work directory in place; pass ``--workdir`` to choose it.)
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flywheel.fleet.human_labels import HumanLabels  # noqa: E402
from flywheel.fleet.site import home_reports  # noqa: E402
from flywheel.logstore import LogStore  # noqa: E402
from flywheel.training.review.app import ReviewApp, make_server  # noqa: E402
from flywheel.training.review.dashboard import retrain_history  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log-db", required=True)
    ap.add_argument("--models", default=None, help="the models home (the retrain history)")
    ap.add_argument("--window", type=int, default=1000)
    ap.add_argument("--out", default="docs/dashboard.png")
    ap.add_argument("--size", default="1400,1900", help="window size WIDTH,HEIGHT")
    args = ap.parse_args(argv)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium is not installed (apt-get install --no-install-recommends chromium)")
    store = LogStore(args.log_db)
    history = retrain_history(home_reports(Path(args.models))) if args.models else []
    app = ReviewApp(store, HumanLabels(store, lambda: None), history=lambda: history)
    server = make_server(app, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    out = Path(args.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/dashboard?window={args.window}"
        subprocess.run([chromium, "--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--hide-scrollbars",
                        f"--window-size={args.size}", f"--screenshot={out}", url], check=True, timeout=120,
                       capture_output=True)
    finally:
        server.shutdown()
        server.server_close()
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
