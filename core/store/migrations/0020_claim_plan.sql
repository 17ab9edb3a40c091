-- A class's share counts jobs, not claims. claim_order() put a class with a share first in that
-- share of the claims, at random per claim: a claim of 20 rows that drew the class took 20 of it,
-- the next 20 none, so over a few hundred claims the shares of jobs drifted (10% came out 6.4-8.0%
-- in bench.priority). claim_plan() gives each class with a share its share of every claim's rows,
-- rounded by one draw for all classes (systematic sampling: each class gets n*share/100 rows on
-- average, at most one row off, and together never more than n), then walks every class in rank
-- order for the rest. A claim of one row still draws the class with probability share/100.
-- claim_order() stays for the statements of roles of an earlier version until they are replaced.
CREATE FUNCTION judgequeue.claim_plan(p_shares smallint[], p_limit integer)
RETURNS TABLE (rank smallint, quota integer, skip integer)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_draw float8;
    v_sum integer := 0;
    v_before integer := 0;
    v_upto integer;
    v_quotas integer[];
BEGIN
    IF cardinality(p_shares) = 1 THEN
        rank := 0; quota := p_limit; skip := 0;
        RETURN NEXT;
        RETURN;
    END IF;
    v_draw := random();
    v_quotas := array_fill(0, ARRAY[cardinality(p_shares)]);
    FOR i IN 1 .. cardinality(p_shares) LOOP
        v_sum := v_sum + p_shares[i];
        v_upto := floor(p_limit * v_sum / 100.0 + v_draw)::integer;
        v_quotas[i] := v_upto - v_before;
        v_before := v_upto;
        IF v_quotas[i] > 0 THEN
            rank := i - 1; quota := v_quotas[i]; skip := 0;
            RETURN NEXT;
        END IF;
    END LOOP;
    -- The rest by rank; a class already visited skips the rows its share took (its own locks).
    FOR i IN 1 .. cardinality(p_shares) LOOP
        rank := i - 1; quota := p_limit; skip := v_quotas[i];
        RETURN NEXT;
    END LOOP;
END $$;
