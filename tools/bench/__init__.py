"""`eo bench`: at-least-once baseline, outbox path and token path side by side."""
