"""Every migration since the first version, applied in version order by ``judgequeue migrate``.

Each takes a database from the previous version to the next; a change is written here as a new
file and in ``core/sql/schema.sql``, which a new database is given instead (``core/migrate.py``).
The files are frozen: a database records each one's checksum, so an applied file is never edited
(``tests/integration/test_schema.py`` checks every text main ever shipped under a number).
"""
