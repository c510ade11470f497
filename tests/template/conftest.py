"""The template test's fixture (`fixture/`) is the code a user adds to a new service: it is
copied into the services the test makes, and never collected here (its imports name modules,
`domain.parcels`, that only exist there)."""

collect_ignore_glob = ["fixture/*"]
