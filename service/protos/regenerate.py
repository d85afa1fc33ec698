"""Regenerate the Python modules of the gRPC contract from ``flywheel/v1/classifier.proto``.

Runs, from the repository root::

    python -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. \\
        service/protos/flywheel/v1/classifier.proto

then names the modules by their installed path (``flywheel.service.protos...``: the wheel
installs ``service/`` as ``flywheel.service``, see pyproject.toml). ``--out DIR`` writes the
files under ``DIR`` (``DIR/service/protos/flywheel/v1/...``) instead of in place; the tests
use it to check that the committed files are current.
Needs ``grpcio-tools`` (the ``dev`` extra).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO = "service/protos/flywheel/v1/classifier.proto"
GENERATED = ("classifier_pb2.py", "classifier_pb2.pyi", "classifier_pb2_grpc.py")
# protoc names the modules by their path from the root; the installed name has the namespace
_AS_GENERATED, _INSTALLED = "service.protos.flywheel.v1", "flywheel.service.protos.flywheel.v1"


def command(out: str = ".") -> list[str]:
    """The protoc command line (run with the repository root as working directory)."""
    return [sys.executable, "-m", "grpc_tools.protoc", "-I", ".", f"--python_out={out}", f"--pyi_out={out}",
            f"--grpc_python_out={out}", PROTO]


def regenerate(out: str | Path | None = None) -> list[Path]:
    """Generate the modules (in place, or under ``out``); return their paths.

    Raises :class:`subprocess.CalledProcessError` if protoc fails.
    """
    target = Path(out).resolve() if out is not None else ROOT
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(command(str(target) if out is not None else "."), cwd=ROOT, check=True)
    paths = [target / Path(PROTO).parent / name for name in GENERATED]
    for path in paths:
        _name_installed(path)
    return paths


def _name_installed(path: Path) -> None:
    """Refer to the generated modules by their installed (namespaced) name."""
    text = path.read_text(encoding="utf-8")
    fixed = text.replace(f"from {_AS_GENERATED} import", f"from {_INSTALLED} import")
    fixed = fixed.replace(f"'{_AS_GENERATED}.", f"'{_INSTALLED}.")
    if fixed != text:
        path.write_text(fixed, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flywheel.service.protos.regenerate",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", metavar="DIR", help="write under DIR instead of in place")
    args = parser.parse_args(argv)
    try:
        paths = regenerate(args.out)
    except subprocess.CalledProcessError as exc:
        print(f"protoc failed (exit {exc.returncode})", file=sys.stderr)
        return 1
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
