//! Simulated clients: requests at a given rate over many accounts, a few of them much busier
//! than the rest, with the client behaviour the intake must survive.
//!
//! Each client, for each request it makes:
//!
//! - picks an account: with [`LoadConfig::hot_traffic_percent`] chance one of the hot accounts
//!   (the first [`LoadConfig::hot_percent`] percent of the ids), else one of the others; an
//!   account's events all go to one partition, so a hot account makes a hot partition;
//! - picks what to do: a bust of one of the account's earlier fills that is not busted yet
//!   ([`LoadConfig::bust_percent`]), a cash movement ([`LoadConfig::cash_percent`]), or an order:
//!   random, or (one in [`LoadConfig::close_percent`]) the exact opposite of the account's
//!   position, which closes it; priced at the quote's ask (buy) or bid (sell) as it stands
//!   when the intake has a quote gate (a quote the gate may refuse: the fill is then at the
//!   quote the gate accepts, not at this price), else at a random price near the symbol's;
//! - makes a fresh idempotency key for it (once per logical request, as seed 000 says);
//! - sends it, and with [`LoadConfig::retry_percent`] chance sends it again under the same key,
//!   as a client that lost the reply would: half the time after the first reply came back,
//!   half the time at the same moment as the first (two racing requests, one fill);
//! - with [`LoadConfig::misuse_percent`] chance also reuses its last key for a different
//!   request, a client bug the intake must refuse.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rust_decimal::Decimal;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::counters::add;
use super::error::WriteSideError;
use super::intake::{Intake, Outcome};
use super::ledger::{Command, Order, Side};
use projector_engine::rng::Rng;

/// Symbols the clients trade (and the built-in quote feed quotes): name, a price around which
/// they trade in units of 10^-scale, and that scale.
pub const SYMBOLS: [(&str, i64, u32); 4] = [
    ("EURUSD", 108_420, 5),
    ("GBPUSD", 126_310, 5),
    ("USDJPY", 151_234, 3),
    ("XAUUSD", 265_012, 2),
];

/// Unbusted fills remembered per account; older ones are forgotten (never busted).
const REMEMBERED_FILLS: usize = 64;

/// How the simulated clients behave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadConfig {
    /// Accounts `1..=accounts`.
    pub accounts: i64,
    /// Requests per second over all clients (retries not counted); `None`: as fast as the
    /// clients go.
    pub rate: Option<u32>,
    /// Clients sending at once.
    pub clients: usize,
    /// Stop after this many requests (retries not counted); `None`: until stopped.
    pub max_requests: Option<u64>,
    /// Seed of the clients' dice; client *i* uses `seed + i`.
    pub seed: u64,
    /// Percent of requests sent again under the same key.
    pub retry_percent: u8,
    /// Percent of the accounts that are hot.
    pub hot_percent: u8,
    /// Percent of the requests that go to the hot accounts.
    pub hot_traffic_percent: u8,
    /// Percent of the requests that bust an earlier fill of the account.
    pub bust_percent: u8,
    /// Percent of the requests that move cash.
    pub cash_percent: u8,
    /// Percent of the requests after which the client reuses its key for another request.
    pub misuse_percent: u8,
    /// Percent of the orders that close the account's position in the symbol exactly.
    pub close_percent: u8,
}

impl LoadConfig {
    /// `accounts` accounts, 5% of them making 50% of the requests, 8 clients, unthrottled,
    /// 5% retries, 3% busts, 5% cash movements, 1% key misuse, 10% exact closes.
    pub fn new(accounts: i64) -> Self {
        Self {
            accounts,
            rate: None,
            clients: 8,
            max_requests: None,
            seed: 1,
            retry_percent: 5,
            hot_percent: 5,
            hot_traffic_percent: 50,
            bust_percent: 3,
            cash_percent: 5,
            misuse_percent: 1,
            close_percent: 10,
        }
    }

