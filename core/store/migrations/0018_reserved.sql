-- Number reserved for a change developed beside this branch; replaced by that migration when both merge.
SELECT 1;
