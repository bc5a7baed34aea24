"""A PySpark session in local mode for the tests of spark/, shared by a module's tests."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from capstan.spark.capstan_source import CapstanDataSource


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
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
