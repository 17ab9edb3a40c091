-- judgequeue 0008: PRESENTATION_ERROR is a verdict of its own. Only a custom checker gives it
-- (testlib's exit code 2: the answer is right but not laid out as the problem asks); the built-in
-- checkers never do, so problems without a custom checker never see it.
ALTER TABLE judgequeue.submissions DROP CONSTRAINT submissions_status_check;
ALTER TABLE judgequeue.submissions ADD CONSTRAINT submissions_status_check CHECK (status IN (
    'PENDING', 'JUDGING', 'ACCEPTED', 'WRONG_ANSWER', 'TIME_LIMIT', 'MEMORY_LIMIT', 'OUTPUT_LIMIT',
    'IDLENESS_LIMIT', 'RUNTIME_ERROR', 'COMPILE_ERROR', 'PRESENTATION_ERROR', 'SYSTEM_ERROR'));
