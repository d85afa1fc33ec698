"""The log's Arrow arrays are built from buffers (issue 44): the same arrays ``pa.array``
makes, value for value, for every column type of the decision and label segments, nulls at
every level included; and writing and draining a decision never imports pandas (which
``pa.array``'s first call does: 0.15-0.25 s of a one-shot ``flywheel classify``)."""

from __future__ import annotations

import random
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from flywheel.logstore.arrow_build import build, numeric
from flywheel.logstore.label_records import LABEL_SCHEMA
from flywheel.logstore.segments import SEGMENT_SCHEMA
from tests.support.paths import ROOT


def _value(t: pa.DataType, rng: random.Random):
    """A random value of ``t``, ``None`` one time in five (at every level)."""
    if rng.random() < 0.2:
        return None
    if pa.types.is_string(t):
        return rng.choice(["", "a", "ñandú ü", "x" * rng.randint(0, 40), "日本語", "emoji 🙂"])
    if pa.types.is_boolean(t):
        return rng.random() < 0.5
    if pa.types.is_floating(t):
        return rng.uniform(-1e3, 1e3)
    if pa.types.is_integer(t) or pa.types.is_timestamp(t):
        return rng.randint(0, 2**50)
    if pa.types.is_map(t):
        return [(rng.choice(["rules", "embedding", "total"]), rng.random()) for _ in range(rng.randint(0, 3))]
    if pa.types.is_list(t):
        return [_value(t.value_type, rng) for _ in range(rng.randint(0, 4))]
    if pa.types.is_struct(t):
        return {f.name: _value(f.type, rng) for f in t}
    raise AssertionError(f"no generator for {t}")


@pytest.mark.parametrize("field", [*SEGMENT_SCHEMA, *LABEL_SCHEMA], ids=lambda f: f"{f.name}:{f.type}")
def test_build_makes_the_array_pa_array_makes(field):
    rng = random.Random(field.name)
    for n in (0, 1, 7, 64):
        values = [_value(field.type, rng) for _ in range(n)]
        got = build(values, field.type)
        got.validate(full=True)
        assert got.equals(pa.array(values, field.type)), (field.name, n)
    assert build([None, None], field.type).null_count == 2


def test_numbers_from_numpy_and_an_unknown_type_is_refused():
    arr = numeric(np.array([1.5, 2.0, 3.25]), pa.float64(), valid=np.array([True, False, True]))
    assert arr.to_pylist() == [1.5, None, 3.25]
    with pytest.raises(TypeError, match="no Arrow builder"):
        build([b"x"], pa.binary())


@pytest.mark.slow   # a Python process
def test_writing_and_draining_a_decision_imports_no_pandas(tmp_path):
    code = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from flywheel.logstore.store import LogStore
from tests.support.records import rec
store = LogStore({str(tmp_path / "log.duckdb")!r})
sink = store.open_sink(ingest_interval_s=60.0, fsync=False)
sink.write(rec("where is my invoice", dim=8))
sink.close()
assert store.count() == 1, store.count()
print("pandas" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
