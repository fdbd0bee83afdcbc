//! basic.consume/qos/ack/nack/reject/recover/get, channel.flow, and the
//! delivery semantics clients rely on (ordering, requeue positions).

mod helpers;
mod support;

use helpers::*;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicGetOptions, BasicNackOptions,
    BasicQosOptions, BasicRecoverOptions, BasicRejectOptions, ChannelFlowOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Consumer};
use support::TestServer;

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

fn body(delivery: &lapin::message::Delivery) -> String {
    String::from_utf8(delivery.data.clone()).unwrap()
}

async fn publish_numbered(channel: &Channel, queue: &str, count: usize) {
    for index in 0..count {
        publish(channel, "", queue, format!("m{index}").as_bytes()).await;
    }
}

async fn ready_count(channel: &Channel, queue: &str) -> u32 {
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap()
        .message_count()
}

#[tokio::test]
async fn consumers_per_consumer_prefetch_limits_unacked() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "q").await;
    channel
        .basic_qos(2, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = consume(&channel, "q", "c").await;
    publish_numbered(&channel, "q", 5).await;
    let first = next_delivery(&mut consumer).await;
    let second = next_delivery(&mut consumer).await;
    assert_eq!((body(&first), body(&second)), ("m0".into(), "m1".into()));
    assert_no_delivery(&mut consumer).await;
    first.acker.ack(BasicAckOptions::default()).await.unwrap();
    assert_eq!(body(&next_delivery(&mut consumer).await), "m2");
    assert_no_delivery(&mut consumer).await;
    // A multiple ack frees room for two more.
    channel
        .basic_ack(3, BasicAckOptions { multiple: true })
        .await
        .unwrap();
    assert_eq!(body(&next_delivery(&mut consumer).await), "m3");
    assert_eq!(body(&next_delivery(&mut consumer).await), "m4");
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn consumers_global_prefetch_is_shared_by_the_channel() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "a").await;
    declare(&channel, "b").await;
    channel
        .basic_qos(3, BasicQosOptions { global: true })
        .await
        .unwrap();
    let mut consumer_a = consume(&channel, "a", "ca").await;
    let mut consumer_b = consume(&channel, "b", "cb").await;
    publish_numbered(&channel, "a", 2).await;
    publish_numbered(&channel, "b", 2).await;
    next_delivery(&mut consumer_a).await;
    next_delivery(&mut consumer_a).await;
    let third = next_delivery(&mut consumer_b).await;
    assert_eq!(body(&third), "m0");
    assert_no_delivery(&mut consumer_b).await;
    third.acker.ack(BasicAckOptions::default()).await.unwrap();
    assert_eq!(body(&next_delivery(&mut consumer_b).await), "m1");
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

