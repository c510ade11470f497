"""Adapters to the process's own facilities: the clock, ID generation, structured logging."""
