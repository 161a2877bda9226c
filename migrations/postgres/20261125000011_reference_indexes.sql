-- Deleting a branch (retention) checks that no call row and no branch
-- refers to it. Those checks need indexes led by the referring columns:
-- the index on calls of migration 2 is led by tenant_id, and the first
-- migration's index on parent_id covers active branches only. Every reader
-- of a branch's calls names the branch, and finding a branch's active
-- children works as well on an index of every branch's parent, so both are
-- replaced rather than added to.
--
-- Building an index blocks writes to its table while it is built. On a
-- large database, build the two new ones beforehand with
-- `CREATE INDEX CONCURRENTLY` and these names; the statements below then
-- skip them.
CREATE INDEX IF NOT EXISTS branch_calls_by_branch_id ON branch_calls (branch_id, called_at);
DROP INDEX IF EXISTS branch_calls_by_branch;
CREATE INDEX IF NOT EXISTS branches_by_parent_id ON branches (parent_id);
DROP INDEX IF EXISTS branches_by_parent;