/// An ack settles only its own queue's messages, yet the room it frees
/// under a channel-wide prefetch belongs to the whole channel: a message
/// another queue could not deliver for lack of it goes out now.
#[tokio::test]
async fn consumers_global_prefetch_ack_on_one_queue_lets_another_deliver() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "a").await;
    declare(&channel, "b").await;
    channel
        .basic_qos(2, BasicQosOptions { global: true })
        .await
        .unwrap();
    let mut consumer_a = consume(&channel, "a", "ca").await;
    let mut consumer_b = consume(&channel, "b", "cb").await;
    publish_numbered(&channel, "a", 2).await;
    let first = next_delivery(&mut consumer_a).await;
    next_delivery(&mut consumer_a).await;
    publish_numbered(&channel, "b", 1).await;
    assert_no_delivery(&mut consumer_b).await;
    assert_eq!(ready_count(&channel, "b").await, 1, "b waits for room");
    first.acker.ack(BasicAckOptions::default()).await.unwrap();
    assert_eq!(body(&next_delivery(&mut consumer_b).await), "m0");
    assert_no_delivery(&mut consumer_a).await;
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn consumers_no_ack_consumers_settle_on_delivery() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "q").await;
    channel
        .basic_qos(1, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = consume_with(
        &channel,
        "q",
        "",
        BasicConsumeOptions {
            no_ack: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    publish_numbered(&channel, "q", 5).await;
    // Prefetch does not apply to no-ack consumers.
    for index in 0..5 {
        assert_eq!(
            body(&next_delivery(&mut consumer).await),
            format!("m{index}")
        );
    }
    channel
        .basic_cancel(consumer.tag(), BasicCancelOptions::default())
        .await
        .unwrap();
    channel.close(200, "done".into()).await.unwrap();
    // Nothing comes back when the channel closes: they were settled.
    let channel = connection.create_channel().await.unwrap();
    assert_eq!(ready_count(&channel, "q").await, 0);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn consumers_exclusive_consumer_refuses_others() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "q").await;
    let exclusive = BasicConsumeOptions {
        exclusive: true,
        ..Default::default()
    };
    // lapin cancels a consumer when its handle drops: keep them alive.
    let _only = consume_with(&channel, "q", "only", exclusive, FieldTable::default())
        .await
        .unwrap();
    let refused = (
        403,
        "ACCESS_REFUSED - queue 'q' in vhost '/' in exclusive use".to_owned(),
    );
    let other = connection.create_channel().await.unwrap();
    let error =
        amqp_error(consume_with(&other, "q", "", Default::default(), FieldTable::default()).await);
    assert_eq!(error, refused);
    // And an exclusive consumer cannot join a queue that has consumers.
    declare(&channel, "shared").await;
    let _first = consume(&channel, "shared", "first").await;
    let other = connection.create_channel().await.unwrap();
    let error =
        amqp_error(consume_with(&other, "shared", "", exclusive, FieldTable::default()).await);
    assert_eq!(
        error,
        (
            403,
            "ACCESS_REFUSED - queue 'shared' in vhost '/' in exclusive use".to_owned()
        )
    );
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn consumers_server_generated_tags_and_duplicate_tag_is_530() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "q").await;
    let first = consume(&channel, "q", "").await;
    let second = consume(&channel, "q", "").await;
    assert!(
        first.tag().as_str().starts_with("amq.ctag-"),
        "{}",
        first.tag()
    );
    assert_ne!(first.tag(), second.tag());
    let _dup = consume(&channel, "q", "dup").await;
    // The reuse is refused before the queue is looked up: a missing queue
    // still gets 530, as in RabbitMQ.
    let error = amqp_error(
        consume_with(
            &channel,
            "no-such-queue",
            "dup",
            Default::default(),
            FieldTable::default(),
        )
        .await,
    );
    assert_eq!(
        error,
        (
            530,
            "NOT_ALLOWED - attempt to reuse consumer tag 'dup'".to_owned()
        )
    );
    // A connection error: the whole connection is gone.
    assert!(connection.create_channel().await.is_err());
    server.stop().await;
}

