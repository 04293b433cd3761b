//! The demo's story, one function per step, in the order [`story`] runs them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use deadpool_postgres::{Client, Pool};
use projector_devkit::devbroker::DevBroker;
use projector_devkit::reconcile::reconcile;
use projector_devkit::writeside::quotes::{
    FeedConfig, FeedMode, FeedSymbol, Limits, Quotes, QuotesReport, ReceiverConfig,
};
use projector_devkit::writeside::{
    LoadConfig, RelayConfig, RelayExit, Report as WriteReport, WriteSide, WriteSideError,
};
use projector_engine::kafka::source::KafkaConfig;
use projector_engine::versions::VersionState;
use projector_engine::Registry;
use projector_rebuild::{Outcome, RebuildError};
use tokio::task::JoinHandle;
use tokio::time::{Instant, Interval};
use tokio_util::sync::CancellationToken;

use super::display::Display;
use super::engines::Engine;
use super::server::Server;
use super::{
    lag_every, ownership, read_own_writes, rebuilt, view_stats, Args, OwnReads, RebuildProgress,
    Report, ViewStats, FINISH_WITHIN, REBUILT, RELAY_CRASH_PERCENT, TICK, TOPIC,
};

/// The demo from an empty database to the report.
pub(super) async fn story(
    server: &Server,
    registry: &Registry,
    args: &Args,
    display: &Arc<Display>,
    interrupted: CancellationToken,
) -> anyhow::Result<Report> {
    let mut s = Story {
        server,
        registry,
        args,
        display,
        interrupted,
        lines: Vec::new(),
    };
    let Database {
        url,
        pool,
        write_side,
    } = s.database().await?;
    let (quotes, write_side) = s.quotes(write_side).await?;
    s.describe_database();
    let broker = s.broker()?;
    let brokers = broker.bootstrap_servers();
    let a = s.start_a(&brokers, &url)?;
    let load = s.start_load(&write_side, &pool, &brokers)?;
    let mut run = s
        .run_load(a, &load, &write_side, &pool, &url, &brokers)
        .await?;
    let ended = s
        .stop_load(load, &write_side, quotes, run.schedule.started)
        .await?;
    s.finish_rebuild(&mut run, ended.deadline).await?;
    let views = s.catch_up(&mut run, &write_side, ended.deadline).await?;
    s.stop_b(&mut run).await?;
    s.report(run, ended, views, &write_side, &pool, broker)
        .await
}

/// What every step reads, and the story's lines so far.
struct Story<'a> {
    server: &'a Server,
    registry: &'a Registry,
    args: &'a Args,
    display: &'a Arc<Display>,
    interrupted: CancellationToken,
    /// The report's engine section: what happened, when.
    lines: Vec<String>,
}

/// The demo's database.
struct Database {
    url: String,
    /// The clients (two connections each: a racing retry holds two), the relay, the figures.
    pool: Pool,
    write_side: WriteSide,
}

/// What runs while the clients send requests.
struct Load {
    config: LoadConfig,
    /// Tells the relay to publish what is left and stop.
    drain: CancellationToken,
    /// Stops the clients and the reading client.
    stop: CancellationToken,
    relay: JoinHandle<Result<RelayExit, WriteSideError>>,
    clients: JoinHandle<Result<(), WriteSideError>>,
    reader: JoinHandle<anyhow::Result<OwnReads>>,
}

/// When the story's steps happen, as shares of the load's duration.
struct Schedule {
    started: Instant,
    join: Instant,
    rebuild: Instant,
    upgrade: Instant,
    kill: Instant,
    end: Instant,
}

/// The engines and the rebuild, as the story moves them, and what it saw of them.
struct Run {
    a: Engine,
    a_alive: bool,
    b: Option<Engine>,
    rebuild: Option<JoinHandle<Result<Outcome, RebuildError>>>,
    progress: Arc<RebuildProgress>,
    /// The rebuild's source: the dev broker, as the engines read it.
    kafka: KafkaConfig,
    cut_over: bool,
    split_seen: bool,
    took_over_seen: bool,
    max_lag: i64,
    schedule: Schedule,
    /// How often the figures are read, in the load and while catching up.
    ticker: Interval,
    /// The figures' connection.
    client: Client,
}