    /// Refuses values out of range, with a message that names the setting.
    pub fn check(&self) -> Result<(), WriteSideError> {
        let bad = |m: String| Err(WriteSideError::InvalidConfig(m));
        if self.accounts < 1 {
            return bad(format!(
                "at least one account is needed, got {}",
                self.accounts
            ));
        }
        if self.rate == Some(0) {
            return bad("the rate must be at least 1 request per second".to_owned());
        }
        if self.clients == 0 {
            return bad("at least one client is needed".to_owned());
        }
        for (name, value) in [
            ("retry percent", self.retry_percent),
            ("hot percent", self.hot_percent),
            ("hot traffic percent", self.hot_traffic_percent),
            ("bust percent", self.bust_percent),
            ("cash percent", self.cash_percent),
            ("misuse percent", self.misuse_percent),
            ("close percent", self.close_percent),
        ] {
            if value > 100 {
                return bad(format!("the {name} must be 0 to 100, got {value}"));
            }
        }
        if u16::from(self.bust_percent) + u16::from(self.cash_percent) > 100 {
            return bad("the bust and cash percents add up to more than 100".to_owned());
        }
        Ok(())
    }

    /// How many accounts are hot: `hot_percent` of them, rounded up, at least one when
    /// `hot_percent` is not 0.
    pub fn hot_accounts(&self) -> i64 {
        let n = (self.accounts * i64::from(self.hot_percent) + 99) / 100;
        n.clamp(0, self.accounts.max(0))
    }

    /// Whether `account_id` is one of the hot accounts (the lowest ids).
    pub fn is_hot(&self, account_id: i64) -> bool {
        (1..=self.hot_accounts()).contains(&account_id)
    }

    /// Picks the account of the next request.
    fn pick_account(&self, rng: &mut Rng) -> i64 {
        let hot = self.hot_accounts();
        let cold = self.accounts - hot;
        let to_hot = hot > 0 && (cold == 0 || rng.chance(usize::from(self.hot_traffic_percent)));
        if to_hot {
            1 + rng.int(hot)
        } else {
            hot + 1 + rng.int(cold)
        }
    }
}

/// What the clients share: the fills they may bust, and the request numbers.
struct Shared {
    intake: Intake,
    config: LoadConfig,
    /// Unbusted fills per account. A fill is taken out before its bust is sent, so two clients
    /// never bust the same fill (the intake would refuse the second anyway).
    fills: Mutex<HashMap<i64, Vec<String>>>,
    /// The next request number; request *n* is due `n / rate` seconds after the start.
    tickets: AtomicU64,
    /// Makes this run's keys differ from an earlier run's against the same database.
    run: String,
    start: Instant,
}

