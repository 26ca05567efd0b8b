"""feed-router's schema migrations, one ``NNNN_name.py`` file each (see :mod:`router.migrate`).

This folder stays at the top of the repository and is installed as ``router.migrations``
(``pyproject.toml`` maps it), so an installed wheel migrates with no environment variable.
"""
