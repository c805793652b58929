"""Acceptance rules: exact candidate tests, relaxations (LANTERN, LANTERN++) and the authors' reference rule."""
