//! The line of [`Figures::json`].

use serde::Serialize;
use serde_json::value::RawValue;

use super::Figures;
use crate::numbers::{millis, ratio, ratio2};

/// `projector bench --json`. Key names and order are those of the first version; decimals
/// (ratios, milliseconds) are written as JSON numbers from their exact text, never through
/// floating point.
#[derive(Serialize)]
struct Json<'a> {
    naive_eps: u64,
    engine_eps: u64,
    engine_all_views_eps: u64,
    ceiling_eps: u64,
    catch_up_eps: u64,
    p50_ms: Box<RawValue>,
    p99_ms: Box<RawValue>,
    engine_over_naive: Box<RawValue>,
    engine_over_ceiling: Box<RawValue>,
    catch_up_over_engine: Box<RawValue>,
    max_latency_ms: Box<RawValue>,
    events: u64,
    accounts: i64,
    partitions: i32,
    naive_events: u64,
    latency_events: u64,
    latency_rate: u64,
    // Added with the all-views ceiling, the full-inbox and the rebuild phases.
    ceiling_all_views_eps: u64,
    engine_full_inbox_eps: u64,
    rebuild_eps: u64,
    all_views_over_ceiling_all_views: Box<RawValue>,
    full_inbox_over_engine: Box<RawValue>,
    rebuild_over_ceiling: Box<RawValue>,
    rebuild_over_engine: Box<RawValue>,
    inbox_rows: u64,
    rebuild_live_events: u64,
    rebuild_live_p50_ms: Box<RawValue>,
    rebuild_live_p99_ms: Box<RawValue>,
    rebuild_live_max_ms: Box<RawValue>,
    rebuild_under_live_eps: u64,
    rebuild_command_ms: u64,
    // Added with read-your-writes (issue 27): the notifier's cost and write to readable.
    engine_no_notify_eps: u64,
    notify_over_no_notify: Box<RawValue>,
    ryw_waits: u64,
    ryw_p50_ms: Box<RawValue>,
    ryw_p99_ms: Box<RawValue>,
    // Added with the full-page image counts: what a large inbox costs depends on them.
    server_settings: &'a str,
    engine_wal_fpi: Option<u64>,
    full_inbox_wal_fpi: Option<u64>,
    // Added with the inbox by days: a day's prune while a paced feed runs.
    prune_ms: Box<RawValue>,
    prune_rows: u64,
    prune_live_events: u64,
    prune_live_p99_ms: Box<RawValue>,
    build: &'static str,
    postgres: &'a str,
    rounds: Rounds<'a>,
}

/// Every round's figure of the repeated phases.
#[derive(Serialize)]
struct Rounds<'a> {
    engine_eps: &'a [u64],
    ceiling_eps: &'a [u64],
    catch_up_eps: &'a [u64],
    rebuild_eps: &'a [u64],
    all_views_eps: &'a [u64],
    ceiling_all_views_eps: &'a [u64],
}

/// A decimal's text as a JSON number. The texts come from `ratio`, `ratio2` and `millis`,
/// digits with one point, always a valid number.
fn number(text: String) -> Box<RawValue> {
    RawValue::from_string(text).expect("a decimal's text is a JSON number")
}

