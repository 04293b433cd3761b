-- Operations: what `projector status`, the health endpoint and the Prometheus gauges read.

-- Duplicates by what caught them, per partition, exact like the other counters: the offset
-- update adds each batch's counts (`Counts::dup_seq`, ...) in the batch's transaction, and
-- `duplicates` stays their sum. The duplicate counter is a sensor: a jump of `inbox`
-- duplicates says "a producer or a rebalance is redelivering", a jump of `watermark` ones
-- says "a rebuild overlaps its snapshot", and an operator needs to tell them apart.
--
-- Rows committed before the engine wrote these columns count their duplicates in
-- `duplicates` only; status shows the difference as `unattributed`. Adding a column with a
-- constant default rewrites nothing (PostgreSQL 11 and later), so this is instant on a
-- large table.
ALTER TABLE projector.offsets
    ADD COLUMN dup_seq            bigint NOT NULL DEFAULT 0,
    ADD COLUMN dup_watermark      bigint NOT NULL DEFAULT 0,
    ADD COLUMN dup_inbox          bigint NOT NULL DEFAULT 0,
    ADD COLUMN dup_version_filter bigint NOT NULL DEFAULT 0;

-- Status lists each version's parked accounts oldest first; the primary key leads with the
-- consumer, and this keeps the listing an index scan however many accounts are parked.
CREATE INDEX parked_accounts_age ON projector.parked_accounts (consumer, parked_at, account_id);