#[tokio::test]
async fn consumers_higher_priority_first_while_it_has_room() {
    let server = TestServer::start().await;
    let connection = connect(&server).await;
    let high_channel = connection.create_channel().await.unwrap();
    let low_channel = connection.create_channel().await.unwrap();
    declare(&high_channel, "q").await;
    high_channel
        .basic_qos(2, BasicQosOptions::default())
        .await
        .unwrap();
    low_channel
        .basic_qos(10, BasicQosOptions::default())
        .await
        .unwrap();
    let mut low = consume(&low_channel, "q", "low").await;
    let mut high = consume_with(
        &high_channel,
        "q",
        "high",
        BasicConsumeOptions::default(),
        table(&[("x-priority", AMQPValue::LongInt(10))]),
    )
    .await
    .unwrap();
    publish_numbered(&high_channel, "q", 5).await;
    assert_eq!(body(&next_delivery(&mut high).await), "m0");
    assert_eq!(body(&next_delivery(&mut high).await), "m1");
    for expected in ["m2", "m3", "m4"] {
        assert_eq!(body(&next_delivery(&mut low).await), expected);
    }
    assert_no_delivery(&mut high).await;
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn consumers_cancel_by_client_stops_deliveries() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "q").await;
    let mut consumer = consume(&channel, "q", "c").await;
    publish(&channel, "", "q", b"before").await;
    let delivery = next_delivery(&mut consumer).await;
    delivery
        .acker
        .ack(BasicAckOptions::default())
        .await
        .unwrap();
    channel
        .basic_cancel("c".into(), BasicCancelOptions::default())
        .await
        .unwrap();
    publish(&channel, "", "q", b"after").await;
    assert_eq!(get_body(&channel, "q", true).await, Some(b"after".to_vec()));
    // Cancelling an unknown tag is fine, as in RabbitMQ.
    channel
        .basic_cancel("never".into(), BasicCancelOptions::default())
        .await
        .unwrap();
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn consumers_queue_deletion_cancels_consumers_lapin() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "doomed").await;
    let mut consumer = consume(&channel, "doomed", "c").await;
    let other = connection.create_channel().await.unwrap();
    other
        .queue_delete("doomed".into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    let end = tokio::time::timeout(
        ARRIVAL_TIMEOUT,
        futures_lite::StreamExt::next(&mut consumer),
    )
    .await
    .expect("the consumer ends in time");
    assert!(end.is_none(), "stream ended: {end:?}");
    // The channel stays usable.
    declare(&channel, "next").await;
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn consumers_queue_deletion_cancels_consumers_amqprs() {
    use amqprs::channel::{BasicConsumeArguments, QueueDeclareArguments, QueueDeleteArguments};
    let server = TestServer::start().await;
    let (connection, channel) = amqprs_open(&server).await;
    let mut events = record_events(&channel).await;
    channel
        .queue_declare(QueueDeclareArguments::new("doomed"))
        .await
        .unwrap();
    let (tag, _messages) = channel
        .basic_consume_rx(BasicConsumeArguments::new("doomed", "prs-consumer"))
        .await
        .unwrap();
    assert_eq!(tag, "prs-consumer");
    let other = connection.open_channel(None).await.unwrap();
    other
        .queue_delete(QueueDeleteArguments::new("doomed"))
        .await
        .unwrap();
    assert_eq!(
        next_event(&mut events).await,
        ChannelEvent::Cancel {
            consumer_tag: "prs-consumer".into()
        }
    );
    connection.close().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn consumers_round_robin_between_consumers() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "q").await;
    let no_ack = BasicConsumeOptions {
        no_ack: true,
        ..Default::default()
    };
    let mut first = consume_with(&channel, "q", "first", no_ack, FieldTable::default())
        .await
        .unwrap();
    let mut second = consume_with(&channel, "q", "second", no_ack, FieldTable::default())
        .await
        .unwrap();
    publish_numbered(&channel, "q", 6).await;
    let mut seen_first = Vec::new();
    let mut seen_second = Vec::new();
    for _ in 0..3 {
        seen_first.push(body(&next_delivery(&mut first).await));
        seen_second.push(body(&next_delivery(&mut second).await));
    }
    assert_eq!(seen_first, ["m0", "m2", "m4"]);
    assert_eq!(seen_second, ["m1", "m3", "m5"]);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn consumers_get_and_get_empty() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "q").await;
    publish_numbered(&channel, "q", 3).await;
    for (expected, left) in [("m0", 2), ("m1", 1), ("m2", 0)] {
        let message = channel
            .basic_get("q".into(), BasicGetOptions { no_ack: false })
            .await
            .unwrap()
            .expect("a message");
        assert_eq!(body(&message.delivery), expected);
        assert_eq!(message.message_count, left);
        assert!(!message.delivery.redelivered);
        message
            .delivery
            .acker
            .ack(BasicAckOptions::default())
            .await
            .unwrap();
    }
    assert!(channel
        .basic_get("q".into(), BasicGetOptions::default())
        .await
        .unwrap()
        .is_none());
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn consumers_ack_nack_reject_with_multiple_and_requeue() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "q").await;
    let mut consumer = consume(&channel, "q", "c").await;
    publish_numbered(&channel, "q", 5).await;
    let mut tags = Vec::new();
    for index in 0..5 {
        let delivery = next_delivery(&mut consumer).await;
        assert_eq!(body(&delivery), format!("m{index}"));
        assert!(!delivery.redelivered);
        tags.push(delivery.delivery_tag);
    }
    // nack multiple with requeue: m0 and m1 come back, redelivered, in order.
    channel
        .basic_nack(
            tags[1],
            BasicNackOptions {
                multiple: true,
                requeue: true,
            },
        )
        .await
        .unwrap();
    let again0 = next_delivery(&mut consumer).await;
    let again1 = next_delivery(&mut consumer).await;
    assert_eq!((body(&again0), body(&again1)), ("m0".into(), "m1".into()));
    assert!(again0.redelivered && again1.redelivered);
    // reject without requeue drops m2; reject with requeue brings m3 back.
    channel
        .basic_reject(tags[2], BasicRejectOptions { requeue: false })
        .await
        .unwrap();
    channel
        .basic_reject(tags[3], BasicRejectOptions { requeue: true })
        .await
        .unwrap();
    let again3 = next_delivery(&mut consumer).await;
    assert_eq!(body(&again3), "m3");
    assert!(again3.redelivered);
    // nack without requeue drops m4.
    channel
        .basic_nack(
            tags[4],
            BasicNackOptions {
                multiple: false,
                requeue: false,
            },
        )
        .await
        .unwrap();
    // Ack everything outstanding with one multiple ack.
    channel
        .basic_ack(again3.delivery_tag, BasicAckOptions { multiple: true })
        .await
        .unwrap();
    assert_no_delivery(&mut consumer).await;
    assert_eq!(ready_count(&channel, "q").await, 0);
    channel
        .basic_cancel("c".into(), BasicCancelOptions::default())
        .await
        .unwrap();
    channel.close(200, "done".into()).await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    assert_eq!(ready_count(&channel, "q").await, 0);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

