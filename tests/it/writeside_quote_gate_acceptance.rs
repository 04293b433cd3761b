//! When the quote gate's "accepted" holds: an order is checked against the symbol's quote once
//! its key is claimed, and this file looks at what happens between that check and the order's
//! commit, and between the quote a client priced its order from and the one the gate checked.
//! The feed is the test's own socket, which answers pings and subscribes and sends exactly the
//! datagrams each test names, so every quote and every gap is the test's; every wait is on the
//! gate's signal or on PostgreSQL's lock table, never a sleep.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use projector_devkit::writeside::quotes::wire::Datagram;
use projector_devkit::writeside::quotes::{
    FeedConfig, FeedMode, FeedSymbol, Limits, LocalClock, QuoteGate, Quotes, ReceiverConfig,
    Refusal,
};
use projector_devkit::writeside::{Order, Outcome, Side, WriteSide, WriteSideError};
use projector_engine::testkit::TestDb;
use projector_engine::Registry;
use rust_decimal::Decimal;
use tokio::net::UdpSocket;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const SYMBOL: &str = "EURUSD";
/// Longest a test waits for a change; it fails then.
const WAIT: Duration = Duration::from_secs(60);

/// A feed driven by hand: answers `ping` with its clock (ours: no skew) and remembers where the
/// gate subscribed from; the test sends the market datagrams.
struct HandFeed {
    socket: Arc<UdpSocket>,
    addr: SocketAddr,
    gate: watch::Receiver<Option<SocketAddr>>,
    clock: LocalClock,
    stop: CancellationToken,
}

impl HandFeed {
    async fn start() -> Self {
        let socket = Arc::new(UdpSocket::bind("127.0.0.1:0").await.expect("bind"));
        let addr = socket.local_addr().expect("address");
        let (tx, gate) = watch::channel(None);
        let clock = LocalClock::start();
        let stop = CancellationToken::new();
        {
            let (socket, stop) = (socket.clone(), stop.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 2048];
                loop {
                    let (n, from) = tokio::select! {
                        () = stop.cancelled() => return,
                        r = socket.recv_from(&mut buf) => match r { Ok(r) => r, Err(_) => continue },
                    };
                    match Datagram::decode(&buf[..n]) {
                        Ok(Datagram::Ping { id }) => {
                            let pong = Datagram::Pong {
                                id,
                                feed_ms: clock.now(),
                            };
                            let _ = socket.send_to(&pong.encode(), from).await;
                        }
                        Ok(Datagram::Subscribe { .. }) => {
                            let _ = tx.send(Some(from));
                        }
                        _ => {}
                    }
                }
            });
        }
        Self {
            socket,
            addr,
            gate,
            clock,
            stop,
        }
    }

    async fn send(&self, datagram: Datagram) {
        let mut gate = self.gate.clone();
        let to = *gate
            .wait_for(Option::is_some)
            .await
            .expect("the feed task runs");
        let to = to.expect("subscribed");
        self.socket
            .send_to(&datagram.encode(), to)
            .await
            .expect("send to the gate");
    }

    async fn snapshot(&self, seq: i64, bid: &str, ask: &str) {
        self.send(Datagram::Snapshot {
            symbol: SYMBOL.to_owned(),
            seq,
            bid: dec(bid),
            ask: dec(ask),
            source_ms: self.clock.now(),
        })
        .await;
    }

    async fn tick(&self, seq: i64, bid: &str, ask: &str) {
        self.send(Datagram::Tick {
            symbol: SYMBOL.to_owned(),
            seq,
            bid: Some(dec(bid)),
            ask: Some(dec(ask)),
            source_ms: self.clock.now(),
        })
        .await;
    }

    async fn heartbeat(&self, next_seq: i64) {
        self.send(Datagram::Heartbeat {
            symbol: SYMBOL.to_owned(),
            next_seq,
        })
        .await;
    }
}