pub(super) fn json(f: &Figures) -> String {
    let samples = |i: usize| f.samples.get(i).map_or(&[][..], Vec::as_slice);
    let json = Json {
        naive_eps: f.naive_eps,
        engine_eps: f.engine_eps,
        engine_all_views_eps: f.engine_all_views_eps,
        ceiling_eps: f.ceiling_eps,
        catch_up_eps: f.catch_up_eps,
        p50_ms: number(millis(f.p50)),
        p99_ms: number(millis(f.p99)),
        engine_over_naive: number(ratio(f.engine_eps, f.naive_eps)),
        engine_over_ceiling: number(ratio2(f.engine_eps, f.ceiling_eps)),
        catch_up_over_engine: number(ratio2(f.catch_up_eps, f.engine_eps)),
        max_latency_ms: number(millis(f.max)),
        events: f.events,
        accounts: f.accounts,
        partitions: f.partitions,
        naive_events: f.naive_events,
        latency_events: f.latency_events,
        latency_rate: f.latency_rate,
        ceiling_all_views_eps: f.ceiling_all_views_eps,
        engine_full_inbox_eps: f.engine_full_inbox_eps,
        rebuild_eps: f.rebuild_eps,
        all_views_over_ceiling_all_views: number(ratio2(
            f.engine_all_views_eps,
            f.ceiling_all_views_eps,
        )),
        full_inbox_over_engine: number(ratio2(f.engine_full_inbox_eps, f.engine_eps)),
        rebuild_over_ceiling: number(ratio2(f.rebuild_eps, f.ceiling_eps)),
        rebuild_over_engine: number(ratio2(f.rebuild_eps, f.engine_eps)),
        inbox_rows: f.inbox_rows,
        rebuild_live_events: f.rebuild_live_events,
        rebuild_live_p50_ms: number(millis(f.rebuild_live_p50)),
        rebuild_live_p99_ms: number(millis(f.rebuild_live_p99)),
        rebuild_live_max_ms: number(millis(f.rebuild_live_max)),
        rebuild_under_live_eps: f.rebuild_loaded_eps,
        rebuild_command_ms: u64::try_from(f.rebuild_command.as_millis()).unwrap_or(u64::MAX),
        engine_no_notify_eps: f.engine_no_notify_eps,
        notify_over_no_notify: number(ratio2(f.engine_eps, f.engine_no_notify_eps)),
        ryw_waits: f.ryw_waits,
        ryw_p50_ms: number(millis(f.ryw_p50)),
        ryw_p99_ms: number(millis(f.ryw_p99)),
        server_settings: &f.settings,
        engine_wal_fpi: f.engine_wal_fpi,
        full_inbox_wal_fpi: f.full_inbox_wal_fpi,
        prune_ms: number(millis(f.prune)),
        prune_rows: f.prune_rows,
        prune_live_events: f.prune_live_events,
        prune_live_p99_ms: number(millis(f.prune_live_p99)),
        build: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        postgres: &f.server,
        rounds: Rounds {
            engine_eps: samples(0),
            ceiling_eps: samples(1),
            catch_up_eps: samples(2),
            rebuild_eps: samples(3),
            all_views_eps: samples(4),
            ceiling_all_views_eps: samples(5),
        },
    };
    // Integers, strings and valid raw numbers only: serialization cannot fail.
    serde_json::to_string(&json).expect("the figures serialize")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_json_keys_and_numbers() {
        let f = Figures {
            events: 2000,
            accounts: 50,
            partitions: 4,
            naive_eps: 10,
            engine_eps: 25,
            ceiling_eps: 50,
            catch_up_eps: 30,
            p50: Duration::from_micros(12_345),
            server: "16.4 \"x\"".to_owned(),
            samples: vec![
                vec![25, 20],
                vec![50],
                vec![30],
                vec![45],
                vec![30, 28],
                vec![40],
            ],
            ceiling_all_views_eps: 40,
            engine_all_views_eps: 30,
            rebuild_eps: 45,
            settings: "max_wal_size 1GB".to_owned(),
            full_inbox_wal_fpi: Some(1300),
            prune: Duration::from_millis(250),
            prune_rows: 2_857_143,
            prune_live_events: 2000,
            prune_live_p99: Duration::from_micros(7_300),
            ..Figures::default()
        };
        let text = json(&f);
        assert!(
            text.starts_with(
                r#"{"naive_eps":10,"engine_eps":25,"engine_all_views_eps":30,"ceiling_eps":50,"catch_up_eps":30,"p50_ms":12.4,"p99_ms":0.0,"engine_over_naive":2.5,"engine_over_ceiling":0.50,"catch_up_over_engine":1.20,"max_latency_ms":0.0,"events":2000,"accounts":50,"partitions":4,"#
            ),
            "{text}"
        );
        assert!(
            text.ends_with(
                r#""postgres":"16.4 \"x\"","rounds":{"engine_eps":[25,20],"ceiling_eps":[50],"catch_up_eps":[30],"rebuild_eps":[45],"all_views_eps":[30,28],"ceiling_all_views_eps":[40]}}"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#""ceiling_all_views_eps":40,"engine_full_inbox_eps":0,"rebuild_eps":45,"all_views_over_ceiling_all_views":0.75,"full_inbox_over_engine":0.00,"rebuild_over_ceiling":0.90,"rebuild_over_engine":1.80,"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#""server_settings":"max_wal_size 1GB","engine_wal_fpi":null,"full_inbox_wal_fpi":1300,"prune_ms":250.0,"prune_rows":2857143,"prune_live_events":2000,"prune_live_p99_ms":7.3,"build":"#
            ),
            "{text}"
        );
    }
}
