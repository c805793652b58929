"""Assets: the registry of every file a preset reads (``conf/assets/``), fetching with pins and a lock file,
and the check a run makes before any work. ``scripts/fetch.py`` is the command line; docs/assets.md the table."""