/// What the end of the load leaves for the report.
struct Ended {
    load: LoadConfig,
    ran: Duration,
    own_reads: OwnReads,
    quotes: QuotesReport,
    /// By when the relay, the rebuild and the engines must have finished what is left.
    deadline: Instant,
}

// The setup: the database and the write side.
impl Story<'_> {
    /// A line of the story, shown now and kept for the report.
    fn tell(&mut self, note: String) {
        self.display.say(&note);
        self.lines
            .push(format!("{:>7}  {note}", self.display.elapsed()));
    }

    /// The demo's database afresh, the engine's and the views' schema, and the write side,
    /// its producers at version 1 of fills and busts.
    async fn database(&self) -> anyhow::Result<Database> {
        self.display
            .say(&format!("PostgreSQL: {}", self.server.described));
        let url = self.server.fresh_database(&self.args.database).await?;
        let pool = projector_engine::db::pool(&url, 24)?;
        {
            let mut client = pool
                .get()
                .await
                .context("cannot connect to the demo database")?;
            projector_engine::migrate(&mut client, self.registry).await?;
        }
        let write_side = WriteSide::new(pool.clone())
            .await
            .context("cannot set up the write side's schema")?;
        // The producers start at version 1 of fills and busts and are upgraded to version 2
        // halfway (below): the topic holds both, interleaved for every account, and the views
        // read both through their upcaster.
        write_side.set_fill_version(1)?;
        Ok(Database {
            url,
            pool,
            write_side,
        })
    }
}

