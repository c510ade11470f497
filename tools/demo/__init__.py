"""Demo entrypoints: sample input generated from TPC-H."""
