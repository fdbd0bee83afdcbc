//! `sluice perf`'s own AMQP client against a real Sluice server in this process: bodies split
//! over frames, confirms and returns, and the broker's refusals as clear errors.

use sluice_perf::client::{
    publish_properties, ClientConnection, ClientError, Incoming, SocketOptions,
};
use sluice_wire::amq_protocol::protocol::{basic, channel, confirm, queue, AMQPClass};
use sluice_wire::amq_protocol::types::FieldTable;

mod support;
use support::{start_server, TempDir};

const SMALLEST_FRAMES: SocketOptions = SocketOptions {
    frame_max: 4096,
    send_buffer: 0,
    receive_buffer: 0,
};

async fn open(uri: &str) -> Result<ClientConnection, ClientError> {
    ClientConnection::open(&uri.parse().unwrap(), SMALLEST_FRAMES, "client test").await
}

fn declare(name: &str, passive: bool) -> AMQPClass {
    AMQPClass::Queue(queue::AMQPMethod::Declare(queue::Declare {
        queue: name.into(),
        passive,
        durable: false,
        exclusive: false,
        auto_delete: false,
        nowait: false,
        arguments: FieldTable::default(),
    }))
}

/// Reads until `count` items arrived.
async fn read_items(connection: &mut ClientConnection, count: usize) -> Vec<Incoming> {
    let mut items = Vec::new();
    let reading = async {
        while items.len() < count {
            while let Some(item) = connection.next_incoming().unwrap() {
                items.push(item);
            }
            if items.len() < count {
                connection.read_more().await.unwrap();
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), reading)
        .await
        .expect("the items arrive");
    items
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_reads_bodies_split_over_frames_confirms_and_returns() {
    let data = TempDir::new("client");
    let server = start_server(&data.0).await;
    let uri = format!("amqp://guest:guest@{}", server.local_address);
    let mut connection = open(&uri).await.unwrap();
    assert_eq!(connection.frame_max(), 4096);
    let channel = connection.open_channel().await.unwrap();
    connection
        .call(channel, declare("split", false))
        .await
        .unwrap();
    let answer = connection
        .call(
            channel,
            AMQPClass::Confirm(confirm::AMQPMethod::Select(confirm::Select {
                nowait: false,
            })),
        )
        .await
        .unwrap();
    assert!(matches!(
        answer,
        AMQPClass::Confirm(confirm::AMQPMethod::SelectOk(_))
    ));

    // Five frames' worth of body, then a mandatory message that no queue takes.
    let body: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    let properties = publish_properties(true);
    connection.publish(channel, "", "split", true, &properties, &body);
    connection.publish(channel, "", "nowhere", true, &properties, b"lost");
    connection.flush().await.unwrap();
    // Read until both are confirmed, singly or by one multiple ack; the return comes before
    // its message's confirm.
    let mut confirms = Vec::new();
    let mut confirmed = 0;
    while confirmed < 2 {
        for item in read_items(&mut connection, 1).await {
            if let Incoming::Confirm {
                delivery_tag,
                multiple,
                acked,
            } = item
            {
                assert!(acked, "{item:?}");
                confirmed += if multiple {
                    delivery_tag - confirmed
                } else {
                    1
                };
            }
            confirms.push(item);
        }
    }
    assert_eq!(confirmed, 2, "{confirms:?}");
    let returned_at = confirms.iter().position(|item| *item == Incoming::Returned);
    let last_confirm_at = confirms
        .iter()
        .rposition(|item| matches!(item, Incoming::Confirm { .. }));
    assert!(
        returned_at.is_some() && returned_at < last_confirm_at,
        "{confirms:?}"
    );

    let consuming = connection.open_channel().await.unwrap();
    let answer = connection
        .call(
            consuming,
            AMQPClass::Basic(basic::AMQPMethod::Consume(basic::Consume {
                queue: "split".into(),
                consumer_tag: "".into(),
                no_local: false,
                no_ack: false,
                exclusive: false,
                nowait: false,
                arguments: FieldTable::default(),
            })),
        )
        .await
        .unwrap();
    assert!(matches!(
        answer,
        AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(_))
    ));
    let delivered = read_items(&mut connection, 1).await;
    match &delivered[..] {
        [Incoming::Delivery {
            delivery_tag,
            body: received,
        }] => {
            assert_eq!(&received[..], &body[..]);
            connection.ack(consuming, *delivery_tag, false);
            connection.flush().await.unwrap();
        }
        other => panic!("expected one delivery, got {other:?}"),
    }
    // The ack was taken: closing the consuming channel gives nothing back to the queue.
    connection
        .call(
            consuming,
            AMQPClass::Channel(channel::AMQPMethod::Close(channel::Close {
                reply_code: 200,
                reply_text: "OK".into(),
                class_id: 0,
                method_id: 0,
            })),
        )
        .await
        .unwrap();
    match connection
        .call(channel, declare("split", true))
        .await
        .unwrap()
    {
        AMQPClass::Queue(queue::AMQPMethod::DeclareOk(ok)) => assert_eq!(ok.message_count, 0),
        other => panic!("expected declare-ok, got {other:?}"),
    }
    connection.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_tells_the_broker_s_refusals() {
    let data = TempDir::new("client-refusals");
    let server = start_server(&data.0).await;
    let address = server.local_address;

    let mut connection = open(&format!("amqp://guest:guest@{address}"))
        .await
        .unwrap();
    let channel = connection.open_channel().await.unwrap();
    match connection.call(channel, declare("missing", true)).await {
        Err(ClientError::ChannelClosed { code: 404, text }) => {
            assert!(text.contains("NOT_FOUND"), "{text}")
        }
        other => panic!("expected channel.close 404, got {other:?}"),
    }
    // The connection goes on: a new channel works.
    let channel = connection.open_channel().await.unwrap();
    connection
        .call(channel, declare("present", false))
        .await
        .unwrap();
    connection.close().await;

    match open(&format!("amqp://guest:wrong@{address}")).await {
        Err(ClientError::ConnectionClosed { code: 403, text }) => {
            assert!(text.contains("ACCESS_REFUSED"), "{text}")
        }
        other => panic!("expected connection.close 403, got {:?}", other.err()),
    }
    match open(&format!("amqps://guest:guest@{address}")).await {
        Err(ClientError::Unsupported(text)) => assert!(text.contains("amqp://"), "{text}"),
        other => panic!("expected amqps to be refused, got {:?}", other.err()),
    }
    server.stop().await;
}