// Before the load: the quote feed, the broker, engine A and the clients.
impl Story<'_> {
    /// The quote feed (the built-in simulator, over UDP on loopback) and the gate the write
    /// side refuses orders with.
    async fn quotes(&self, write_side: WriteSide) -> anyhow::Result<(Quotes, WriteSide)> {
        // The flags' defaults of `projector simulate`, which a unit test there holds equal, except
        // that a short run sees at least four source lags: one lag in a 12 s run falls in a single
        // second, and a machine busy enough to stall the clients for that second told no story of
        // `stale at source` (a test's run once refused none).
        let defaults = FeedConfig::new(FeedSymbol::traded());
        let feed = FeedConfig {
            seed: self.args.seed,
            lag_every: lag_every(&defaults, self.args.duration),
            ..defaults
        };
        let gate = ReceiverConfig::new(
            FeedMode::Delta,
            Limits::default(),
            FeedSymbol::traded().into_iter().map(|s| s.name).collect(),
        );
        let quotes = crate::simulate::start_quotes(None, feed.clone(), gate).await?;
        let write_side = write_side.with_quotes(quotes.gate().clone());
        self.display.say(&format!(
            "quote feed (the built-in simulator, UDP on loopback) at {}: {} ticks/s per symbol, {} lost, a {} burst every {}, \
             a source {} behind for {} every {}, a clock {} ms off; orders are refused on a quote silent over {} ms, \
             over {} ms old at the source, or suspect",
            quotes.feed_addr(),
            feed.ticks_per_second,
            feed.loss,
            humantime::format_duration(feed.burst_for),
            humantime::format_duration(feed.burst_every),
            humantime::format_duration(feed.lag),
            humantime::format_duration(feed.lag_for),
            humantime::format_duration(feed.lag_every),
            feed.clock_skew_ms,
            Limits::default().stale_after_ms,
            Limits::default().source_stale_after_ms,
        ));
        Ok((quotes, write_side))
    }

    /// What the demo's database holds.
    fn describe_database(&self) {
        self.display.say(&format!(
            "database {}: the write side's tables (positions, account_seq, outbox, ...) and the views {}",
            self.args.database,
            self.registry.names().into_iter().collect::<Vec<_>>().join(", ")
        ));
    }

    /// The dev broker, in this process, with the demo's topic.
    fn broker(&self) -> anyhow::Result<DevBroker> {
        let broker = DevBroker::start(1, &[(TOPIC, self.args.partitions)])
            .context("cannot start the dev broker")?;
        self.display.say(&format!(
            "dev broker (librdkafka's mock cluster, in this process) on {}: topic {TOPIC}, {} partitions",
            broker.bootstrap_servers(),
            self.args.partitions
        ));
        Ok(broker)
    }

    /// Engine A, the first `projector run`.
    fn start_a(&mut self, brokers: &str, url: &str) -> anyhow::Result<Engine> {
        let a = Engine::spawn("A", brokers, TOPIC, url)?;
        self.tell(format!(
            "engine A (pid {}) `projector run` started",
            a.pid()
        ));
        Ok(a)
    }

    /// The clients, the relay that "crashes" between publish and mark, and the client that
    /// reads its own writes.
    fn start_load(
        &self,
        write_side: &WriteSide,
        pool: &Pool,
        brokers: &str,
    ) -> anyhow::Result<Load> {
        let args = self.args;
        let config = LoadConfig {
            rate: Some(args.rate),
            seed: args.seed,
            ..LoadConfig::new(args.accounts)
        };
        config.check()?;
        let relay = write_side.relay(RelayConfig {
            seed: args.seed,
            crash_percent: RELAY_CRASH_PERCENT,
            ..RelayConfig::new(brokers.to_owned(), TOPIC)
        });
        let (drain, relay_stop, stop) = (
            CancellationToken::new(),
            self.interrupted.child_token(),
            self.interrupted.child_token(),
        );
        let relay = {
            let drain = drain.clone();
            tokio::spawn(async move { relay.run(drain, relay_stop).await })
        };
        let clients = {
            let (write_side, config, stop) = (write_side.clone(), config.clone(), stop.clone());
            tokio::spawn(async move { write_side.run_load(&config, stop).await })
        };
        let reader = tokio::spawn(read_own_writes(
            write_side.clone(),
            pool.clone(),
            args.accounts,
            stop.clone(),
        ));
        self.display.say(&format!(
            "clients: {} requests/s over {} accounts ({} hot) for {}; {}% retried under the same idempotency key; \
             the relay crashes between publish and mark after {}% of its batches",
            args.rate,
            args.accounts,
            config.hot_accounts(),
            humantime::format_duration(args.duration),
            config.retry_percent,
            RELAY_CRASH_PERCENT
        ));
        Ok(Load {
            config,
            drain,
            stop,
            relay,
            clients,
            reader,
        })
    }
}

