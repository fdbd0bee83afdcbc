//! The node reports the file descriptors it has open and may open, as
//! RabbitMQ reports `fd_used` and `fd_total`. One test alone in this binary:
//! other tests opening sockets at the same time would move the count.

mod support;

use std::time::{Duration, Instant};

use support::TestServer;

#[tokio::test]
async fn file_descriptors_used_follow_connections_and_the_total_is_the_raised_limit() {
    let server = TestServer::start().await;
    let running = server.running();
    // Settled first: just after start a thread may still hold a file it is
    // preallocating.
    let mut before = running.file_descriptors().unwrap();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = running.file_descriptors().unwrap();
        if now == before {
            break;
        }
        before = now;
    }
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes only the struct given.
    assert_eq!(
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
        0
    );
    assert_eq!(before.total, limit.rlim_cur);
    assert_eq!(
        limit.rlim_cur, limit.rlim_max,
        "raised to the hard limit at start"
    );

    // Each connection is two descriptors in this process: the client's
    // socket and the server's.
    let mut clients = Vec::new();
    for _ in 0..20 {
        clients.push(
            tokio::net::TcpStream::connect(server.address)
                .await
                .unwrap(),
        );
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let used = running.file_descriptors().unwrap().used;
        // A little slack for files the node opens or closes meanwhile.
        if used >= before.used + 36 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{used} descriptors with 20 more connections, {} before",
            before.used
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(clients);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let used = running.file_descriptors().unwrap().used;
        if used <= before.used + 4 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{used} descriptors once the connections closed, {} before",
            before.used
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.stop().await;
}
