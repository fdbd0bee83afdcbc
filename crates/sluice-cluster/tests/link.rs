//! Inter-node links between real TCP endpoints on loopback: several nodes'
//! links in one test process, each with its own listener.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sluice_cluster::cookie::Cookie;
use sluice_cluster::link::{LinkSettings, Links, PeerState};
use sluice_cluster::node_name::NodeName;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const HEARTBEAT_TIMEOUT: Duration = Duration::from_millis(800);

async fn listener() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").await.unwrap()
}

fn name_at(name: &str, listener: &TcpListener) -> NodeName {
    format!("{name}@{}", listener.local_addr().unwrap())
        .parse()
        .unwrap()
}

fn settings(node: &NodeName, members: &[NodeName], cookie: &str) -> LinkSettings {
    LinkSettings {
        node: node.clone(),
        members: members.to_vec(),
        cookie: Cookie::new(cookie),
        heartbeat_timeout: HEARTBEAT_TIMEOUT,
        tls: None,
    }
}

/// Waits until `peer`'s link, seen from `links`, is in a state `accept`s.
async fn wait_for(links: &Links, peer: &NodeName, what: &str, accept: impl Fn(&PeerState) -> bool) {
    let mut state = links.watch_peer(peer).expect("a member");
    let reached = tokio::time::timeout(
        Duration::from_secs(10),
        state.wait_for(|state| accept(state)),
    )
    .await;
    assert!(
        matches!(reached, Ok(Ok(_))),
        "{} never saw {peer} {what}: {:?}",
        links.node(),
        links.peer_state(peer)
    );
}

async fn wait_up(links: &Links, peer: &NodeName) {
    wait_for(links, peer, "up", |state| *state == PeerState::Up).await;
}

#[tokio::test]
async fn link_three_nodes_connect_pairwise_and_multiplex_channels() {
    let listeners = [listener().await, listener().await, listener().await];
    let names: Vec<NodeName> = ["n1", "n2", "n3"]
        .iter()
        .zip(&listeners)
        .map(|(name, listener)| name_at(name, listener))
        .collect();
    let mut nodes = Vec::new();
    for (listener, name) in listeners.into_iter().zip(&names) {
        nodes.push(Links::start_on(listener, settings(name, &names, "shared")).unwrap());
    }
    let mut receivers: Vec<_> = nodes
        .iter()
        .map(|node| (node.subscribe(1), node.subscribe(2)))
        .collect();
    for (index, node) in nodes.iter().enumerate() {
        for (other, name) in names.iter().enumerate() {
            if other != index {
                wait_up(node, name).await;
            }
        }
    }
    for (index, node) in nodes.iter().enumerate() {
        for (other, name) in names.iter().enumerate() {
            if other != index {
                let payload = format!("{index}->{other}");
                node.send(name, 1 + (other as u16 % 2), Bytes::from(payload))
                    .await
                    .unwrap();
            }
        }
    }
    for (index, (first, second)) in receivers.iter_mut().enumerate() {
        let channel = if index % 2 == 0 { first } else { second };
        let mut got = Vec::new();
        for _ in 0..2 {
            let received = tokio::time::timeout(Duration::from_secs(5), channel.recv())
                .await
                .expect("a frame arrives")
                .expect("the channel is open");
            got.push((
                received.from.to_string(),
                String::from_utf8(received.payload.to_vec()).unwrap(),
            ));
        }
        got.sort();
        let mut expected: Vec<(String, String)> = (0..3)
            .filter(|sender| *sender != index)
            .map(|sender| (names[sender].to_string(), format!("{sender}->{index}")))
            .collect();
        expected.sort();
        assert_eq!(got, expected);
    }
    for node in &nodes {
        node.shutdown();
    }
}