/// In a transaction an ack takes its message when it arrives, as in
/// RabbitMQ: acking the same tag twice fails at the second ack, not at the
/// commit; a rollback makes the message unacked again; a committed ack
/// settles it; and acks never committed are requeued when the channel
/// closes.
#[tokio::test]
async fn consumers_acks_in_a_transaction_are_checked_when_they_arrive() {
    let server = TestServer::start().await;
    let (connection, observer) = open(&server).await;
    declare(&observer, "tx-acks").await;
    publish(&observer, "", "tx-acks", b"m1").await;
    publish(&observer, "", "tx-acks", b"m2").await;
    let queue = server.queue("tx-acks");
    eventually("both are in the queue", || queue.message_count() == 2).await;

    let channel = connection.create_channel().await.unwrap();
    channel.tx_select().await.unwrap();
    let get = |channel: lapin::Channel| async move {
        channel
            .basic_get("tx-acks".into(), BasicGetOptions { no_ack: false })
            .await
            .unwrap()
            .expect("a message")
            .delivery
    };
    let first = get(channel.clone()).await;
    assert_eq!(first.data, b"m1");
    // Acked, rolled back, acked again and committed: settled once.
    channel
        .basic_ack(first.delivery_tag, BasicAckOptions::default())
        .await
        .unwrap();
    channel.tx_rollback().await.unwrap();
    channel
        .basic_ack(first.delivery_tag, BasicAckOptions::default())
        .await
        .unwrap();
    channel.tx_commit().await.unwrap();
    // An ack in the transaction, then the same tag again: refused at once.
    let second = get(channel.clone()).await;
    assert_eq!(second.data, b"m2");
    let mut watcher = close_watcher(&channel).await;
    for _ in 0..2 {
        channel
            .basic_ack(second.delivery_tag, BasicAckOptions::default())
            .await
            .unwrap();
    }
    assert_eq!(
        channel_closed_with(&mut watcher).await,
        (
            406,
            format!(
                "PRECONDITION_FAILED - unknown delivery tag {}",
                second.delivery_tag
            )
        )
    );
    // The first ack was never committed: m2 is back, m1 is gone.
    eventually("m2 is requeued", || queue.message_count() == 1).await;
    assert_eq!(
        get_body(&observer, "tx-acks", true).await,
        Some(b"m2".to_vec())
    );
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn consumers_ack_of_unknown_tag_closes_the_channel_with_406() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    let mut watcher = close_watcher(&channel).await;
    channel
        .basic_ack(99, BasicAckOptions::default())
        .await
        .unwrap();
    let error = channel_closed_with(&mut watcher).await;
    assert_eq!(
        error,
        (
            406,
            "PRECONDITION_FAILED - unknown delivery tag 99".to_owned()
        )
    );
    // Only the channel closed.
    let channel = connection.create_channel().await.unwrap();
    declare(&channel, "still-fine").await;
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn consumers_recover_requeues_unacked_as_redelivered() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "q").await;
    let mut consumer = consume(&channel, "q", "c").await;
    publish_numbered(&channel, "q", 2).await;
    next_delivery(&mut consumer).await;
    next_delivery(&mut consumer).await;
    channel
        .basic_recover(BasicRecoverOptions { requeue: true })
        .await
        .unwrap();
    for expected in ["m0", "m1"] {
        let delivery = next_delivery(&mut consumer).await;
        assert_eq!(body(&delivery), expected);
        assert!(delivery.redelivered);
        delivery
            .acker
            .ack(BasicAckOptions::default())
            .await
            .unwrap();
    }
    assert_no_delivery(&mut consumer).await;
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn consumers_channel_flow_off_is_refused_as_rabbitmq_does() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    let active = channel
        .channel_flow(ChannelFlowOptions { active: true })
        .await
        .unwrap();
    assert!(active, "flow on is answered");
    let (code, text) = amqp_error(
        channel
            .channel_flow(ChannelFlowOptions { active: false })
            .await,
    );
    assert_eq!(code, 540);
    assert_eq!(text, "NOT_IMPLEMENTED - active=false");
    assert!(
        !connection.status().connected(),
        "540 closes the connection"
    );
    server.stop().await;
}

