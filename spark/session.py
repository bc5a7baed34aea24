"""The SparkSession of Capstan's jobs and benchmark: Python workers that import capstan,
and, in local mode, a driver on loopback and shuffles sized for one machine."""

from __future__ import annotations

import os
import sys
from typing import Any


def spark_session(master: str = "local[*]", app: str = "capstan") -> Any:
    """A SparkSession whose Python workers import capstan (local mode runs them from here)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app).config("spark.ui.showConsoleProgress", "false")
    if master:
        builder = builder.master(master)
    if master.startswith("local"):
        # Everything runs here: keep the driver on loopback, whatever the host name
        # resolves to.
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config(
            "spark.driver.host", "127.0.0.1"
        )
        # One machine: a shuffle in 200 partitions (the default, sized for clusters) is
        # mostly task overhead.
        builder = builder.config("spark.sql.shuffle.partitions", str(2 * (os.cpu_count() or 1)))
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
