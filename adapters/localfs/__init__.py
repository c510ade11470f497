"""Adapters on the local filesystem: the embedded profile's blob store."""
