"""A PySpark session in local mode on 127.0.0.1, for tests that run Spark in-process."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import SparkSession

from capstan.spark.capstan_source import CapstanDataSource


@contextmanager
def local_spark() -> Iterator[SparkSession]:
    """Started once for the files that follow one another on a worker (the `spark` fixture,
    tests/worker_shared.py): the JVM's start is most of a short job's time (18 s alone on
    the 2-core machine)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable  # Python workers import capstan from here
    session = (
        SparkSession.builder.master("local[2]")
        .appName("capstan-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    session.dataSource.register(CapstanDataSource)
    try:
        yield session
    finally:
        session.stop()
