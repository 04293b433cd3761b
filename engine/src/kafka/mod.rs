//! Kafka: the source that feeds the apply path, the producer side, and a local broker for
//! development and tests.

pub mod devbroker;
pub mod partitioner;
pub mod publish;
pub mod source;
