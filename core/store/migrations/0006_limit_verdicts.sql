-- judgequeue 0006: OUTPUT_LIMIT and IDLENESS_LIMIT are verdicts of their own (the program judge
-- decides them from facts: the worker cut the output; the wall guard stopped a program that
-- slept with CPU to spare), as the design's status list says.
ALTER TABLE judgequeue.submissions DROP CONSTRAINT submissions_status_check;
ALTER TABLE judgequeue.submissions ADD CONSTRAINT submissions_status_check CHECK (status IN (
    'PENDING', 'JUDGING', 'ACCEPTED', 'WRONG_ANSWER', 'TIME_LIMIT', 'MEMORY_LIMIT', 'OUTPUT_LIMIT',
    'IDLENESS_LIMIT', 'RUNTIME_ERROR', 'COMPILE_ERROR', 'SYSTEM_ERROR'));
