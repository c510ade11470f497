"""What keeps the tools (demo, chaos campaign, bench) away from production's services."""

from __future__ import annotations

import os

from entrypoints.settings import SettingsError


def refuse_production(command: str) -> None:
    """Raise `SettingsError` when the environment sets `EO_PROFILE=production`: `command`
    (the demo, the chaos campaign, the bench) drops databases, deletes queues and empties
    buckets of its own, and its override to the local profile must never aim that at
    production's services."""
    profile = next((v for k, v in os.environ.items() if k.upper() == "EO_PROFILE"), "")
    if profile.strip().lower() == "production":
        raise SettingsError(f"invalid setting EO_PROFILE: `eo {command}` refuses the production "
                            "profile (it drops and re-creates databases, queues and buckets "
                            "of its own); unset EO_PROFILE, or run it on a machine of its own")
