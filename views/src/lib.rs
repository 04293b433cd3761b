//! projector's built-in views, and the registry that makes adding one a single line.
//!
//! A view is a [`Projection`](projector_engine::Projection): data, not code that runs per
//! event. It hands the engine its DDL and one set-based statement; the engine wraps that
//! statement in the inbox guard and runs it per batch (or per round, for order-dependent
//! views). Each view keeps every statement it runs in one `.sql` file beside its module, under
//! `-- name: <name>` headers, with the reasons in SQL comments.
//!
//! # Layout
//!
//! - [`portfolio`]: per account and symbol, net quantity, average price, realized P&L.
//!   Order-dependent; inbox and version filter.
//! - [`risk`]: per account, gross and net exposure, open positions, the largest position.
//!   Order-dependent; two tables, so inbox only.
//! - [`eod`]: per account and UTC trading day, trade and cash sums. Order-independent;
//!   inbox.
//! - [`events`]: the built-in event types (`fill_executed`, `fill_busted`, `cash_adjusted`)
//!   and the rules of their data, which the built-in views apply; [`events::decode`] for their
//!   producers.
//! - [`upcast`]: the built-in upcasters, `fill_executed` and `fill_busted` from version 1 to
//!   2, which every built-in view reads through.
//! - [`previous`]: the views as earlier releases wrote them, where this code keeps their
//!   results (their fingerprints are what the views replace).
//! - [`registry`]: version 1 of each, one line per view.
//! - [`guide`]: `docs/writing-a-view.md`, compiled here so that its example is a test.
//!
//! The semantics of each view, its tables, stable read names and snapshot contract are in
//! `docs/views.md`.

pub mod eod;
pub mod events;
pub mod portfolio;
pub mod previous;
pub mod risk;
pub mod upcast;

use projector_engine::{Registry, ViewError};

pub use eod::Eod;
pub use portfolio::Portfolio;
pub use risk::Risk;
pub use upcast::upcasters;

/// The views compiled into this binary, at the versions they run live. A new view is one
/// more `register` line.
pub fn registry() -> Result<Registry, ViewError> {
    Registry::new()
        .register(Portfolio::new(1))?
        .register(Risk::new(1))?
        .register(Eod::new(1))
}

/// The guide to writing a view, `docs/writing-a-view.md`, included as documentation so that
/// `cargo test -p projector-views --doc` compiles and runs its example against PostgreSQL:
/// the guide cannot show code that does not work.
#[doc = include_str!("../../docs/writing-a-view.md")]
pub mod guide {}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fingerprints the code that applied portfolio in rounds recorded (read off that
    /// code): a version it registered keeps running now that portfolio folds each account's
    /// run, which writes the same rows and notices.
    #[test]
    fn portfolio_replaces_the_code_in_rounds() {
        use projector_engine::fingerprint::of;
        use projector_engine::Projection;
        for (version, fingerprint) in [(1, "de6b3a38958569c9"), (2, "3af4d516969cb1b7")] {
            let rounds = previous::PortfolioInRounds::new(version);
            assert_eq!(
                of(&rounds),
                fingerprint,
                "v{version}: the code in rounds is kept"
            );
            let view = Portfolio::new(version);
            assert_eq!(view.replaces()[1], fingerprint, "v{version}");
            assert_ne!(of(&view), fingerprint, "v{version}: the code did change");
        }
    }

    /// The fingerprints the running versions of the built-in views recorded (read off the
    /// code before their tables came from the DDL and `SqlFile` moved to the engine): the
    /// same code by every input of the fingerprint, so a version it registered keeps
    /// running without a `replaces`.
    #[test]
    fn the_built_in_views_keep_their_fingerprints() {
        use projector_engine::fingerprint::of;
        assert_eq!(of(&Portfolio::new(1)), "12f19c5ba1b0a249");
        assert_eq!(of(&Risk::new(1)), "8e1e7d7c4d8f6328");
        assert_eq!(of(&Eod::new(1)), "c2e00e99ceca933e");
        assert_eq!(of(&Portfolio::new(2)), "eabb2520907bb9c3");
        assert_eq!(of(&Risk::new(2)), "ddeccd28b14d15b7");
        assert_eq!(of(&Eod::new(2)), "e79967a49b5dd95b");
    }

    #[test]
    fn the_registry_holds_version_1_of_each_view() {
        let registry = registry().expect("the built-in views register");
        let consumers: Vec<String> = registry.all().iter().map(|v| v.consumer()).collect();
        assert_eq!(consumers, ["portfolio_v1", "risk_v1", "eod_v1"]);
    }

    /// The fingerprints the code before event versions recorded for version 1 of each view
    /// (read off that code): upgrading a database whose versions it registered keeps them
    /// running, because each view declares its predecessor's.
    #[test]
    fn each_view_replaces_the_code_before_event_versions() {
        use projector_engine::fingerprint::of;
        use projector_engine::Projection;
        let recorded = [
            ("portfolio", 1, "f39e3925d944b281"),
            ("risk", 1, "196bfdb27d85fc69"),
            ("eod", 1, "c85df8f559e345a3"),
            ("portfolio", 2, "a03a17a3a03525dc"),
            ("risk", 2, "4faeb35706f4432c"),
            ("eod", 2, "8ce7c232a4b1c04f"),
        ];
        for (name, version, fingerprint) in recorded {
            let view: Box<dyn Projection> = match name {
                "portfolio" => Box::new(Portfolio::new(version)),
                "risk" => Box::new(Risk::new(version)),
                _ => Box::new(Eod::new(version)),
            };
            assert_eq!(view.replaces()[0], fingerprint, "{name} v{version}");
            assert_ne!(
                of(&*view),
                fingerprint,
                "{name} v{version}: the code did change"
            );
        }
    }
}
