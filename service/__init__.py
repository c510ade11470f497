"""The service: its endpoints, declared in `service/registry.py` (the module you edit)."""
