"""Versioned SQL migrations after the baseline, applied in file-name order by ``judgequeue migrate``.

Each takes a database from the previous version to the next; the same change is written in
``core/sql/schema.sql``, which a new database is given instead (``core/migrate.py``).
"""
