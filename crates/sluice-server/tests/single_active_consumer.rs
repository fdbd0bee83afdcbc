//! Single active consumer (`x-single-active-consumer: true`): one consumer
//! of the queue receives messages at a time, and the queue fails over to
//! the next one when it is cancelled or its channel or connection goes,
//! handing it the old one's unacked messages first, in order.

mod helpers;
mod support;

use helpers::*;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Consumer};
use sluice_wire::amq_protocol::protocol::{basic, AMQPClass};
use sluice_wire::frame::FrameType;
use sluice_wire::method::Method;
use support::raw::RawClient;
use support::TestServer;

async fn declare_single_active(channel: &Channel, name: &str) {
    declare_with(
        channel,
        name,
        QueueDeclareOptions::default(),
        table(&[("x-single-active-consumer", AMQPValue::Boolean(true))]),
    )
    .await
    .expect("queue declares");
}

async fn consume_with(
    channel: &Channel,
    queue: &str,
    tag: &str,
    options: BasicConsumeOptions,
    arguments: FieldTable,
) -> lapin::Result<Consumer> {
    channel
        .basic_consume(queue.into(), tag.into(), options, arguments)
        .await
}

async fn consume(channel: &Channel, queue: &str, tag: &str) -> Consumer {
    consume_with(
        channel,
        queue,
        tag,
        BasicConsumeOptions::default(),
        FieldTable::default(),
    )
    .await
    .expect("basic.consume succeeds")
}

async fn consume_with_priority(
    channel: &Channel,
    queue: &str,
    tag: &str,
    priority: i32,
) -> Consumer {
    consume_with(
        channel,
        queue,
        tag,
        BasicConsumeOptions::default(),
        table(&[("x-priority", AMQPValue::LongInt(priority))]),
    )
    .await
    .expect("basic.consume succeeds")
}

fn body(delivery: &lapin::message::Delivery) -> String {
    String::from_utf8(delivery.data.clone()).unwrap()
}

async fn publish_range(channel: &Channel, queue: &str, range: std::ops::Range<usize>) {
    for index in range {
        publish(channel, "", queue, format!("m{index}").as_bytes()).await;
    }
}

/// Receives the messages of `range` in order, acking each, and checks
/// their redelivered flags against `redelivered`.
async fn expect_range(
    consumer: &mut Consumer,
    range: std::ops::Range<usize>,
    redelivered: impl Fn(usize) -> bool,
) {
    for index in range {
        let delivery = next_delivery(consumer).await;
        assert_eq!(body(&delivery), format!("m{index}"));
        assert_eq!(delivery.redelivered, redelivered(index), "m{index}");
        delivery
            .acker
            .ack(BasicAckOptions::default())
            .await
            .unwrap();
    }
}

fn active_tag(server: &TestServer, queue: &str) -> Option<String> {
    server
        .queue(queue)
        .active_consumer_tag()
        .map(|tag| tag.to_string())
}

/// A consumer on a raw connection, so the test can end its TCP connection
/// abruptly, with no connection.close, as a crashed client would.
async fn raw_consumer(server: &TestServer, queue: &str, tag: &str, prefetch: u16) -> RawClient {
    let mut client = RawClient::open(server.address).await;
    client.open_channel(1).await;
    client
        .send_method(
            1,
            AMQPClass::Basic(basic::AMQPMethod::Qos(basic::Qos {
                prefetch_count: prefetch,
                global: false,
            })),
        )
        .await;
    match client.read_method().await {
        (1, Method::Control(AMQPClass::Basic(basic::AMQPMethod::QosOk(_)))) => {}
        other => panic!("expected basic.qos-ok, got {other:?}"),
    }
    client
        .send_method(
            1,
            AMQPClass::Basic(basic::AMQPMethod::Consume(basic::Consume {
                queue: queue.into(),
                consumer_tag: tag.into(),
                no_local: false,
                no_ack: false,
                exclusive: false,
                nowait: false,
                arguments: FieldTable::default(),
            })),
        )
        .await;
    match client.read_method().await {
        (1, Method::Control(AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(_)))) => {}
        other => panic!("expected basic.consume-ok, got {other:?}"),
    }
    client
}

