"""NSQ for Spark: the "nsq" format (Spark 4 Python Data Source API; needs pyspark and pyarrow).

::

    from transports.spark import register
    register(spark)
    df.write.format("nsq").option("nsqd", "h1:4150,h2:4150").option("topic", "t").save()
    spark.readStream.format("nsq").option("lookupd", "http://h:4161") \\
        .option("topic", "t").option("channel", "spark").load()

See docs/spark.md.
"""

from __future__ import annotations

from typing import Any

from ._options import NSQOptionError, ReadOptions, WriteOptions
from .datasource import NSQDataSource
from .reader import SOURCE_SCHEMA, NSQDataLossError, NSQStreamReader
from .writer import NSQCommitMessage, NSQPublishError

__all__ = [
    "SOURCE_SCHEMA",
    "NSQCommitMessage",
    "NSQDataLossError",
    "NSQDataSource",
    "NSQOptionError",
    "NSQPublishError",
    "NSQStreamReader",
    "ReadOptions",
    "WriteOptions",
    "register",
]


def register(spark: Any) -> None:
    """Register the "nsq" format with a SparkSession (once per session)."""
    spark.dataSource.register(NSQDataSource)