impl Drop for HandFeed {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn dec(text: &str) -> Decimal {
    text.parse().expect("a decimal")
}

fn buy(price: Decimal) -> Order {
    Order {
        symbol: SYMBOL.to_owned(),
        side: Side::Buy,
        qty: dec("10"),
        price,
    }
}

/// The gate of a full feed over [`SYMBOL`] reading `feed`, with `limits`.
async fn gate_on(feed: &HandFeed, limits: Limits) -> Quotes {
    Quotes::start(
        Some(feed.addr),
        FeedConfig::faultless(FeedSymbol::traded()),
        ReceiverConfig::new(FeedMode::Full, limits, vec![SYMBOL.to_owned()]),
    )
    .await
    .expect("the gate's receiver")
}

async fn until(gate: &QuoteGate, what: &str, wanted: impl Fn(&Result<Decimal, Refusal>) -> bool) {
    let waited = tokio::time::timeout(
        WAIT,
        gate.wait_until(|g, now| {
            wanted(
                &g.check(SYMBOL, now)
                    .map(|q| q.ask.unwrap_or(Decimal::NEGATIVE_ONE)),
            )
        }),
    )
    .await;
    assert!(
        waited.is_ok(),
        "timed out waiting for {what}: {:?}",
        gate.check(SYMBOL)
    );
}

/// The check runs right after the key is claimed, before the ledger bumps the account's
/// counter row; that bump waits for any other transaction of the account (a hot account, a
/// slow commit), for as long as it takes. The order is then committed on a check made before
/// the wait, however stale the quote has gone since: docs/write-side.md calls that window "a
/// few milliseconds".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_is_not_accepted_on_a_quote_that_went_stale_while_it_waited_for_its_account() {
    let db = TestDb::new(&Registry::new()).await;
    let feed = HandFeed::start().await;
    let limits = Limits {
        stale_after_ms: 1000,
        source_stale_after_ms: 600_000,
    };
    let quotes = gate_on(&feed, limits).await;
    let gate = quotes.gate().clone();
    let write_side = WriteSide::new(projector_engine::db::pool(db.url(), 4).expect("pool"))
        .await
        .expect("write side")
        .with_quotes(gate.clone());
    let intake = write_side.intake();
    let pool = write_side.pool().clone();
    feed.snapshot(0, "1.08418", "1.08422").await;
    feed.tick(1, "1.08420", "1.08424").await;
    until(&gate, "a usable quote", Result::is_ok).await;
    // Gap-free heartbeats keep the quote alive until the test stops them.
    let beating = CancellationToken::new();
    let pump = {
        let beating = beating.clone();
        let feed = &feed;
        async move {
            let mut every = tokio::time::interval(Duration::from_millis(100));
            loop {
                tokio::select! {
                    () = beating.cancelled() => std::future::pending::<()>().await,
                    _ = every.tick() => feed.heartbeat(2).await,
                }
            }
        }
    };

    let scenario = async {
        let first = intake
            .place(3, "first", buy(dec("1.08424")))
            .await
            .expect("accepted");
        assert!(first.is_accepted(), "{first:?}");

        // Another transaction of account 3 holds its counter row.
        let mut holder = pool.get().await.expect("connection");
        let held = holder.transaction().await.expect("begin");
        held.query(
            "SELECT last_seq FROM account_seq WHERE account_id = 3 FOR UPDATE",
            &[],
        )
        .await
        .expect("lock the counter row");

        let waiting = {
            let intake = intake.clone();
            tokio::spawn(async move { intake.place(3, "waiting", buy(dec("1.08424"))).await })
        };
        // Checked and claimed, now queued behind the row lock.
        let observer = pool.get().await.expect("connection");
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let queued: i64 = observer
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                     AND wait_event_type = 'Lock'",
                    &[],
                )
                .await
                .expect("pg_stat_activity")
                .get(0);
            if queued > 0 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the order never queued on the account's row"
            );
            tokio::task::yield_now().await;
        }

        // The feed goes silent; the gate refuses any order on the symbol now.
        beating.cancel();
        until(&gate, "a stale quote", |r| {
            matches!(r, Err(Refusal::StaleQuote { .. }))
        })
        .await;
        held.rollback().await.expect("release the row");

        let answer = waiting.await.expect("task");
        assert!(
            matches!(answer, Err(WriteSideError::QuoteRefused(_))),
            "committed while its quote was stale: {answer:?} (now: {:?})",
            gate.check(SYMBOL)
        );
        let events: i64 = observer
            .query_one("SELECT count(*) FROM writeside.events", &[])
            .await
            .expect("count")
            .get(0);
        assert_eq!(events, 1, "only the first order was written");
    };
    tokio::select! {
        () = scenario => {}
        _ = pump => unreachable!("the heartbeats run until the scenario ends"),
    }
    quotes.stop().await.expect("stopped");
}

