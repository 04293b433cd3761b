//! Tools for development, demos, benchmarks and tests; nothing here runs in production
//! except the publisher behind `projector publish`.
//!
//! The engine (`projector-engine`) only consumes. What produces events or stands in for a
//! Kafka cluster lives here, so that the engine carries no `unsafe` code and no direct
//! `rdkafka-sys` dependency.
//!
//! # Layout
//!
//! - [`devbroker`]: librdkafka's mock cluster as a Kafka-protocol broker in the process
//!   (`projector dev-broker`, the tests, the bench), with fault injection, and reading a
//!   topic back. Holds this crate's one `unsafe` call.
//! - [`partitioner`]: the partition an account's events land on, exactly as Apache Kafka's
//!   Java producer computes it.
//! - [`pgcluster`]: a throwaway PostgreSQL cluster made with the binaries on the machine,
//!   reachable through a private Unix socket only, removed on drop (`projector demo`).
//! - [`publish`]: JSON lines in, one Kafka message per event, keyed and partitioned like the
//!   Java client (`projector publish`).
//! - [`writeside`]: a write side that makes the events: idempotent request intake, one
//!   transaction per event (seq counter row, positions, event, outbox), an outbox relay that
//!   crashes on purpose, and simulated clients with hot accounts (`projector simulate`).
//! - [`reconcile`]: every built-in view against the write side, row by row (`projector demo`).
//! - [`demo`]: the rest of what `projector demo` runs in PostgreSQL: its database made afresh,
//!   and what it reads of the engine's tables (offsets and counters, dead letters, parked
//!   accounts, what a view shows of an account).

pub mod demo;
pub mod devbroker;
pub mod partitioner;
pub mod pgcluster;
pub mod publish;
pub mod reconcile;
pub mod writeside;
