"""One replica of the fleet flywheel benchmark (``bench_flywheel_fleet.py``): a process that
serves like a sidecar (``service.runtime.open_runtime`` in fleet mode: spool shipped to the
store, ``RegistrySync`` following ``models/CURRENT``) and takes commands as JSON lines on
stdin, answering each with one JSON line on stdout:

- ``{"q": [texts]}`` -> ``{"answers": [[layer, label], ...], "version": served}``
- ``{"ship": true}`` -> flushes and ships the spool now: ``{"shipped": rows}``
- ``{"wait": version, "timeout": s}`` -> ``{"version": served}`` once serving it (or at timeout)
- ``{"quit": true}`` -> closes (ships within the grace) and exits
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flywheel.classifier.settings.config import load_config  # noqa: E402
from flywheel.service.runtime import open_runtime  # noqa: E402


def main() -> int:
    rt = open_runtime(load_config(), progress=False, background_reload=True)
    clf = rt.classifier
    print(json.dumps({"ready": clf.model_version}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if "q" in cmd:
            out = []
            for text in cmd["q"]:
                d = clf.classify(text)
                out.append([d.layer.value, d.label])
            reply = {"answers": out, "version": clf.model_version}
        elif "ship" in cmd:
            reply = {"shipped": rt.sink.drain_now(timeout_s=60.0)}
        elif "wait" in cmd:
            end = time.monotonic() + float(cmd.get("timeout", 60.0))
            while clf.model_version != cmd["wait"] and time.monotonic() < end:
                time.sleep(0.05)
            reply = {"version": clf.model_version}
        else:
            break
        print(json.dumps(reply), flush=True)
    rt.close(grace_s=30.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