// ----- delivery semantics -----

#[tokio::test]
async fn consumers_ordering_of_ten_thousand_messages() {
    const COUNT: usize = 10_000;
    let server = TestServer::start().await;
    let connection = connect(&server).await;
    let publisher = connection.create_channel().await.unwrap();
    let receiver = connection.create_channel().await.unwrap();
    declare(&publisher, "ordered").await;
    receiver
        .basic_qos(500, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = consume(&receiver, "ordered", "c").await;
    let publishing = tokio::spawn(async move {
        for index in 0..COUNT {
            publish(&publisher, "", "ordered", index.to_string().as_bytes()).await;
        }
    });
    for expected in 0..COUNT {
        let delivery = next_delivery(&mut consumer).await;
        assert_eq!(body(&delivery), expected.to_string());
        if expected % 100 == 99 {
            receiver
                .basic_ack(delivery.delivery_tag, BasicAckOptions { multiple: true })
                .await
                .unwrap();
        }
    }
    publishing.await.unwrap();
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

/// Takes `count` deliveries without acking them.
async fn take_unacked(consumer: &mut Consumer, count: usize) {
    for index in 0..count {
        let delivery = next_delivery(consumer).await;
        assert_eq!(body(&delivery), format!("m{index}"));
    }
}

async fn assert_redelivered_in_order(channel: &Channel, queue: &str, count: usize) {
    let mut consumer = consume(channel, queue, "after").await;
    for index in 0..count {
        let delivery = next_delivery(&mut consumer).await;
        assert_eq!(body(&delivery), format!("m{index}"));
        assert!(delivery.redelivered, "m{index} is marked redelivered");
    }
}

#[tokio::test]
async fn consumers_unacked_of_closed_channel_requeued_in_order() {
    let server = TestServer::start().await;
    let connection = connect(&server).await;
    let channel = connection.create_channel().await.unwrap();
    declare(&channel, "q").await;
    publish_numbered(&channel, "q", 5).await;
    let mut consumer = consume(&channel, "q", "c").await;
    take_unacked(&mut consumer, 5).await;
    channel.close(200, "done".into()).await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    assert_redelivered_in_order(&channel, "q", 5).await;
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn consumers_unacked_of_closed_connection_requeued_in_order() {
    let server = TestServer::start().await;
    let (first, channel) = open(&server).await;
    declare(&channel, "q").await;
    publish_numbered(&channel, "q", 5).await;
    let mut consumer = consume(&channel, "q", "c").await;
    take_unacked(&mut consumer, 5).await;
    first.close(200, "gone".into()).await.unwrap();
    let (second, channel) = open(&server).await;
    assert_redelivered_in_order(&channel, "q", 5).await;
    second.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn consumers_requeued_messages_return_to_their_position() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "q").await;
    publish_numbered(&channel, "q", 4).await;
    let mut taken = Vec::new();
    for _ in 0..2 {
        taken.push(
            channel
                .basic_get("q".into(), BasicGetOptions { no_ack: false })
                .await
                .unwrap()
                .unwrap(),
        );
    }
    publish(&channel, "", "q", b"m4").await;
    // Requeue newest first: order must still be by original position.
    for message in taken.iter().rev() {
        channel
            .basic_reject(
                message.delivery.delivery_tag,
                BasicRejectOptions { requeue: true },
            )
            .await
            .unwrap();
    }
    for index in 0..5 {
        let message = channel
            .basic_get("q".into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(body(&message.delivery), format!("m{index}"));
        assert_eq!(message.delivery.redelivered, index < 2, "m{index}");
    }
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn consumers_amqprs_prefetch_and_manual_ack() {
    use amqprs::channel::{
        BasicAckArguments, BasicConsumeArguments, BasicPublishArguments, BasicQosArguments,
        QueueDeclareArguments,
    };
    let server = TestServer::start().await;
    let (connection, channel) = amqprs_open(&server).await;
    channel
        .queue_declare(QueueDeclareArguments::new("prs"))
        .await
        .unwrap();
    channel
        .basic_qos(BasicQosArguments::new(0, 1, false))
        .await
        .unwrap();
    let (_, mut messages) = channel
        .basic_consume_rx(BasicConsumeArguments::new("prs", "prs-c"))
        .await
        .unwrap();
    for body in ["a", "b"] {
        channel
            .basic_publish(
                amqprs::BasicProperties::default(),
                body.as_bytes().to_vec(),
                BasicPublishArguments::new("", "prs"),
            )
            .await
            .unwrap();
    }
    let first = tokio::time::timeout(ARRIVAL_TIMEOUT, messages.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.content.as_deref(), Some(&b"a"[..]));
    assert!(
        tokio::time::timeout(QUIET_PERIOD, messages.recv())
            .await
            .is_err(),
        "prefetch 1 holds back the second message"
    );
    let tag = first.deliver.unwrap().delivery_tag();
    channel
        .basic_ack(BasicAckArguments::new(tag, false))
        .await
        .unwrap();
    let second = tokio::time::timeout(ARRIVAL_TIMEOUT, messages.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second.content.as_deref(), Some(&b"b"[..]));
    connection.close().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn consumers_multiple_ack_beyond_outstanding_tags_is_406() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "q").await;
    publish_numbered(&channel, "q", 2).await;
    let mut watcher = close_watcher(&channel).await;
    let mut consumer = consume(&channel, "q", "c").await;
    next_delivery(&mut consumer).await;
    next_delivery(&mut consumer).await;
    // RabbitMQ settles nothing and closes the channel when the tag of a
    // multiple ack is not outstanding.
    channel
        .basic_ack(99, BasicAckOptions { multiple: true })
        .await
        .unwrap();
    assert_eq!(
        channel_closed_with(&mut watcher).await,
        (
            406,
            "PRECONDITION_FAILED - unknown delivery tag 99".to_owned()
        )
    );
    // Nothing was settled: both messages are back in the queue.
    let channel = connection.create_channel().await.unwrap();
    assert_eq!(ready_count(&channel, "q").await, 2);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

/// consume-ok reaches the client before any delivery to the new consumer,
/// even while another connection's publishes dispatch to the queue from
/// another thread: clients such as the Java one know a consumer tag only
/// from its consume-ok, and treat a delivery before it as unsolicited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_consume_ok_comes_before_any_delivery_under_concurrent_publishes() {
    use sluice_wire::amq_protocol::protocol::{basic, AMQPClass};
    use sluice_wire::amq_protocol::types::FieldTable as WireTable;
    use sluice_wire::frame::FrameType;
    use sluice_wire::method::{decode_method, Method};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use support::raw::RawClient;

    const ATTEMPTS: usize = 200;
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "busy").await;
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = {
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                publish(&channel, "", "busy", b"x").await;
            }
            channel
        })
    };
    let mut client = RawClient::open(server.address).await;
    client.open_channel(1).await;
    for attempt in 0..ATTEMPTS {
        let tag = format!("c{attempt}");
        client
            .send_method(
                1,
                AMQPClass::Basic(basic::AMQPMethod::Consume(basic::Consume {
                    queue: "busy".into(),
                    consumer_tag: tag.as_str().into(),
                    no_local: false,
                    no_ack: true,
                    exclusive: false,
                    nowait: false,
                    arguments: WireTable::default(),
                })),
            )
            .await;
        // Frames of earlier consumers (deliveries, cancel-oks) come first;
        // the first one naming this tag must be its consume-ok.
        loop {
            let frame = client
                .read_frame()
                .await
                .expect("the connection stays open");
            if frame.frame_type != FrameType::Method {
                continue;
            }
            match decode_method(&frame.payload).expect("server method decodes") {
                Method::Control(AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(ok)))
                    if ok.consumer_tag.as_str() == tag =>
                {
                    break
                }
                Method::Control(AMQPClass::Basic(basic::AMQPMethod::Deliver(deliver)))
                    if deliver.consumer_tag.as_str() == tag =>
                {
                    panic!("attempt {attempt}: a delivery to {tag} came before its consume-ok")
                }
                _ => {}
            }
        }
        client
            .send_method(
                1,
                AMQPClass::Basic(basic::AMQPMethod::Cancel(basic::Cancel {
                    consumer_tag: tag.as_str().into(),
                    nowait: true,
                })),
            )
            .await;
    }
    stop.store(true, Ordering::Relaxed);
    // Kept open until the connection closes.
    let _channel = publisher.await.unwrap();
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

