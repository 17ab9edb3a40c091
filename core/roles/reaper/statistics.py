"""Table statistics on a new database: ANALYZE the tables direct intake's take reads once they have
rows (:func:`judgequeue.core.store.outbox.analyze_new_tables`); nothing once both are analysed."""

from __future__ import annotations

import logging

from ...store import outbox
from ...transport.connect import STATEMENT_TIMEOUT
from .loop import Context, Maintainer

log = logging.getLogger("judgequeue.reaper")


class Statistics(Maintainer):
    name = "analyse"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        #: Tables this process has analysed once; a role that does not own them gets only a warning and
        #: no statistics, so it must not try again every sweep.
        self.analysed: set[str] = set()

    async def run(self) -> list[str]:
        if len(self.analysed) == 2:
            return []
        async with self.ctx.pool.acquire(timeout=STATEMENT_TIMEOUT) as conn:
            analysed = await outbox.analyze_new_tables(conn, skip=self.analysed)
        self.analysed.update(analysed)
        if analysed:
            log.info("analysed tables that had no statistics", extra={"tables": analysed})
        return analysed
