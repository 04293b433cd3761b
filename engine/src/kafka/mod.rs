//! Kafka: the source that feeds the apply path. The producer side and a local broker for
//! development and tests are in the `projector-devkit` crate.

pub mod source;