/// Deleting a queue the same channel consumes from: RabbitMQ sends
/// delete-ok, then basic.cancel for the consumer; py-amqp (under kombu and
/// Celery) fails on the other order.
#[tokio::test]
async fn consumers_queue_delete_answers_delete_ok_before_the_consumer_cancel() {
    use sluice_wire::amq_protocol::protocol::{basic, queue, AMQPClass};
    use sluice_wire::amq_protocol::types::FieldTable as WireTable;
    use sluice_wire::method::Method;
    use support::raw::RawClient;
    let server = TestServer::start().await;
    let mut client = RawClient::open(server.address).await;
    client.open_channel(1).await;
    let methods = [
        AMQPClass::Queue(queue::AMQPMethod::Declare(queue::Declare {
            queue: "doomed".into(),
            passive: false,
            durable: false,
            exclusive: false,
            auto_delete: false,
            nowait: false,
            arguments: WireTable::default(),
        })),
        AMQPClass::Basic(basic::AMQPMethod::Consume(basic::Consume {
            queue: "doomed".into(),
            consumer_tag: "watcher".into(),
            no_local: false,
            no_ack: true,
            exclusive: false,
            nowait: false,
            arguments: WireTable::default(),
        })),
        AMQPClass::Queue(queue::AMQPMethod::Delete(queue::Delete {
            queue: "doomed".into(),
            if_unused: false,
            if_empty: false,
            nowait: false,
        })),
    ];
    for method in methods {
        client.send_method(1, method).await;
    }
    let mut seen = Vec::new();
    while seen.len() < 4 {
        let (_, method) = client.read_method().await;
        let name = match method {
            Method::Control(AMQPClass::Queue(queue::AMQPMethod::DeclareOk(_))) => "declare-ok",
            Method::Control(AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(_))) => "consume-ok",
            Method::Control(AMQPClass::Queue(queue::AMQPMethod::DeleteOk(_))) => "delete-ok",
            Method::Control(AMQPClass::Basic(basic::AMQPMethod::Cancel(cancel))) => {
                assert_eq!(cancel.consumer_tag.as_str(), "watcher");
                "cancel"
            }
            other => panic!("unexpected {other:?}"),
        };
        seen.push(name);
    }
    assert_eq!(seen, ["declare-ok", "consume-ok", "delete-ok", "cancel"]);
    server.stop().await;
}

#[tokio::test]
async fn consumers_delivery_unacked_past_consumer_timeout_closes_its_channel() {
    let server = TestServer::start_with(|config| config.consumer_timeout_ms = Some(300)).await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "slow").await;
    let mut watcher = close_watcher(&channel).await;
    let mut consumer = consume(&channel, "slow", "c").await;
    publish_numbered(&channel, "slow", 1).await;
    let delivery = next_delivery(&mut consumer).await;
    assert!(!delivery.redelivered);
    // Never acked: the channel is closed with RabbitMQ's words.
    let started = std::time::Instant::now();
    let error = channel_closed_with(&mut watcher).await;
    assert_eq!(
        error,
        (
            406,
            "PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out. Timeout value used: 300 ms. This timeout value can be configured, see consumers doc guide to learn more".to_owned()
        )
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    // The message went back, and a channel that keeps acking is left alone.
    let other = connection.create_channel().await.unwrap();
    let mut prompt = consume(&other, "slow", "prompt").await;
    let again = next_delivery(&mut prompt).await;
    assert_eq!(body(&again), "m0");
    assert!(again.redelivered);
    again.acker.ack(BasicAckOptions::default()).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    assert!(
        other.status().connected(),
        "a channel with nothing unacked stays open"
    );
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}