// The load, tick by tick.
impl Story<'_> {
    /// The load phase: every tick reads the figures and moves the story on: B joins, the
    /// producers upgrade, the rebuild starts, A is killed, the rebuild cuts over.
    async fn run_load(
        &mut self,
        a: Engine,
        load: &Load,
        write_side: &WriteSide,
        pool: &Pool,
        url: &str,
        brokers: &str,
    ) -> anyhow::Result<Run> {
        let mut run = self.stage(a, pool, brokers).await?;
        loop {
            run.ticker.tick().await;
            let now = Instant::now();
            run.check_alive()?;
            self.figures(&mut run, write_side, now).await?;
            self.upgrade(&run, write_side, now)?;
            self.join(&mut run, brokers, url, now)?;
            self.start_rebuild(&mut run, url, now);
            self.kill_a(&mut run, now)?;
            self.cut_over(&mut run).await?;
            if load.clients.is_finished() || now >= run.schedule.end {
                break;
            }
        }
        Ok(run)
    }

    /// The schedule from now, and what the load phase follows.
    async fn stage(&self, a: Engine, pool: &Pool, brokers: &str) -> anyhow::Result<Run> {
        let started = Instant::now();
        let at = |percent: u32| started + self.args.duration * percent / 100;
        let schedule = Schedule {
            started,
            join: at(20),
            rebuild: at(35),
            upgrade: at(50),
            kill: at(60),
            end: at(100),
        };
        let progress = Arc::new(RebuildProgress {
            display: Arc::clone(self.display),
            lag: Mutex::new(None),
        });
        let mut kafka = KafkaConfig::new(brokers.to_owned(), TOPIC);
        kafka.properties = vec![
            ("session.timeout.ms".to_owned(), "3000".to_owned()),
            ("heartbeat.interval.ms".to_owned(), "300".to_owned()),
        ];
        // The rebuild reads the dev broker too.
        kafka.properties.extend(
            projector_devkit::devbroker::CONSUMER_PROPERTIES
                .iter()
                .map(|&(k, v)| (k.to_owned(), v.to_owned())),
        );
        let ticker = tokio::time::interval(TICK);
        let client = pool
            .get()
            .await
            .context("cannot connect to the demo database")?;
        Ok(Run {
            a,
            a_alive: true,
            b: None,
            rebuild: None,
            progress,
            kafka,
            cut_over: false,
            split_seen: false,
            took_over_seen: false,
            max_lag: 0,
            schedule,
            ticker,
            client,
        })
    }

    /// The figures of a tick: who owns which partitions (a rebalance and a takeover are lines
    /// of the story), the largest lag, and the line of figures.
    async fn figures(
        &mut self,
        run: &mut Run,
        write_side: &WriteSide,
        now: Instant,
    ) -> anyhow::Result<()> {
        let report = write_side.report();
        let views = view_stats(&run.client, &report.partitions).await?;
        self.owners(run, &report, &views);
        run.max_lag = run.max_lag.max(
            views
                .iter()
                .filter(|v| v.state == VersionState::Live)
                .map(|v| v.lag)
                .max()
                .unwrap_or(0),
        );
        let lags = views
            .iter()
            .filter(|v| v.state != VersionState::Retired)
            .map(|v| format!("{} v{} {}", v.name, v.version, v.lag))
            .collect::<Vec<_>>()
            .join(", ");
        let rebuild_lag = run
            .progress
            .lag
            .lock()
            .ok()
            .and_then(|l| *l)
            .filter(|_| run.rebuild.as_ref().is_some_and(|r| !r.is_finished()))
            .map_or(String::new(), |l| format!(" (rebuild lag {l})"));
        let done = now
            .saturating_duration_since(run.schedule.started)
            .min(self.args.duration);
        self.display.figures(
            done.as_secs(),
            &format!(
                "events {} · published {} ({} redelivered) · refused on the quote {} · lag {lags}{rebuild_lag}",
                report.events(),
                report.published,
                report.redeliveries_injected,
                report.refused_on_quotes()
            ),
        );
        Ok(())
    }

    /// Tells, once each, when the group has split the partitions between A and B, and when B
    /// has taken over every partition after A's death; read on a live view other than the
    /// rebuilt one.
    fn owners(&mut self, run: &mut Run, report: &WriteReport, views: &[ViewStats]) {
        let Some(reference) = views
            .iter()
            .find(|v| v.state == VersionState::Live && v.name != REBUILT)
        else {
            return;
        };
        let mut engines: Vec<&Engine> = Vec::new();
        if run.a_alive {
            engines.push(&run.a);
        }
        if let Some(b) = &run.b {
            engines.push(b);
        }
        let own = ownership(reference, &engines);
        if !run.split_seen
            && run.a_alive
            && run
                .b
                .as_ref()
                .is_some_and(|b| reference.owners.values().any(|o| b.committed(o)))
            && reference.owners.values().any(|o| run.a.committed(o))
        {
            run.split_seen = true;
            self.tell(format!(
                "the group rebalanced: partitions of {}  {own}",
                reference.name
            ));
        }
        if !run.took_over_seen
            && !run.a_alive
            && run.b.as_ref().is_some_and(|b| {
                (0..self.args.partitions).all(|p| {
                    report.partitions.get(&p).is_none_or(|n| *n == 0)
                        || reference.owners.get(&p).is_some_and(|o| b.committed(o))
                })
            })
        {
            run.took_over_seen = true;
            self.tell(format!("B took over every partition ({own})"));
        }
    }

    /// Halfway: the write side's producers move to version 2 of fills and busts.
    fn upgrade(&mut self, run: &Run, write_side: &WriteSide, now: Instant) -> anyhow::Result<()> {
        if write_side.fill_version() == 1 && now >= run.schedule.upgrade {
            write_side.set_fill_version(2)?;
            self.tell(
                "the write side upgraded its producers: fills and busts are now version 2 (a signed qty, no side); the views read both".to_owned(),
            );
        }
        Ok(())
    }

    /// Engine B joins the group.
    fn join(
        &mut self,
        run: &mut Run,
        brokers: &str,
        url: &str,
        now: Instant,
    ) -> anyhow::Result<()> {
        if run.b.is_none() && now >= run.schedule.join {
            let engine = Engine::spawn("B", brokers, TOPIC, url)?;
            self.tell(format!(
                "engine B (pid {}) `projector run` joined: the group rebalances",
                engine.pid()
            ));
            run.b = Some(engine);
        }
        Ok(())
    }

    /// The rebuild of [`REBUILT`] into a new version, while live.
    fn start_rebuild(&mut self, run: &mut Run, url: &str, now: Instant) {
        if run.rebuild.is_some() || run.cut_over || now < run.schedule.rebuild {
            return;
        }
        let options = projector_rebuild::Options {
            // A short margin: every message's time is this machine's clock.
            margin: Duration::from_secs(5),
            batch_messages: 2000,
            tick: Duration::from_millis(500),
            ..projector_rebuild::Options::new(REBUILT)
        };
        self.tell(format!(
            "rebuild of {REBUILT} into a new version from the write side's snapshot, while live"
        ));
        let (registry, url, kafka) = (self.registry.clone(), url.to_owned(), run.kafka.clone());
        let progress = Arc::clone(&run.progress);
        let stop = self.interrupted.child_token();
        run.rebuild = Some(tokio::spawn(async move {
            projector_rebuild::rebuild(&registry, &url, kafka, &options, &*progress, stop).await
        }));
    }

    /// A dies once B owns partitions of its own (or at the end of the load at the latest), so
    /// that the kill moves partitions from one live process to another.
    fn kill_a(&mut self, run: &mut Run, now: Instant) -> anyhow::Result<()> {
        if run.a_alive && now >= run.schedule.kill && (run.split_seen || now >= run.schedule.end) {
            run.a.kill()?;
            run.a_alive = false;
            self.tell(format!(
                "engine A (pid {}) killed with SIGKILL: its batches in flight roll back, its partitions move to B",
                run.a.pid()
            ));
        }
        Ok(())
    }

    /// The rebuild's line once it has cut over.
    async fn cut_over(&mut self, run: &mut Run) -> anyhow::Result<()> {
        if run.rebuild.as_ref().is_some_and(JoinHandle::is_finished) {
            if let Some(task) = run.rebuild.take() {
                run.cut_over = true;
                self.tell(rebuilt(task.await)?);
            }
        }
        Ok(())
    }
}

