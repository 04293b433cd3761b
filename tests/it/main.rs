//! The integration tests, in one binary so that CI links once: against real PostgreSQL (a
//! database per test) and, for the Kafka tests, librdkafka's mock cluster, or the external
//! broker of `PROJECTOR_TEST_BROKERS` for those that need no fault injection
//! (`support::broker`, `tests/tansu.sh`).

mod bench_smoke;
mod cli;
mod demo;
mod engine_arbitrary;
mod engine_conflicts;
mod engine_conformance;
mod engine_fencing;
mod engine_hardening;
mod engine_metrics;
mod engine_migrate;
mod engine_parking;
mod engine_poison;
mod engine_pool;
mod engine_schedules;
mod examples_custom_views;
mod kafka_drains;
mod kafka_faults;
mod kafka_fencing_after_a_timeout;
mod kafka_hardening;
mod kafka_partitioner;
mod kafka_process;
mod kafka_publish;
mod kafka_source;
mod kafka_supervisor;
mod nothing_left_out;
mod ops_logs;
mod ops_metrics;
mod ops_prune;
mod ops_reconcile;
mod ops_repairs;
mod ops_repairs_during_a_drop;
mod ops_retry_into_waiting;
mod ops_status;
mod rebuild;
mod rebuild_notices;
mod rebuild_tail_blocked;
mod review_borrowed_passes;
mod review_fast_inbox;
mod review_fast_inbox_unordered;
mod review_holes;
mod review_holes_rebuild;
mod review_incremental_risk;
mod review_risk_fold;
mod review_round2;
mod review_round3;
mod review_round4;
mod review_round5;
mod support;
mod version_code_adoption;
mod views_conformance;
mod views_golden;
mod writeside;
mod writeside_quote_gate;
