"""Offline side of flywheel: the DuckDB traffic log, retraining and the CLI.

Unlike :mod:`classifier`, this package may import duckdb and pyarrow.
"""
