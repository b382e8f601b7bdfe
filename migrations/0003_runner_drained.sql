-- A draining runner that has finished its in-flight work reports `drained`: the operator can
-- see at a glance that it is safe to stop. Enums are text + CHECK (see 0001), so adding a
-- state is replacing the CHECK.
ALTER TABLE runners DROP CONSTRAINT runners_state_check;
ALTER TABLE runners ADD CONSTRAINT runners_state_check
    CHECK (state IN ('active', 'cordoned', 'draining', 'drained', 'yielded', 'dead'));
