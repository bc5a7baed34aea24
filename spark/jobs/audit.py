"""spark-submit entry point of the offset audit: `audit.py --server HOST:PORT [...]`
(spark/audit.py); exit status 1 when it finds a problem. The master comes from
spark-submit."""

import sys

from capstan.spark.audit import main

if __name__ == "__main__":
    sys.exit(main())
