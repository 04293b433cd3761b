-- The statements of `projector reconcile` (reconcile.rs) of its own. The sums per window
-- wrap the operator's queries and are composed in reconcile.rs.

-- name: utc
-- The sums are read in UTC: a `date` or `timestamp` column is read as UTC whatever the
-- server's time zone.
SET LOCAL TIME ZONE 'UTC'

-- name: compare
-- The comparison itself, numeric arithmetic in PostgreSQL (exact at any scale): the source's
-- sums ($1 window, $2 measure, $3 value as text) against the view's ($4, $5, $6), the
-- windows and measures where they differ by more than $7 (a fraction as text) of the
-- source's, with the relative difference.
WITH s(w, m, v) AS (SELECT * FROM unnest($1::timestamptz[], $2::text[], $3::text[]::numeric[])),
     d(w, m, v) AS (SELECT * FROM unnest($4::timestamptz[], $5::text[], $6::text[]::numeric[])),
     j AS (SELECT coalesce(s.w, d.w) AS w, coalesce(s.m, d.m) AS m,
                  coalesce(s.v, 0) AS sv, coalesce(d.v, 0) AS dv
           FROM s FULL JOIN d ON s.w = d.w AND s.m = d.m)
SELECT w, m, sv::text, dv::text,
       CASE WHEN sv = 0 THEN NULL ELSE round(abs(dv - sv) / abs(sv), 6)::text END
FROM j WHERE abs(dv - sv) > $7::text::numeric * abs(sv) ORDER BY w, m
