"""turngym environments inside other trainers, each behind its own optional extra.

- ``turngym.integrations.trl``: ``environment_factory`` and ``task_dataset`` for TRL's
  ``GRPOTrainer`` (``pip install "turngym[trl]"``).
- ``turngym.integrations.openenv``: an OpenEnv server and client (``turngym openenv ENV_ID``;
  ``pip install "turngym[openenv]"``).
- ``turngym.integrations.skyrl``: every turngym id registered in ``skyrl_gym``'s registry as a
  ``BaseTextEnv`` (``pip install "turngym[skyrl]"``).

This package imports none of them: ``import turngym`` never loads TRL, OpenEnv or SkyRL.
"""