/// The gate checks the symbol and throws the quote it checked away: the fill is at the price
/// the order carries. The simulated clients price their orders from `Intake::quote`, the quote
/// "accepted or not", before they place them; a quote read while the symbol was suspect (or
/// stale) and placed once the next tick healed it fills at the suspect price, which the gate
/// never vouched for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_priced_on_a_quote_the_gate_refused_does_not_fill_at_that_price() {
    let db = TestDb::new(&Registry::new()).await;
    let feed = HandFeed::start().await;
    // Wide thresholds: only suspicion matters here.
    let limits = Limits {
        stale_after_ms: 600_000,
        source_stale_after_ms: 600_000,
    };
    let quotes = gate_on(&feed, limits).await;
    let gate = quotes.gate().clone();
    let write_side = WriteSide::new(projector_engine::db::pool(db.url(), 4).expect("pool"))
        .await
        .expect("write side")
        .with_quotes(gate.clone());
    let intake = write_side.intake();

    feed.snapshot(0, "1.08418", "1.08422").await;
    feed.tick(1, "1.08420", "1.08424").await;
    until(&gate, "the quote of tick 1", |r| r == &Ok(dec("1.08424"))).await;
    // Ticks 2 to 4 are lost: the heartbeat shows it, the symbol is suspect.
    feed.heartbeat(5).await;
    until(&gate, "a suspect quote", |r| {
        matches!(r, Err(Refusal::Suspect { .. }))
    })
    .await;
    // A client prices its buy off the quote as it stands, the way the load generator does.
    let priced = intake
        .quote(SYMBOL)
        .and_then(|q| q.ask)
        .expect("a quote to price from");
    assert_eq!(priced, dec("1.08424"));
    // Tick 5 heals the full feed at a new price before the order arrives.
    feed.tick(5, "1.08490", "1.08500").await;
    until(&gate, "the quote of tick 5", |r| r == &Ok(dec("1.08500"))).await;

    let answer = intake.place(4, "priced-while-suspect", buy(priced)).await;
    if let Ok(outcome) = &answer {
        let price: String = write_side
            .pool()
            .get()
            .await
            .expect("connection")
            .query_one(
                "SELECT payload::jsonb -> 'data' ->> 'price' FROM writeside.events WHERE event_id = $1",
                &[&outcome.reply().event_id],
            )
            .await
            .expect("the fill")
            .get(0);
        assert_eq!(
            dec(&price),
            dec("1.08500"),
            "filled at the price of a suspect quote, not of the quote the gate accepted"
        );
    }
    quotes.stop().await.expect("stopped");
}

/// Waits until some statement of the test's database waits on a lock.
async fn until_a_statement_waits_on_a_lock(observer: &tokio_postgres::Client, what: &str) {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let queued: i64 = observer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .expect("pg_stat_activity")
            .get(0);
        if queued > 0 {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{what} never queued");
        tokio::task::yield_now().await;
    }
}