impl Run {
    /// Fails when an engine that should run has exited.
    fn check_alive(&mut self) -> anyhow::Result<()> {
        if self.a_alive {
            self.a.check_alive()?;
        }
        if let Some(b) = &mut self.b {
            b.check_alive()?;
        }
        Ok(())
    }
}

// After the load: the rest published, the engines caught up and stopped, the report.
impl Story<'_> {
    /// The clients and the reading client stop, then the quote feed; the relay publishes what
    /// is left.
    async fn stop_load(
        &self,
        load: Load,
        write_side: &WriteSide,
        quotes: Quotes,
        started: Instant,
    ) -> anyhow::Result<Ended> {
        load.stop.cancel();
        load.clients
            .await
            .context("the clients' task panicked")?
            .context("the clients stopped")?;
        let own_reads = load
            .reader
            .await
            .context("the reading client's task panicked")?
            .context("the reading client stopped")?;
        let ran = started.elapsed();
        let report = write_side.report();
        // No order comes any more: the feed's work is done.
        let quotes_report = quotes.report();
        quotes.stop().await.context("the quote feed stopped")?;
        self.display.say(&format!(
            "clients stopped after {} requests ({} refused on the quote); the relay publishes what is left",
            report.requests,
            report.refused_on_quotes()
        ));
        load.drain.cancel();
        let deadline = Instant::now() + FINISH_WITHIN;
        tokio::time::timeout_at(deadline, load.relay)
            .await
            .context("the relay did not publish the rest in time")?
            .context("the relay's task panicked")?
            .context("the relay stopped")?;
        Ok(Ended {
            load: load.config,
            ran,
            own_reads,
            quotes: quotes_report,
            deadline,
        })
    }

    /// The rebuild's line when it cut over after the load.
    async fn finish_rebuild(&mut self, run: &mut Run, deadline: Instant) -> anyhow::Result<()> {
        if let Some(task) = run.rebuild.take() {
            let outcome = tokio::time::timeout_at(deadline, task)
                .await
                .context("the rebuild did not finish in time")?;
            self.tell(rebuilt(outcome)?);
        } else if !run.cut_over {
            anyhow::bail!("the rebuild never started: the load was too short");
        }
        Ok(())
    }

    /// Waits until every live version is at the end of every partition: the views then.
    async fn catch_up(
        &self,
        run: &mut Run,
        write_side: &WriteSide,
        deadline: Instant,
    ) -> anyhow::Result<Vec<ViewStats>> {
        let b = run
            .b
            .as_mut()
            .context("engine B never started: the load was too short")?;
        let published = write_side.report().partitions;
        let views = loop {
            b.check_alive()?;
            let views = view_stats(&run.client, &published).await?;
            let live: Vec<&ViewStats> = views
                .iter()
                .filter(|v| v.state == VersionState::Live)
                .collect();
            if !live.is_empty() && live.iter().all(|v| v.lag == 0) {
                break views;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the engines did not catch up in time: lag {:?}",
                live.iter().map(|v| (&v.name, v.lag)).collect::<Vec<_>>()
            );
            self.display.figures(
                self.args.duration.as_secs(),
                &format!(
                    "catching up: lag {}",
                    live.iter()
                        .map(|v| format!("{} v{} {}", v.name, v.version, v.lag))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
            run.ticker.tick().await;
        };
        self.display
            .say("caught up: every live view is at the end of every partition");
        Ok(views)
    }

    /// Engine B stops with SIGTERM, as a deployment stops it.
    async fn stop_b(&mut self, run: &mut Run) -> anyhow::Result<()> {
        let b = run
            .b
            .as_mut()
            .context("engine B never started: the load was too short")?;
        b.stop().await?;
        let pid = b.pid();
        self.tell(format!("engine B (pid {pid}) stopped with SIGTERM"));
        Ok(())
    }

    /// The dead letters and parked accounts, every view reconciled with the write side, and
    /// the report.
    async fn report(
        self,
        run: Run,
        ended: Ended,
        views: Vec<ViewStats>,
        write_side: &WriteSide,
        pool: &Pool,
        broker: DevBroker,
    ) -> anyhow::Result<Report> {
        let client = run.client;
        let dead_letters = projector_devkit::demo::dead_letters(&client).await?;
        let parked = projector_devkit::demo::parked_accounts(&client).await?;
        drop(client);
        let mut client = pool
            .get()
            .await
            .context("cannot connect to the demo database")?;
        let reconciled = reconcile(&mut client).await?;
        let trades_by_version = write_side.trades_by_version().await?;
        drop(broker);
        Ok(Report {
            wall: self.display.wall(),
            server: self.server.described.clone(),
            database: self.args.database.clone(),
            kept: self.server.cluster.is_none(),
            load: ended.load,
            ran: ended.ran,
            write: write_side.report(),
            trades_by_version,
            quotes: ended.quotes,
            story: self.lines,
            views,
            max_lag: run.max_lag,
            dead_letters,
            parked,
            reconciled,
            own_reads: ended.own_reads,
        })
    }
}
