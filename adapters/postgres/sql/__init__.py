"""The SQL of the PostgreSQL transactional store, one module per concern: an attempt's reads
and registrations (`attempt`), the single path's commit and clear (`writes`), the sweeper's and
gauges' statements (`upkeep`) and the batched token path's (`batch`). Every optimistic write
is one statement.

Data-modifying CTEs run in one snapshot and all-or-nothing: `FROM tr` makes the dependent
writes happen only when the guarded update of the transaction record matched.
"""
