"""The sample's TPC-H data (generated offline with DuckDB) and its oracle: shared by the demo,
the chaos campaign, the pipeline and the sample's tests."""
