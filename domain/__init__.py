"""Pure domain layer: messages, state, deterministic handlers and their decisions."""