#[tokio::test]
async fn link_nodes_with_different_cookies_refuse_each_other_on_both_sides() {
    let (first, second) = (listener().await, listener().await);
    let names = [name_at("a", &first), name_at("b", &second)];
    let dialer = Links::start_on(first, settings(&names[0], &names, "one secret")).unwrap();
    let acceptor = Links::start_on(second, settings(&names[1], &names, "another")).unwrap();
    wait_for(
        &dialer,
        &names[1],
        "refused",
        |state| matches!(state, PeerState::Down(reason) if reason.contains("cookie")),
    )
    .await;
    assert_eq!(acceptor.peer_state(&names[0]), Some(PeerState::Connecting));
    let send = acceptor.send(&names[0], 1, Bytes::from_static(b"x")).await;
    assert!(send.is_err(), "nothing can be sent over a refused link");
    dialer.shutdown();
    acceptor.shutdown();
}

/// Forwards connections from its own port to `target`, and stops moving
/// bytes either way while paused: a peer that hangs, or a network that
/// partitions, as the nodes see it.
async fn pausable_proxy(
    listener: TcpListener,
    target: std::net::SocketAddr,
) -> watch::Sender<bool> {
    let (pause, paused) = watch::channel(false);
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            let Ok(server) = TcpStream::connect(target).await else {
                continue;
            };
            let paused = paused.clone();
            tokio::spawn(async move {
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::join!(
                    pump(client_read, server_write, paused.clone()),
                    pump(server_read, client_write, paused)
                );
            });
        }
    });
    pause
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut paused: watch::Receiver<bool>,
) {
    use tokio::io::AsyncReadExt;
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        if paused.wait_for(|paused| !paused).await.is_err() {
            return;
        }
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        if paused.wait_for(|paused| !paused).await.is_err()
            || to.write_all(&buffer[..read]).await.is_err()
        {
            return;
        }
    }
}

#[tokio::test]
async fn link_to_a_hung_peer_goes_down_within_the_timeout_bounds_sends_and_comes_back() {
    let dialer_listener = listener().await;
    let acceptor_listener = listener().await;
    let proxy_listener = listener().await;
    // The acceptor is known by the proxy's address: the dialer reaches it
    // only through the proxy.
    let names = [
        name_at("a", &dialer_listener),
        name_at("b", &proxy_listener),
    ];
    let pause = pausable_proxy(proxy_listener, acceptor_listener.local_addr().unwrap()).await;
    let dialer = Links::start_on(dialer_listener, settings(&names[0], &names, "s")).unwrap();
    let acceptor = Links::start_on(acceptor_listener, settings(&names[1], &names, "s")).unwrap();
    let _received = acceptor.subscribe(1);
    wait_up(&dialer, &names[1]).await;
    wait_up(&acceptor, &names[0]).await;

    pause.send_replace(true);
    let paused_at = tokio::time::Instant::now();
    // Sends wait once the peer's buffer is full, or fail once the link is
    // declared down: either way far less than this is ever held.
    let sender = Arc::clone(&dialer);
    let peer = names[1].clone();
    let sending = tokio::spawn(async move {
        let mut accepted = 0usize;
        let chunk = Bytes::from(vec![7u8; 1024 * 1024]);
        while accepted < 256 {
            match tokio::time::timeout(Duration::from_secs(5), sender.send(&peer, 1, chunk.clone()))
                .await
            {
                Ok(Ok(())) => accepted += 1,
                _ => break,
            }
        }
        accepted
    });
    wait_for(&dialer, &names[1], "down", |state| {
        matches!(state, PeerState::Down(_))
    })
    .await;
    wait_for(&acceptor, &names[0], "down", |state| {
        matches!(state, PeerState::Down(_))
    })
    .await;
    let detected_in = paused_at.elapsed();
    assert!(
        detected_in < HEARTBEAT_TIMEOUT * 4,
        "a hung peer took {detected_in:?} to be noticed"
    );
    let accepted = sending.await.unwrap();
    assert!(accepted < 64, "{accepted} MiB were taken for a hung peer");

    pause.send_replace(false);
    wait_up(&dialer, &names[1]).await;
    wait_up(&acceptor, &names[0]).await;
    dialer
        .send(&names[1], 1, Bytes::from_static(b"again"))
        .await
        .unwrap();
    dialer.shutdown();
    acceptor.shutdown();
}
