"""The template's tools: `eo demo`, `eo chaos`, `eo bench`, `eo pipeline`, loaded lazily by
the `eo` command. Not part of the service: no module of the framework or the service imports
them, their dependencies are optional groups (`demo`, `pipeline`), and the production image
leaves them out. The demo, the chaos campaign and the pipeline drive the sample (TPC-H
orders); `eo bench` has an endpoint of its own."""
