"""The SparkSession of Capstan's jobs and benchmark: Python workers that import capstan,
and, in local mode, a driver on loopback and shuffles sized for one machine."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

LOCAL_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""A local job's JVM (driver and executor in one): the JIT's first tier only and the
serial collector. A local job lasts seconds to minutes, too short for the top tier's
compiles to pay back their CPU, and runs beside the broker it reads: the compaction job
killed and rerun four times (tests/spark/test_compaction_job.py) took 69-86 CPU-seconds
with these and 103-132 without, measured with a cpuacct cgroup, and `capstan bench spark
--quick` read 37,012 records/s with them against 34,626 without. Jobs on a cluster
(`--master k8s://...`) keep the JVM's defaults."""


def spark_session(
    master: str = "local[*]", app: str = "capstan", spark_log: Path | None = None
) -> Any:
    """A SparkSession whose Python workers import capstan (local mode runs them from here).
    With `spark_log`, the JVM that starts here writes its output (log4j's lines, Spark's
    warnings, its Python workers' stderr) to that file, not to this terminal."""
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
        builder = builder.config("spark.driver.extraJavaOptions", LOCAL_JVM_OPTIONS)
    if spark_log is None:
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
        return session
    with _output_to(spark_log):
        session = builder.getOrCreate()  # the JVM inherits the file as stdout and stderr
    session.sparkContext.setLogLevel("WARN")
    return session


@contextlib.contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """This process's stdout and stderr go to `path` while inside, so that a child started
    meanwhile keeps writing there; they come back here after."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, target):
            os.close(fd)
