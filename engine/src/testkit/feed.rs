use deadpool_postgres::Client;

use crate::apply::{Applier, ApplyError, Batch, BatchOutcome};
use crate::event::Message;

/// One event as a test writes it; `payload()` gives the wire bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventSpec {
    /// Unique per logical event.
    pub event_id: String,
    /// Event type.
    pub event_type: String,
    /// The envelope's `type_version`; `None` leaves it out (version 1).
    pub type_version: Option<i32>,
    /// Account (and message key).
    pub account_id: i64,
    /// Per-account sequence.
    pub seq: i64,
    /// RFC 3339 time.
    pub occurred_at: String,
    /// The `data` object, as JSON.
    pub data: serde_json::Value,
}

impl EventSpec {
    /// An event of any type.
    pub fn new(
        event_type: &str,
        account_id: i64,
        seq: i64,
        occurred_at: &str,
        data: serde_json::Value,
    ) -> Self {
        Self {
            event_id: format!("{event_type}-{account_id}-{seq}"),
            event_type: event_type.to_owned(),
            type_version: None,
            account_id,
            seq,
            occurred_at: occurred_at.to_owned(),
            data,
        }
    }

    /// Replaces the event id.
    pub fn with_id(mut self, event_id: &str) -> Self {
        self.event_id = event_id.to_owned();
        self
    }

    /// Sets the envelope's `type_version`.
    pub fn with_version(mut self, version: i32) -> Self {
        self.type_version = Some(version);
        self
    }

    /// The version of its type the event is at: its `type_version`, 1 when absent.
    pub fn version(&self) -> i32 {
        self.type_version.unwrap_or(1)
    }

    /// The JSON envelope.
    pub fn payload(&self) -> Vec<u8> {
        let mut envelope = serde_json::json!({
            "event_id": self.event_id,
            "type": self.event_type,
            "account_id": self.account_id,
            "seq": self.seq,
            "occurred_at": self.occurred_at,
            "data": self.data,
        });
        if let (Some(v), Some(map)) = (self.type_version, envelope.as_object_mut()) {
            map.insert("type_version".to_owned(), v.into());
        }
        envelope.to_string().into_bytes()
    }

    /// The same event brought to the versions `upcasters` read (the view's): what the write
    /// side would have published had it been at those versions. An event at those versions
    /// already, or of a type they do not read at another, comes back as it is.
    pub fn upcast(&self, upcasters: &crate::upcast::Upcasters) -> Result<Self, String> {
        let mut event = crate::event::decode_envelope(&Message::new(0, None, self.payload()))
            .map_err(|e| e.to_string())?;
        if event.type_version >= upcasters.reads(&event.event_type) {
            return Ok(self.clone());
        }
        upcasters.upcast(&mut event).map_err(|e| e.to_string())?;
        let data = serde_json::from_str(&event.data).map_err(|e| e.to_string())?;
        let mut out = self.clone();
        out.type_version = Some(event.type_version);
        out.data = data;
        Ok(out)
    }

    /// The message key: the account id in decimal.
    pub fn key(&self) -> Vec<u8> {
        self.account_id.to_string().into_bytes()
    }
}

/// A `fill_executed` event; decimals are given as strings.
#[allow(clippy::too_many_arguments)]
pub fn fill(
    account_id: i64,
    seq: i64,
    at: &str,
    symbol: &str,
    side: &str,
    qty: &str,
    price: &str,
    fee: &str,
) -> EventSpec {
    EventSpec::new(
        "fill_executed",
        account_id,
        seq,
        at,
        serde_json::json!({"symbol": symbol, "side": side, "qty": qty, "price": price, "fee": fee}),
    )
}

/// A `fill_executed` event at version 2: `qty` signed, positive buys, negative sells, no
/// side.
pub fn fill_v2(
    account_id: i64,
    seq: i64,
    at: &str,
    symbol: &str,
    qty: &str,
    price: &str,
    fee: &str,
) -> EventSpec {
    EventSpec::new(
        "fill_executed",
        account_id,
        seq,
        at,
        serde_json::json!({"symbol": symbol, "qty": qty, "price": price, "fee": fee}),
    )
    .with_version(2)
}