/// Runs `config.clients` clients until `stop` is cancelled or `config.max_requests` requests
/// were made. The first failure that is not a refusal stops every client and is returned.
pub async fn run(
    intake: Intake,
    config: &LoadConfig,
    stop: CancellationToken,
) -> Result<(), WriteSideError> {
    config.check()?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let shared = Arc::new(Shared {
        intake,
        config: config.clone(),
        fills: Mutex::new(HashMap::new()),
        tickets: AtomicU64::new(0),
        run: format!(
            "{:x}",
            Rng::new(config.seed ^ nanos as u64).next_u64() >> 24
        ),
        start: Instant::now(),
    });
    // Stops the other clients when one fails.
    let local = stop.child_token();
    let mut clients = JoinSet::new();
    for i in 0..config.clients {
        let shared = Arc::clone(&shared);
        let stop = local.clone();
        clients.spawn(async move { client(&shared, i, &stop).await });
    }
    let mut first_error = None;
    while let Some(joined) = clients.join_next().await {
        let result = joined.unwrap_or_else(|e| {
            Err(WriteSideError::InvalidConfig(format!(
                "a client task ended abnormally: {e}"
            )))
        });
        if let Err(e) = result {
            local.cancel();
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// The most recent request a client made that was accepted, for its key misuse.
struct Last {
    account_id: i64,
    key: String,
    command: Command,
}

async fn client(
    shared: &Shared,
    index: usize,
    stop: &CancellationToken,
) -> Result<(), WriteSideError> {
    let config = &shared.config;
    let mut rng = Rng::new(config.seed.wrapping_add(index as u64));
    let mut last: Option<Last> = None;
    loop {
        if stop.is_cancelled() {
            return Ok(());
        }
        let n = shared.tickets.fetch_add(1, Ordering::Relaxed);
        if config.max_requests.is_some_and(|max| n >= max) {
            return Ok(());
        }
        if let Some(rate) = config.rate {
            let due = shared.start
                + Duration::from_nanos(n.saturating_mul(1_000_000_000) / u64::from(rate));
            tokio::select! {
                () = tokio::time::sleep_until(due) => {}
                () = stop.cancelled() => return Ok(()),
            }
        }
        let account_id = config.pick_account(&mut rng);
        let command = next_command(shared, &mut rng, account_id).await?;
        let key = format!("{}-{index}-{n}", shared.run);
        let retry = rng.chance(usize::from(config.retry_percent));
        let race = retry && rng.chance(50);
        let outcome = if race {
            // Two attempts at once, as a client that timed out and resent while the first was
            // still in flight: one fill, one replay.
            shared.intake.counters.retry();
            let (a, b) = tokio::join!(
                send(shared, account_id, &key, &command),
                send(shared, account_id, &key, &command)
            );
            match (a?, b?) {
                (Some(a), Some(b)) => Some(if a.is_accepted() { a } else { b }),
                (a, b) => a.or(b),
            }
        } else {
            let first = send(shared, account_id, &key, &command).await?;
            if retry {
                shared.intake.counters.retry();
                send(shared, account_id, &key, &command).await?;
            }
            first
        };
        if let Some(outcome) = outcome {
            if let (Command::Order(_), Outcome::Accepted(reply)) = (&command, &outcome) {
                remember_fill(shared, account_id, reply.event_id.clone());
            }
            last = Some(Last {
                account_id,
                key,
                command,
            });
        }
        if let Some(l) = &last {
            if rng.chance(usize::from(config.misuse_percent)) {
                // The same key, another body: must be refused, not answered with the first
                // request's reply.
                let other = changed(&l.command);
                send(shared, l.account_id, &l.key, &other).await?;
            }
        }
    }
}

/// Sends one request; a refusal is an answer (counted by the intake), not a failure.
async fn send(
    shared: &Shared,
    account_id: i64,
    key: &str,
    command: &Command,
) -> Result<Option<Outcome>, WriteSideError> {
    if shared.config.is_hot(account_id) {
        add(&shared.intake.counters.hot_requests, 1);
    }
    match shared.intake.submit(account_id, key, command).await {
        Ok(outcome) => Ok(Some(outcome)),
        Err(e) if e.is_refusal() => {
            tracing::debug!(error = %e, "request refused");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

fn remember_fill(shared: &Shared, account_id: i64, event_id: String) {
    let mut fills = shared
        .fills
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let list = fills.entry(account_id).or_default();
    if list.len() >= REMEMBERED_FILLS {
        list.remove(0);
    }
    list.push(event_id);
}

fn take_fill(shared: &Shared, rng: &mut Rng, account_id: i64) -> Option<String> {
    let mut fills = shared
        .fills
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let list = fills.get_mut(&account_id)?;
    if list.is_empty() {
        return None;
    }
    let i = rng.below(list.len());
    Some(list.swap_remove(i))
}

async fn next_command(
    shared: &Shared,
    rng: &mut Rng,
    account_id: i64,
) -> Result<Command, WriteSideError> {
    let config = &shared.config;
    let roll = rng.below(100);
    if roll < usize::from(config.bust_percent) {
        if let Some(fill_event_id) = take_fill(shared, rng, account_id) {
            return Ok(Command::Bust { fill_event_id });
        }
    } else if roll < usize::from(config.bust_percent) + usize::from(config.cash_percent) {
        let cents = 1 + rng.int(1_000_000);
        let deposit = rng.chance(50);
        return Ok(Command::Cash {
            amount: Decimal::new(if deposit { cents } else { -cents }, 2),
            reason: if deposit { "deposit" } else { "withdrawal" }.to_owned(),
        });
    }
    let (symbol, base, scale) = SYMBOLS[rng.below(SYMBOLS.len())];
    let random = Decimal::new(base + rng.int(2001) - 1000, scale);
    // Priced off the feed when there is one: a buy at the ask, a sell at the bid, as quoted now,
    // the way a screen shows a price. The gate decides whether the order may trade, and at
    // which quote.
    let priced = |side: Side| {
        let quote = shared.intake.quote(symbol);
        let quoted = quote.and_then(|q| match side {
            Side::Buy => q.ask,
            Side::Sell => q.bid,
        });
        quoted.filter(|p| !p.is_sign_negative()).unwrap_or(random)
    };
    if rng.chance(usize::from(config.close_percent)) {
        let q = shared.intake.net_qty(account_id, symbol).await?;
        if !q.is_zero() {
            let side = if q.is_sign_negative() {
                Side::Buy
            } else {
                Side::Sell
            };
            return Ok(Command::Order(Order {
                symbol: symbol.to_owned(),
                side,
                qty: q.abs(),
                price: priced(side),
            }));
        }
    }
    // 0.01 to 10000 lots, with 0 to 2 decimal places.
    let places = u32::try_from(rng.below(3)).unwrap_or(0);
    let qty = Decimal::new(1 + rng.int(10_000), places);
    let side = if rng.chance(50) {
        Side::Buy
    } else {
        Side::Sell
    };
    Ok(Command::Order(Order {
        symbol: symbol.to_owned(),
        side,
        qty,
        price: priced(side),
    }))
}

/// Another request than `command`, for key misuse.
fn changed(command: &Command) -> Command {
    match command {
        Command::Order(o) => Command::Order(Order {
            qty: o.qty + Decimal::ONE,
            ..o.clone()
        }),
        Command::Bust { fill_event_id } => Command::Bust {
            fill_event_id: format!("{fill_event_id}-other"),
        },
        Command::Cash { amount, reason } => Command::Cash {
            amount: *amount * Decimal::TWO,
            reason: reason.clone(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hot_accounts_take_their_share() {
        let config = LoadConfig::new(100);
        assert_eq!(config.hot_accounts(), 5);
        assert!(config.is_hot(1) && config.is_hot(5) && !config.is_hot(6));
        let mut rng = Rng::new(3);
        let picks: Vec<i64> = (0..10_000).map(|_| config.pick_account(&mut rng)).collect();
        assert!(picks.iter().all(|a| (1..=100).contains(a)));
        let hot = picks.iter().filter(|&&a| config.is_hot(a)).count();
        assert!(
            (4_700..5_300).contains(&hot),
            "{hot} of 10000 to 5 hot accounts"
        );
        // Every cold account is reachable.
        let mut seen: Vec<i64> = picks.clone();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 100);
    }

    #[test]
    fn hot_accounts_round_up_and_degenerate_cleanly() {
        let mut c = LoadConfig::new(3);
        assert_eq!(c.hot_accounts(), 1, "5% of 3 accounts rounds up to one");
        c.hot_percent = 0;
        assert_eq!(c.hot_accounts(), 0);
        let mut rng = Rng::new(1);
        assert!((0..100).all(|_| (1..=3).contains(&c.pick_account(&mut rng))));
        c.hot_percent = 100;
        assert_eq!(c.hot_accounts(), 3);
        assert!((0..100).all(|_| (1..=3).contains(&c.pick_account(&mut rng))));
    }

    #[test]
    fn configurations_out_of_range_are_refused_by_name() {
        assert!(LoadConfig::new(10).check().is_ok());
        type Change = fn(&mut LoadConfig);
        let cases: [(Change, &str); 5] = [
            (|c| c.accounts = 0, "account"),
            (|c| c.rate = Some(0), "rate"),
            (|c| c.retry_percent = 101, "retry percent"),
            (|c| c.clients = 0, "client"),
            (
                |c| {
                    c.bust_percent = 60;
                    c.cash_percent = 50;
                },
                "bust and cash",
            ),
        ];
        for (change, needle) in cases {
            let mut c = LoadConfig::new(10);
            change(&mut c);
            let e = c.check().expect_err(needle).to_string();
            assert!(e.contains(needle), "{e}");
        }
    }

    #[test]
    fn misuse_changes_the_request() {
        let order = Command::Order(Order {
            symbol: "EURUSD".to_owned(),
            side: Side::Buy,
            qty: Decimal::new(3, 0),
            price: Decimal::new(108_420, 5),
        });
        assert_ne!(changed(&order).canonical(), order.canonical());
    }
}
