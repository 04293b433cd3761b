//! Full inbox: the engine phase again, on a version whose inbox holds `--inbox-rows` rows.

use projector_engine::Projection;
use projector_views::Portfolio;

use super::{TOPIC_FULL_INBOX, V_FULL_INBOX};
use crate::bench::{settle, Bench};
use crate::error::{BenchError, Doing as _};
use crate::numbers::grouped;
use crate::{inbox, Figures, Options};

/// The engine phase again, on a version whose inbox holds `--inbox-rows` rows already.
pub(crate) async fn full_inbox(
    options: &Options,
    b: &Bench<'_>,
    f: &mut Figures,
) -> Result<(), BenchError> {
    if options.inbox_rows == 0 {
        eprintln!("bench: full inbox: skipped (--inbox-rows 0)");
        return Ok(());
    }
    let consumer = Portfolio::new(V_FULL_INBOX).consumer();
    eprintln!(
        "bench: full inbox: loading {} inbox rows of {consumer} (untimed)",
        grouped(options.inbox_rows)
    );
    f.inbox_fill = inbox::fill(b.pool, &consumer, options.inbox_rows, options.accounts).await?;
    eprintln!(
        "bench: full inbox: loaded in {} s; vacuum and checkpoint",
        f.inbox_fill.as_secs()
    );
    settle(b.pool).await?;
    f.inbox_total = {
        let client = b.pool.get().await?;
        let n: i64 = client
            .query_one("SELECT count(*) FROM projector.inbox", &[])
            .await
            .doing("counting the inbox")?
            .get(0);
        n.unsigned_abs()
    };
    eprintln!(
        "bench: full inbox: engine, portfolio, live, on an inbox of {} rows",
        grouped(f.inbox_total)
    );
    (f.engine_full_inbox_eps, f.full_inbox_wal_fpi) = b
        .live_settled(V_FULL_INBOX, TOPIC_FULL_INBOX, options.inbox_rows)
        .await?;
    eprintln!(
        "bench: full inbox: {} events/s; rows equal the fold",
        grouped(f.engine_full_inbox_eps)
    );
    Ok(())
}
