-- The reads of each consumer's clock (clock.rs): which consumers have inbox rows, what they
-- committed, and which rebuilds are paused. Read by `projector inbox prune` and status.

-- name: facts
-- Every consumer with inbox rows, in the inbox or in the inbox before V0009: each key leads
-- with the consumer and is walked one consumer at a time (one index probe each, however many
-- rows a consumer has), with its rebuild's pause and its committed partitions.
WITH RECURSIVE inboxed(consumer) AS (
    (SELECT consumer FROM projector.inbox ORDER BY consumer LIMIT 1)
    UNION ALL
    SELECT (SELECT i.consumer FROM projector.inbox i WHERE i.consumer > c.consumer
            ORDER BY i.consumer LIMIT 1)
    FROM inboxed c WHERE c.consumer IS NOT NULL),
legacy(consumer) AS (
    (SELECT consumer FROM projector.inbox_legacy ORDER BY consumer LIMIT 1)
    UNION ALL
    SELECT (SELECT i.consumer FROM projector.inbox_legacy i WHERE i.consumer > c.consumer
            ORDER BY i.consumer LIMIT 1)
    FROM legacy c WHERE c.consumer IS NOT NULL),
every(consumer) AS (
    SELECT consumer::text FROM inboxed WHERE consumer IS NOT NULL
    UNION SELECT consumer::text FROM legacy WHERE consumer IS NOT NULL)
SELECT c.consumer,
       EXISTS (SELECT 1 FROM projector.rebuilds r WHERE r.consumer = c.consumer
               AND r.paused AND r.phase IN ('seeding', 'tailing')),
       o.topic, o.partition, o.next_offset, o.updated_at
FROM every c LEFT JOIN projector.offsets o ON o.consumer = c.consumer
ORDER BY 1, 3, 4

-- name: paused
-- The consumers whose rebuild is paused now.
SELECT consumer FROM projector.rebuilds
WHERE paused AND phase IN ('seeding', 'tailing')
