"""Judge plugins (entry-point group ``judgequeue.judges``)."""
