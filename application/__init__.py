"""Application layer: the consistent-messaging protocol, written against ports."""
