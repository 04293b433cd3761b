-- Storage choices for the hot path, each measured (docs/benchmarks.md).
--
-- Progress rows and offset rows are updated by every batch; room on their pages keeps those
-- updates HOT (no new index entries). Applies to pages written from now on.
ALTER TABLE projector.account_progress SET (fillfactor = 80);
ALTER TABLE projector.offsets SET (fillfactor = 50);
