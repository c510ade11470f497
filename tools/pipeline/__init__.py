"""The data pipeline on Apache Spark (PySpark): boundary ingest, the exactly-once audit, the
orphan sweep and their benchmark (`eo pipeline ...`)."""
