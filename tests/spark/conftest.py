"""A PySpark session in local mode for the tests of spark/, shared by a module's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from tests.spark.local_session import local_spark


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    with local_spark() as session:
        yield session
