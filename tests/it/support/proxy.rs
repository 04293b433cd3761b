//! A TCP proxy that can freeze the network under a client: [`Proxy::freeze`] stops
//! forwarding on every connection open at that moment, in both directions, without closing
//! it, as a network partition or a paused VM would; connections opened later are forwarded
//! as usual. Neither end learns anything: the kernel still acknowledges what each side
//! sends, so TCP keepalives and user timeouts see a healthy peer. Only a timeout of the
//! client's own notices.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Forwards `127.0.0.1:<port>` to a target address until dropped.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    /// Connections numbered below this are frozen.
    frozen_below: watch::Sender<u64>,
    /// The number the next accepted connection gets.
    next_id: Arc<AtomicU64>,
    /// Cancelled on drop: ends the accept loop and closes every connection, frozen or not.
    closed: CancellationToken,
}

impl Proxy {
    /// Listens on an ephemeral local port and forwards every connection to `target`.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy bind");
        let addr = listener.local_addr().expect("proxy address");
        let (frozen_below, _) = watch::channel(0u64);
        let next_id = Arc::new(AtomicU64::new(0));
        let closed = CancellationToken::new();
        let (frozen, ids, stop) = (frozen_below.clone(), next_id.clone(), closed.clone());
        tokio::spawn(async move {
            loop {
                let client = tokio::select! {
                    _ = stop.cancelled() => return,
                    accepted = listener.accept() => match accepted {
                        Ok((client, _)) => client,
                        Err(_) => continue,
                    },
                };
                let id = ids.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(forward(
                    client,
                    target,
                    id,
                    frozen.subscribe(),
                    stop.clone(),
                ));
            }
        });
        Self {
            addr,
            frozen_below,
            next_id,
            closed,
        }
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Freezes every connection open now; later ones are forwarded.
    pub fn freeze(&self) {
        self.frozen_below
            .send_replace(self.next_id.load(Ordering::SeqCst));
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.closed.cancel();
    }
}

async fn forward(
    mut client: TcpStream,
    target: SocketAddr,
    id: u64,
    mut frozen_below: watch::Receiver<u64>,
    closed: CancellationToken,
) {
    let Ok(mut server) = TcpStream::connect(target).await else {
        return;
    };
    let frozen = async {
        let _ = frozen_below.wait_for(|&below| id < below).await;
    };
    tokio::select! {
        _ = closed.cancelled() => return,
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => return,
        () = frozen => {}
    }
    // Frozen: both sockets stay open and nothing moves, until the proxy goes away.
    closed.cancelled().await;
}

/// `url` with its host and port replaced by `addr`: the same database, user and options,
/// reached through the proxy.
pub fn url_through(url: &str, addr: SocketAddr) -> String {
    let (scheme, rest) = url.split_once("://").expect("a postgres:// URL");
    let (authority, path) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let user = authority
        .rsplit_once('@')
        .map(|(user, _)| format!("{user}@"))
        .unwrap_or_default();
    format!("{scheme}://{user}{addr}{path}")
}

/// The address a URL points at (its first host), resolved.
pub fn target_of(url: &str) -> SocketAddr {
    use std::net::ToSocketAddrs;
    use std::str::FromStr;
    let config = tokio_postgres::Config::from_str(url).expect("a valid URL");
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        _ => "127.0.0.1".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    (host.as_str(), port)
        .to_socket_addrs()
        .expect("resolve the database host")
        .next()
        .expect("an address")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_keeps_everything_but_the_address() {
        let addr: SocketAddr = "127.0.0.1:4000".parse().expect("addr");
        assert_eq!(
            url_through(
                "postgres://postgres@127.0.0.1:5432/db?sslmode=disable",
                addr
            ),
            "postgres://postgres@127.0.0.1:4000/db?sslmode=disable"
        );
        assert_eq!(
            url_through("postgresql://u:p@db.example:6543/x", addr),
            "postgresql://u:p@127.0.0.1:4000/x"
        );
    }
}