/// A `fill_busted` event reversing `original`, which must be a fill: at the fill's version,
/// with its symbol, side (version 1) or signed quantity (version 2), and price.
pub fn bust(original: &EventSpec, seq: i64, at: &str) -> EventSpec {
    let d = &original.data;
    let data = if original.version() >= 2 {
        serde_json::json!({
            "fill_event_id": original.event_id,
            "symbol": d["symbol"], "qty": d["qty"], "price": d["price"],
        })
    } else {
        serde_json::json!({
            "fill_event_id": original.event_id,
            "symbol": d["symbol"], "side": d["side"], "qty": d["qty"], "price": d["price"],
        })
    };
    let bust = EventSpec::new("fill_busted", original.account_id, seq, at, data);
    match original.type_version {
        Some(v) => bust.with_version(v),
        None => bust,
    }
}

/// A `cash_adjusted` event.
pub fn cash(account_id: i64, seq: i64, at: &str, amount: &str, reason: &str) -> EventSpec {
    EventSpec::new(
        "cash_adjusted",
        account_id,
        seq,
        at,
        serde_json::json!({"amount": amount, "reason": reason}),
    )
}

/// A simulated partition: a log of messages whose offsets are their indexes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// Topic name.
    pub topic: String,
    /// Partition number.
    pub partition: i32,
    /// The log.
    pub log: Vec<Message>,
}

impl Partition {
    /// An empty log.
    pub fn new(topic: &str, partition: i32) -> Self {
        Self {
            topic: topic.to_owned(),
            partition,
            log: Vec::new(),
        }
    }

    /// A log holding `events` in order.
    pub fn from_events<'a>(
        topic: &str,
        partition: i32,
        events: impl IntoIterator<Item = &'a EventSpec>,
    ) -> Self {
        let mut p = Self::new(topic, partition);
        for e in events {
            p.push_event(e);
        }
        p
    }

    /// Appends an event (a republish when it is already in the log).
    pub fn push_event(&mut self, event: &EventSpec) {
        self.push_raw(Some(event.key()), event.payload());
    }

    /// Appends raw bytes.
    pub fn push_raw(&mut self, key: Option<Vec<u8>>, payload: Vec<u8>) {
        let offset = self.log.len() as i64;
        self.log.push(Message::new(offset, key, payload));
    }

    /// The batch of up to `len` messages starting at `start`.
    pub fn batch(&self, start: i64, len: usize) -> Batch {
        let from = usize::try_from(start).unwrap_or(0).min(self.log.len());
        let to = (from + len).min(self.log.len());
        Batch {
            topic: self.topic.clone(),
            partition: self.partition,
            start_offset: start,
            messages: self.log[from..to].to_vec(),
        }
    }
}

/// Consumes the partition to its end in batches of `batch_len`, resuming from the offset
/// stored in PostgreSQL, as the Kafka source does after every assignment.
pub async fn consume(
    applier: &Applier,
    client: &mut Client,
    partition: &Partition,
    batch_len: usize,
) -> Vec<BatchOutcome> {
    consume_with_crashes(applier, client, partition, batch_len, |_| false).await
}

/// Like [`consume`], but when `crash(n)` is true for the n-th attempt, the batch is applied
/// and its transaction dropped before commit (a crash between apply and commit); the next
/// attempt resumes from the stored offset, redelivering it. A fenced batch (another writer
/// committed first) is not an error here: the loop re-reads the offset, as a consumer would.
pub async fn consume_with_crashes(
    applier: &Applier,
    client: &mut Client,
    partition: &Partition,
    batch_len: usize,
    mut crash: impl FnMut(usize) -> bool,
) -> Vec<BatchOutcome> {
    let mut outcomes = Vec::new();
    for attempt in 0.. {
        let start = applier
            .stored_offset(client, &partition.topic, partition.partition)
            .await
            .expect("read offset")
            .unwrap_or(0);
        if start >= partition.log.len() as i64 {
            break;
        }
        let batch = partition.batch(start, batch_len.max(1));
        let result = if crash(attempt) {
            applier
                .make_days_for(client, &batch)
                .await
                .expect("the inbox's days");
            let mut tx = client.transaction().await.expect("begin");
            let result = applier.apply_in(&mut tx, &batch).await.map(|_| ());
            drop(tx);
            result
        } else {
            applier
                .apply(client, &batch)
                .await
                .map(|o| outcomes.push(o))
        };
        match result {
            Ok(()) | Err(ApplyError::Fenced { .. }) => {}
            // A waiting event drained by the crashed attempt needed a day: made, then again.
            Err(ApplyError::InboxDaysMissing { days, .. }) => applier
                .make_days(client, &days)
                .await
                .expect("the inbox's days"),
            Err(e) => panic!("apply failed: {e}"),
        }
    }
    outcomes
}
