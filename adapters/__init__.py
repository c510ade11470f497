"""Adapters: one package per technology, each implementing application ports."""
