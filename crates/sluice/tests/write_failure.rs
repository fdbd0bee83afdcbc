//! A journal write that fails (here: past the file-size limit, EFBIG; in
//! production a full disk or no descriptors left) nacks what it held, and
//! the queue takes messages again once the condition clears, without a
//! restart. Every message confirmed before or after is kept.

mod support;

use std::collections::BTreeSet;
use std::os::unix::process::CommandExt as _;
use std::time::{Duration, Instant};

use lapin::options::{BasicGetOptions, BasicPublishOptions};
use lapin::{BasicProperties, Channel};
use support::{connect, free_port};

const FILE_SIZE_LIMIT: u64 = 600 * 1024;

async fn publish(channel: &Channel, number: u32) -> bool {
    let mut body = vec![0u8; 10 * 1024];
    body[..4].copy_from_slice(&number.to_be_bytes());
    channel
        .basic_publish(
            "".into(),
            "limited".into(),
            BasicPublishOptions::default(),
            &body,
            BasicProperties::default().with_delivery_mode(2),
        )
        .await
        .unwrap()
        .await
        .unwrap()
        .is_ack()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_failure_nacks_then_the_queue_takes_messages_again_once_it_clears() {
    let dir = support::fresh_dir("write-failure");
    let config = dir.join("sluice.conf");
    std::fs::write(&config, "store.segment_size = 1MiB\n").unwrap();
    let port = free_port();
    let start = |limited: bool| {
        let mut command = support::server_command(port, &dir.join("data"), Some(&config));
        if limited {
            // SAFETY: setrlimit is async-signal-safe; nothing else runs
            // between fork and exec here.
            unsafe {
                command.pre_exec(|| {
                    let limit = libc::rlimit {
                        rlim_cur: FILE_SIZE_LIMIT,
                        rlim_max: libc::RLIM_INFINITY,
                    };
                    if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        command.spawn().unwrap()
    };
    let mut server = start(true);
    let connection = connect(port).await;
    let channel = support::durable_queue_with_confirms(&connection, "limited").await;

    // Confirmed until the journal's segment reaches the limit.
    let mut acked = BTreeSet::new();
    let mut number = 0;
    loop {
        assert!(number < 200, "the file-size limit was never reached");
        if !publish(&channel, number).await {
            break;
        }
        acked.insert(number);
        number += 1;
    }
    assert!(
        acked.len() > 10,
        "confirmed before the failure: {}",
        acked.len()
    );
    number += 1;
    // Still failing: refused at once.
    assert!(!publish(&channel, number).await);
    number += 1;

    // The condition clears: the queue takes messages again by itself.
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: plain system call on a child process of this test.
    let raised = unsafe {
        libc::prlimit(
            server.id() as libc::pid_t,
            libc::RLIMIT_FSIZE,
            &unlimited,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(raised, 0, "{}", std::io::Error::last_os_error());
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let ok = publish(&channel, number).await;
        number += 1;
        if ok {
            acked.insert(number - 1);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "publishes were never confirmed again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for _ in 0..20 {
        assert!(publish(&channel, number).await, "confirmed again");
        acked.insert(number);
        number += 1;
    }

    // Everything confirmed, before and after the failure, survives a restart.
    drop(connection);
    assert!(support::stop(&mut server).success());
    let mut server = start(false);
    let connection = connect(port).await;
    let channel = connection.create_channel().await.unwrap();
    let mut recovered = BTreeSet::new();
    while let Some(message) = channel
        .basic_get("limited".into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        recovered.insert(u32::from_be_bytes(
            message.delivery.data[..4].try_into().unwrap(),
        ));
    }
    let missing: Vec<&u32> = acked.difference(&recovered).collect();
    assert!(missing.is_empty(), "confirmed and lost: {missing:?}");
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
