"""spark-submit entry point of the compaction job: `compact.py TOPIC --server HOST:PORT`
(spark/compaction.py). The master comes from spark-submit."""

import sys

from capstan.spark.compaction import main

if __name__ == "__main__":
    sys.exit(main())