/// The body of the next basic.deliver on a raw connection.
async fn raw_next_body(client: &mut RawClient) -> String {
    match client.read_method().await {
        (1, Method::Control(AMQPClass::Basic(basic::AMQPMethod::Deliver(_)))) => {}
        other => panic!("expected basic.deliver, got {other:?}"),
    }
    let header = client.read_frame().await.expect("a content header");
    assert_eq!(header.frame_type, FrameType::Header);
    let body = client.read_frame().await.expect("a body frame");
    assert_eq!(body.frame_type, FrameType::Body);
    String::from_utf8(body.payload.to_vec()).unwrap()
}

#[tokio::test]
async fn single_active_consumer_first_consumer_gets_everything() {
    let server = TestServer::start().await;
    let (first_connection, first_channel) = open(&server).await;
    let (second_connection, second_channel) = open(&server).await;
    declare_single_active(&first_channel, "q").await;
    let mut first = consume(&first_channel, "q", "first").await;
    let mut second = consume(&second_channel, "q", "second").await;
    assert_eq!(active_tag(&server, "q").as_deref(), Some("first"));
    publish_range(&first_channel, "q", 0..20).await;
    expect_range(&mut first, 0..20, |_| false).await;
    assert_no_delivery(&mut second).await;
    // Both count as consumers of the queue, as in RabbitMQ.
    assert_eq!(server.queue("q").consumer_count(), 2);
    first_connection.close(200, "bye".into()).await.unwrap();
    second_connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn single_active_consumer_busy_active_consumer_keeps_the_others_waiting() {
    let server = TestServer::start().await;
    let (first_connection, first_channel) = open(&server).await;
    let (second_connection, second_channel) = open(&server).await;
    declare_single_active(&first_channel, "q").await;
    first_channel
        .basic_qos(1, BasicQosOptions::default())
        .await
        .unwrap();
    let mut first = consume(&first_channel, "q", "first").await;
    let mut second = consume(&second_channel, "q", "second").await;
    publish_range(&first_channel, "q", 0..3).await;
    // At its prefetch limit the active consumer holds the queue: the
    // others are not offered the messages (RabbitMQ's documented
    // behaviour).
    let held = next_delivery(&mut first).await;
    assert_eq!(body(&held), "m0");
    assert_no_delivery(&mut second).await;
    eventually("two messages wait for the active consumer", || {
        ready_count(&server, "q") == 2
    })
    .await;
    held.acker.ack(BasicAckOptions::default()).await.unwrap();
    expect_range(&mut first, 1..3, |_| false).await;
    assert_no_delivery(&mut second).await;
    first_connection.close(200, "bye".into()).await.unwrap();
    second_connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

fn ready_count(server: &TestServer, queue: &str) -> u32 {
    server.queue(queue).message_count()
}

#[tokio::test]
async fn single_active_consumer_cancel_hands_the_rest_to_the_next() {
    let server = TestServer::start().await;
    let (first_connection, first_channel) = open(&server).await;
    let (second_connection, second_channel) = open(&server).await;
    declare_single_active(&first_channel, "q").await;
    first_channel
        .basic_qos(3, BasicQosOptions::default())
        .await
        .unwrap();
    let mut first = consume(&first_channel, "q", "first").await;
    let mut second = consume(&second_channel, "q", "second").await;
    publish_range(&first_channel, "q", 0..10).await;
    // The active consumer takes three and keeps them unacked.
    let mut held = Vec::new();
    for index in 0..3 {
        let delivery = next_delivery(&mut first).await;
        assert_eq!(body(&delivery), format!("m{index}"));
        held.push(delivery);
    }
    assert_no_delivery(&mut second).await;
    first_channel
        .basic_cancel("first".into(), BasicCancelOptions::default())
        .await
        .unwrap();
    assert_eq!(active_tag(&server, "q").as_deref(), Some("second"));
    // The rest goes to the new active consumer at once. basic.cancel does
    // not requeue what the cancelled consumer holds: that stays with its
    // channel until acked or the channel goes.
    expect_range(&mut second, 3..10, |_| false).await;
    eventually("only the cancelled consumer's three stay unacked", || {
        server.queue("q").stats().messages_unacknowledged == 3
    })
    .await;
    first_channel.close(200, "done".into()).await.unwrap();
    expect_range(&mut second, 0..3, |_| true).await;
    assert_no_delivery(&mut second).await;
    first_connection.close(200, "bye".into()).await.unwrap();
    second_connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn single_active_consumer_fails_over_when_the_connection_dies() {
    let server = TestServer::start().await;
    let (control_connection, control) = open(&server).await;
    declare_single_active(&control, "q").await;
    let mut doomed = raw_consumer(&server, "q", "doomed", 3).await;
    let (standby_connection, standby_channel) = open(&server).await;
    let mut standby = consume(&standby_channel, "q", "standby").await;
    publish_range(&control, "q", 0..10).await;
    for index in 0..3 {
        assert_eq!(raw_next_body(&mut doomed).await, format!("m{index}"));
    }
    assert_no_delivery(&mut standby).await;
    // The client dies: its socket closes with no connection.close.
    drop(doomed);
    // The standby takes over, starting with the three the dead consumer
    // had unacked, redelivered, then the rest, all in order.
    expect_range(&mut standby, 0..10, |index| index < 3).await;
    assert_no_delivery(&mut standby).await;
    assert_eq!(active_tag(&server, "q").as_deref(), Some("standby"));
    control_connection.close(200, "bye".into()).await.unwrap();
    standby_connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn single_active_consumer_three_consumers_fail_over_in_registration_order() {
    let server = TestServer::start().await;
    let (control_connection, control) = open(&server).await;
    declare_single_active(&control, "q").await;
    let (first_connection, first_channel) = open(&server).await;
    let (second_connection, second_channel) = open(&server).await;
    let (third_connection, third_channel) = open(&server).await;
    let mut first = consume(&first_channel, "q", "first").await;
    let mut second = consume(&second_channel, "q", "second").await;
    let mut third = consume(&third_channel, "q", "third").await;

    publish_range(&control, "q", 0..3).await;
    expect_range(&mut first, 0..3, |_| false).await;
    assert_no_delivery(&mut second).await;
    assert_no_delivery(&mut third).await;

    // The active consumer's channel closes: the second registered takes over.
    first_channel.close(200, "done".into()).await.unwrap();
    assert_eq!(active_tag(&server, "q").as_deref(), Some("second"));
    publish_range(&control, "q", 3..6).await;
    expect_range(&mut second, 3..6, |_| false).await;
    assert_no_delivery(&mut third).await;

    // Its connection closes: the third takes over.
    second_connection.close(200, "gone".into()).await.unwrap();
    eventually("the third consumer becomes active", || {
        active_tag(&server, "q").as_deref() == Some("third")
    })
    .await;
    publish_range(&control, "q", 6..9).await;
    expect_range(&mut third, 6..9, |_| false).await;

    // And with the last one gone, messages wait for a consumer.
    third_channel
        .basic_cancel("third".into(), BasicCancelOptions::default())
        .await
        .unwrap();
    assert_eq!(active_tag(&server, "q"), None);
    publish_range(&control, "q", 9..10).await;
    eventually("the message waits in the queue", || {
        ready_count(&server, "q") == 1
    })
    .await;
    control_connection.close(200, "bye".into()).await.unwrap();
    first_connection.close(200, "bye".into()).await.unwrap();
    third_connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn single_active_consumer_waiting_consumer_cancelled_changes_nothing() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare_single_active(&channel, "q").await;
    let mut first = consume(&channel, "q", "first").await;
    let _second = consume(&channel, "q", "second").await;
    let mut third = consume(&channel, "q", "third").await;
    channel
        .basic_cancel("second".into(), BasicCancelOptions::default())
        .await
        .unwrap();
    assert_eq!(active_tag(&server, "q").as_deref(), Some("first"));
    publish_range(&channel, "q", 0..3).await;
    expect_range(&mut first, 0..3, |_| false).await;
    assert_no_delivery(&mut third).await;
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

/// RabbitMQ 3.10 (`rabbit_amqqueue_process:handle_call({basic_consume, ..})`)
/// makes the first consumer registered active whatever its priority; when
/// it goes, the next is the head of its consumer priority queue: the
/// highest `x-priority`, the earliest registered among equals.
#[tokio::test]
async fn single_active_consumer_priorities_choose_only_the_successor() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare_single_active(&channel, "q").await;
    let mut low = consume_with_priority(&channel, "q", "low", 0).await;
    let mut high = consume_with_priority(&channel, "q", "high", 10).await;
    let mut high_later = consume_with_priority(&channel, "q", "high-later", 10).await;
    let mut middle = consume_with_priority(&channel, "q", "middle", 5).await;
    assert_eq!(active_tag(&server, "q").as_deref(), Some("low"));
    publish_range(&channel, "q", 0..2).await;
    expect_range(&mut low, 0..2, |_| false).await;
    assert_no_delivery(&mut high).await;

    channel
        .basic_cancel("low".into(), BasicCancelOptions::default())
        .await
        .unwrap();
    assert_eq!(active_tag(&server, "q").as_deref(), Some("high"));
    publish_range(&channel, "q", 2..4).await;
    expect_range(&mut high, 2..4, |_| false).await;
    assert_no_delivery(&mut high_later).await;
    assert_no_delivery(&mut middle).await;

    channel
        .basic_cancel("high".into(), BasicCancelOptions::default())
        .await
        .unwrap();
    assert_eq!(active_tag(&server, "q").as_deref(), Some("high-later"));
    channel
        .basic_cancel("high-later".into(), BasicCancelOptions::default())
        .await
        .unwrap();
    assert_eq!(active_tag(&server, "q").as_deref(), Some("middle"));
    publish_range(&channel, "q", 4..6).await;
    expect_range(&mut middle, 4..6, |_| false).await;
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

/// RabbitMQ answers an exclusive basic.consume on a single-active-consumer
/// queue with 403 ACCESS_REFUSED "... in exclusive use", even when the
/// queue has no consumer (`exclusive_consume_unavailable`).
#[tokio::test]
async fn single_active_consumer_exclusive_consume_is_refused() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare_single_active(&channel, "q").await;
    let exclusive = BasicConsumeOptions {
        exclusive: true,
        ..Default::default()
    };
    let error =
        amqp_error(consume_with(&channel, "q", "only", exclusive, FieldTable::default()).await);
    assert_eq!(
        error,
        (
            403,
            "ACCESS_REFUSED - queue 'q' in vhost '/' in exclusive use".to_owned()
        )
    );
    // A non-exclusive consumer is fine afterwards.
    let channel = connection.create_channel().await.unwrap();
    let mut consumer = consume(&channel, "q", "shared").await;
    publish_range(&channel, "q", 0..1).await;
    expect_range(&mut consumer, 0..1, |_| false).await;
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

/// `x-single-active-consumer: false` is an ordinary queue: round-robin.
#[tokio::test]
async fn single_active_consumer_false_is_round_robin() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare_with(
        &channel,
        "q",
        QueueDeclareOptions::default(),
        table(&[("x-single-active-consumer", AMQPValue::Boolean(false))]),
    )
    .await
    .unwrap();
    let mut first = consume(&channel, "q", "first").await;
    let mut second = consume(&channel, "q", "second").await;
    assert_eq!(active_tag(&server, "q"), None);
    publish_range(&channel, "q", 0..4).await;
    let first_bodies = [
        body(&next_delivery(&mut first).await),
        body(&next_delivery(&mut first).await),
    ];
    let second_bodies = [
        body(&next_delivery(&mut second).await),
        body(&next_delivery(&mut second).await),
    ];
    assert_eq!(first_bodies, ["m0".to_owned(), "m2".to_owned()]);
    assert_eq!(second_bodies, ["m1".to_owned(), "m3".to_owned()]);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}