/// The last check runs with everything written, right before the commit: an order held up
/// after its account's lock (here by a position row another transaction holds) and whose quote
/// goes stale meanwhile is refused, and the refusal leaves nothing but itself: the seq goes
/// back (the next order takes it, no gap), no event, outbox row or position move, and a retry
/// gets the same refusal. The next order fills at the quote, whatever price it carries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_refused_right_before_its_commit_leaves_only_its_refusal() {
    let db = TestDb::new(&Registry::new()).await;
    let feed = HandFeed::start().await;
    let limits = Limits {
        stale_after_ms: 1000,
        source_stale_after_ms: 600_000,
    };
    let quotes = gate_on(&feed, limits).await;
    let gate = quotes.gate().clone();
    let write_side = WriteSide::new(projector_engine::db::pool(db.url(), 4).expect("pool"))
        .await
        .expect("write side")
        .with_quotes(gate.clone());
    let intake = write_side.intake();
    let pool = write_side.pool().clone();
    feed.snapshot(0, "1.08418", "1.08422").await;
    feed.tick(1, "1.08420", "1.08424").await;
    until(&gate, "a usable quote", Result::is_ok).await;
    let beating = CancellationToken::new();
    let pump = {
        let beating = beating.clone();
        let feed = &feed;
        async move {
            let mut every = tokio::time::interval(Duration::from_millis(100));
            loop {
                tokio::select! {
                    () = beating.cancelled() => std::future::pending::<()>().await,
                    _ = every.tick() => feed.heartbeat(2).await,
                }
            }
        }
    };

    let scenario = async {
        let first = intake
            .place(5, "first", buy(dec("1")))
            .await
            .expect("accepted");
        assert_eq!(first.reply().price, Some(dec("1.08424")), "at the ask");

        let mut holder = pool.get().await.expect("connection");
        let held = holder.transaction().await.expect("begin");
        held.query(
            "SELECT 1 FROM public.positions WHERE account_id = 5 AND symbol = 'EURUSD' FOR UPDATE",
            &[],
        )
        .await
        .expect("lock the position row");
        let waiting = {
            let intake = intake.clone();
            tokio::spawn(async move { intake.place(5, "held", buy(dec("1.08424"))).await })
        };
        let observer = pool.get().await.expect("connection");
        // Past its account's lock and the check after it, queued on the position.
        until_a_statement_waits_on_a_lock(&observer, "the order's position move").await;
        beating.cancel();
        until(&gate, "a stale quote", |r| {
            matches!(r, Err(Refusal::StaleQuote { .. }))
        })
        .await;
        held.rollback().await.expect("release the row");

        let answer = waiting.await.expect("task");
        let Err(WriteSideError::QuoteRefused(refused)) = answer else {
            panic!("committed while its quote was stale: {answer:?}");
        };
        assert_eq!(refused.refusal.reason(), "stale_quote");
        let count = |sql: &'static str| {
            let observer = &observer;
            async move {
                let n: i64 = observer.query_one(sql, &[]).await.expect(sql).get(0);
                n
            }
        };
        assert_eq!(count("SELECT count(*) FROM writeside.events").await, 1);
        assert_eq!(count("SELECT count(*) FROM writeside.outbox").await, 1);
        assert_eq!(
            count("SELECT last_seq FROM public.account_seq WHERE account_id = 5").await,
            1,
            "the seq went back"
        );
        let net: Decimal = observer
            .query_one(
                "SELECT net_qty FROM public.positions WHERE account_id = 5 AND symbol = 'EURUSD'",
                &[],
            )
            .await
            .expect("position")
            .get(0);
        assert_eq!(net, dec("10"), "the first order's only");
        let stored: serde_json::Value = observer
            .query_one(
                "SELECT reply FROM writeside.idempotency_keys WHERE account_id = 5 AND key = 'held'",
                &[],
            )
            .await
            .expect("the key")
            .get(0);
        assert_eq!(stored["refused"]["reason"], "stale_quote", "{stored}");

        // The feed heals; the retry still gets the first answer.
        feed.tick(2, "1.08430", "1.08436").await;
        until(&gate, "the quote of tick 2", |r| r == &Ok(dec("1.08436"))).await;
        let retried = intake.place(5, "held", buy(dec("1.08424"))).await;
        assert!(
            matches!(&retried, Err(WriteSideError::QuoteRefused(r)) if *r == refused),
            "{retried:?}"
        );
        // A sell priced far off fills at the bid, at the seq the refusal gave back.
        let sell = Order {
            side: Side::Sell,
            ..buy(dec("999"))
        };
        let third = intake
            .place(5, "third", sell.clone())
            .await
            .expect("accepted");
        assert!(third.is_accepted(), "{third:?}");
        assert_eq!(
            (third.reply().seq, third.reply().price),
            (2, Some(dec("1.08430")))
        );
        // Its retry reads the reply back, fill price and all, once the quote has moved on.
        feed.tick(3, "1.08440", "1.08446").await;
        until(&gate, "the quote of tick 3", |r| r == &Ok(dec("1.08446"))).await;
        let again = intake.place(5, "third", sell).await.expect("replayed");
        assert_eq!(again, Outcome::Replayed(third.reply().clone()));
        let price: String = observer
            .query_one(
                "SELECT payload::jsonb -> 'data' ->> 'price' FROM writeside.events WHERE event_id = $1",
                &[&third.reply().event_id],
            )
            .await
            .expect("the fill")
            .get(0);
        assert_eq!(price, "1.08430");
    };
    tokio::select! {
        () = scenario => {}
        _ = pump => unreachable!("the heartbeats run until the scenario ends"),
    }
    quotes.stop().await.expect("stopped");
}
