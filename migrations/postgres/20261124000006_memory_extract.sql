-- Lessons kept from agents' returns (`extract_memory: true` on
-- `branch_return`), queued on the branch itself: the statement that ends the
-- branch sets `extract = 'pending'`, so the request is written with the
-- return, in the same transaction, and only by the return that ended the
-- branch (a second return of it changes nothing). One replica at a time takes
-- an entry, until `extract_until`; another takes it over after that. The
-- entry goes with its branch: deleting the branch deletes it. NULL: not asked.
ALTER TABLE branches ADD COLUMN extract TEXT CHECK (extract IN ('pending', 'done', 'failed'));
ALTER TABLE branches ADD COLUMN extract_until TIMESTAMPTZ;
ALTER TABLE branches ADD COLUMN extract_attempts INTEGER NOT NULL DEFAULT 0
    CHECK (extract_attempts >= 0);
CREATE INDEX branches_extract ON branches (completed_at) WHERE extract = 'pending';

-- What distilling a gateway-run branch's lessons cost, on its run: the model
-- calls of distillation and the tokens they were billed, apart from the
-- run's own (`model_calls`, `input_tokens`, `output_tokens`). A tenant's
-- model usage is the sum of both.
ALTER TABLE branch_runs ADD COLUMN distill_calls INTEGER NOT NULL DEFAULT 0
    CHECK (distill_calls >= 0);
ALTER TABLE branch_runs ADD COLUMN distill_input_tokens BIGINT NOT NULL DEFAULT 0
    CHECK (distill_input_tokens >= 0);
ALTER TABLE branch_runs ADD COLUMN distill_output_tokens BIGINT NOT NULL DEFAULT 0
    CHECK (distill_output_tokens >= 0);
