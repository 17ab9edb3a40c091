-- judgequeue 0011: a queue belongs to one JudgeQueue (docs/gitops.md, "One owner per queue").
--
-- Git is the truth for a queue's flags, so exactly one JudgeQueue may hold them: two JudgeQueues
-- naming the same queue (another namespace, or another cluster, with the same database) would each
-- restore their own flags over the other's. The operator records the owner here when it first
-- reconciles a queue and refuses any other claimant; a deleted JudgeQueue releases it. The column
-- is NULL for a queue no JudgeQueue owns (created by the CLI, `judgequeue local` or a migration of
-- an older release), which the first JudgeQueue to reconcile it claims.
--
-- Changing the owner is not a flag change: the trigger leaves config_version alone.
ALTER TABLE judgequeue.queues
    ADD COLUMN owner text CHECK (owner IS NULL OR length(owner) BETWEEN 1 AND 512);
