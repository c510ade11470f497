"""Entrypoints: settings, logging, the composition root, and the processes they run."""
