"""Fault injection at scale: the invariant checks shared by the chaos tests and the
randomized campaign of `eo chaos`."""
