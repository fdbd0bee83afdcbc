//! Publishing: mandatory returns, publisher confirms, transactions, and
//! publishes the broker refuses.

mod helpers;
mod support;

use helpers::*;
use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation};
use support::TestServer;

async fn publish_confirmed(
    channel: &Channel,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    mandatory: bool,
) -> lapin::PublisherConfirm {
    channel
        .basic_publish(
            exchange.into(),
            routing_key.into(),
            BasicPublishOptions {
                mandatory,
                ..Default::default()
            },
            body,
            BasicProperties::default(),
        )
        .await
        .expect("publish is sent")
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

fn reject_publish_arguments(max_length: i32) -> FieldTable {
    table(&[
        ("x-max-length", AMQPValue::LongInt(max_length)),
        ("x-overflow", text("reject-publish")),
    ])
}

#[tokio::test]
async fn publishing_mandatory_unroutable_is_returned_then_acked() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let confirm = publish_confirmed(&channel, "amq.direct", "nobody", b"bounce", true).await;
    let confirmation = tokio::time::timeout(ARRIVAL_TIMEOUT, confirm)
        .await
        .unwrap()
        .unwrap();
    // lapin attaches a basic.return to the ack that follows it.
    let Confirmation::Ack(Some(returned)) = confirmation else {
        panic!("expected an ack carrying the return, got {confirmation:?}");
    };
    assert_eq!(returned.reply_code, 312);
    assert_eq!(returned.reply_text.as_str(), "NO_ROUTE");
    assert_eq!(returned.delivery.data, b"bounce");
    assert_eq!(returned.delivery.exchange.as_str(), "amq.direct");
    assert_eq!(returned.delivery.routing_key.as_str(), "nobody");
    // Unroutable without mandatory: silently dropped, still acked.
    let confirm = publish_confirmed(&channel, "amq.direct", "nobody", b"dropped", false).await;
    assert_eq!(confirm.await.unwrap(), Confirmation::Ack(None));
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn publishing_amqprs_return_comes_before_the_ack() {
    use amqprs::channel::{BasicPublishArguments, ConfirmSelectArguments};
    let server = TestServer::start().await;
    let (connection, channel) = amqprs_open(&server).await;
    let mut events = record_events(&channel).await;
    channel
        .confirm_select(ConfirmSelectArguments::default())
        .await
        .unwrap();
    channel
        .basic_publish(
            amqprs::BasicProperties::default(),
            b"bounce".to_vec(),
            BasicPublishArguments::new("amq.topic", "no.route")
                .mandatory(true)
                .finish(),
        )
        .await
        .unwrap();
    assert_eq!(
        next_event(&mut events).await,
        ChannelEvent::Return {
            reply_code: 312,
            reply_text: "NO_ROUTE".into()
        }
    );
    assert_eq!(
        next_event(&mut events).await,
        ChannelEvent::Ack {
            delivery_tag: 1,
            multiple: false
        }
    );
    connection.close().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn publishing_confirms_ack_every_publish() {
    const COUNT: usize = 2_000;
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "confirmed").await;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mut confirms = Vec::with_capacity(COUNT);
    for index in 0..COUNT {
        confirms.push(
            publish_confirmed(
                &channel,
                "",
                "confirmed",
                index.to_string().as_bytes(),
                false,
            )
            .await,
        );
    }
    for confirm in confirms {
        let confirmation = tokio::time::timeout(ARRIVAL_TIMEOUT, confirm)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(confirmation, Confirmation::Ack(None));
    }
    assert_eq!(ready_count(&channel, "confirmed").await, COUNT as u32);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn publishing_confirms_use_multiple_acks_for_batches() {
    use amqprs::channel::{BasicPublishArguments, ConfirmSelectArguments, QueueDeclareArguments};
    const COUNT: u64 = 1_000;
    let server = TestServer::start().await;
    let (connection, channel) = amqprs_open(&server).await;
    let mut events = record_events(&channel).await;
    channel
        .queue_declare(QueueDeclareArguments::new("batched"))
        .await
        .unwrap();
    channel
        .confirm_select(ConfirmSelectArguments::default())
        .await
        .unwrap();
    for _ in 0..COUNT {
        channel
            .basic_publish(
                amqprs::BasicProperties::default(),
                b"m".to_vec(),
                BasicPublishArguments::new("", "batched"),
            )
            .await
            .unwrap();
    }
    let mut confirmed_through = 0;
    let mut ack_frames = 0;
    while confirmed_through < COUNT {
        match next_event(&mut events).await {
            ChannelEvent::Ack {
                delivery_tag,
                multiple,
            } => {
                ack_frames += 1;
                assert!(delivery_tag > confirmed_through, "acks only move forward");
                if !multiple {
                    assert_eq!(
                        delivery_tag,
                        confirmed_through + 1,
                        "a single ack skips none"
                    );
                }
                confirmed_through = delivery_tag;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(confirmed_through, COUNT);
    assert!(
        ack_frames < COUNT,
        "pipelined publishes are confirmed with multiple acks ({ack_frames} ack frames)"
    );
    connection.close().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn publishing_reject_publish_overflow_is_nacked() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare_with(
        &channel,
        "full",
        QueueDeclareOptions::default(),
        reject_publish_arguments(2),
    )
    .await
    .unwrap();
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mut outcomes = Vec::new();
    for body in ["1", "2", "3", "4"] {
        let confirm = publish_confirmed(&channel, "", "full", body.as_bytes(), false).await;
        outcomes.push(confirm.await.unwrap().is_ack());
    }
    assert_eq!(outcomes, [true, true, false, false]);
    // Room again after a consumer takes one: the next publish is accepted.
    assert_eq!(get_body(&channel, "full", true).await, Some(b"1".to_vec()));
    let confirm = publish_confirmed(&channel, "", "full", b"5", false).await;
    assert!(confirm.await.unwrap().is_ack());
    assert_eq!(get_body(&channel, "full", true).await, Some(b"2".to_vec()));
    assert_eq!(get_body(&channel, "full", true).await, Some(b"5".to_vec()));
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn publishing_amqprs_reject_publish_nack() {
    use amqprs::channel::{BasicPublishArguments, ConfirmSelectArguments, QueueDeclareArguments};
    let server = TestServer::start().await;
    let (connection, channel) = amqprs_open(&server).await;
    let mut events = record_events(&channel).await;
    let mut arguments = amqprs::FieldTable::new();
    arguments.insert("x-max-length".try_into().unwrap(), amqprs::FieldValue::I(1));
    arguments.insert(
        "x-overflow".try_into().unwrap(),
        amqprs::FieldValue::S("reject-publish".try_into().unwrap()),
    );
    channel
        .queue_declare(
            QueueDeclareArguments::new("prs-full")
                .arguments(arguments)
                .finish(),
        )
        .await
        .unwrap();
    channel
        .confirm_select(ConfirmSelectArguments::default())
        .await
        .unwrap();
    for _ in 0..2 {
        channel
            .basic_publish(
                amqprs::BasicProperties::default(),
                b"m".to_vec(),
                BasicPublishArguments::new("", "prs-full"),
            )
            .await
            .unwrap();
    }
    assert_eq!(
        next_event(&mut events).await,
        ChannelEvent::Ack {
            delivery_tag: 1,
            multiple: false
        }
    );
    assert_eq!(
        next_event(&mut events).await,
        ChannelEvent::Nack {
            delivery_tag: 2,
            multiple: false
        }
    );
    connection.close().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn publishing_tx_commit_makes_messages_visible() {
    let server = TestServer::start().await;
    let connection = connect(&server).await;
    let tx_channel = connection.create_channel().await.unwrap();
    let observer = connection.create_channel().await.unwrap();
    declare(&observer, "txq").await;
    tx_channel.tx_select().await.unwrap();
    publish(&tx_channel, "", "txq", b"1").await;
    publish(&tx_channel, "", "txq", b"2").await;
    assert_eq!(ready_count(&observer, "txq").await, 0);
    tx_channel.tx_commit().await.unwrap();
    assert_eq!(ready_count(&observer, "txq").await, 2);
    // Still transactional after a commit.
    publish(&tx_channel, "", "txq", b"3").await;
    assert_eq!(ready_count(&observer, "txq").await, 2);
    tx_channel.tx_commit().await.unwrap();
    for expected in ["1", "2", "3"] {
        assert_eq!(
            get_body(&observer, "txq", true).await,
            Some(expected.as_bytes().to_vec())
        );
    }
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

/// A queue that refuses a committed message (`reject-publish` at its
/// limit) fails the commit with RabbitMQ's "partial tx completion"; what the
/// other queues took stays.
#[tokio::test]
async fn publishing_tx_commit_refused_by_a_queue_is_a_partial_completion() {
    let server = TestServer::start().await;
    let connection = connect(&server).await;
    let observer = connection.create_channel().await.unwrap();
    declare_with(
        &observer,
        "one-only",
        Default::default(),
        table(&[
            ("x-max-length", AMQPValue::LongInt(1)),
            ("x-overflow", text("reject-publish")),
        ]),
    )
    .await
    .unwrap();
    let tx_channel = connection.create_channel().await.unwrap();
    tx_channel.tx_select().await.unwrap();
    publish(&tx_channel, "", "one-only", b"fits").await;
    publish(&tx_channel, "", "one-only", b"refused").await;
    let (code, text) = amqp_error(tx_channel.tx_commit().await);
    assert_eq!(
        (code, text.as_str()),
        (406, "PRECONDITION_FAILED - partial tx completion")
    );
    assert_eq!(
        get_body(&observer, "one-only", true).await,
        Some(b"fits".to_vec())
    );
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn publishing_tx_rollback_discards() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "txq").await;
    channel.tx_select().await.unwrap();
    publish(&channel, "", "txq", b"discarded").await;
    channel.tx_rollback().await.unwrap();
    channel.tx_commit().await.unwrap();
    assert_eq!(ready_count(&channel, "txq").await, 0);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn publishing_tx_acks_take_effect_on_commit() {
    let server = TestServer::start().await;
    let connection = connect(&server).await;
    let setup = connection.create_channel().await.unwrap();
    declare(&setup, "txq").await;
    publish(&setup, "", "txq", b"work").await;
    // An ack rolled back leaves the message unacked: it returns when the
    // channel closes.
    let channel = connection.create_channel().await.unwrap();
    channel.tx_select().await.unwrap();
    let message = channel
        .basic_get("txq".into(), BasicGetOptions { no_ack: false })
        .await
        .unwrap()
        .unwrap();
    channel
        .basic_ack(message.delivery.delivery_tag, BasicAckOptions::default())
        .await
        .unwrap();
    channel.tx_rollback().await.unwrap();
    channel.close(200, "done".into()).await.unwrap();
    assert_eq!(ready_count(&setup, "txq").await, 1);
    // A committed ack settles it for good.
    let channel = connection.create_channel().await.unwrap();
    channel.tx_select().await.unwrap();
    let message = channel
        .basic_get("txq".into(), BasicGetOptions { no_ack: false })
        .await
        .unwrap()
        .unwrap();
    assert!(message.delivery.redelivered);
    channel
        .basic_ack(message.delivery.delivery_tag, BasicAckOptions::default())
        .await
        .unwrap();
    channel.tx_commit().await.unwrap();
    channel.close(200, "done".into()).await.unwrap();
    assert_eq!(ready_count(&setup, "txq").await, 0);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn publishing_tx_and_confirm_modes_exclude_each_other() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    channel.tx_select().await.unwrap();
    let error = amqp_error(
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await,
    );
    assert_eq!(
        error,
        (
            406,
            "PRECONDITION_FAILED - cannot switch from tx to confirm mode".to_owned()
        )
    );
    let channel = connection.create_channel().await.unwrap();
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let error = amqp_error(channel.tx_select().await);
    assert_eq!(
        error,
        (
            406,
            "PRECONDITION_FAILED - cannot switch from confirm to tx mode".to_owned()
        )
    );
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn publishing_tx_commit_or_rollback_without_select_is_406() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    let not_transactional = (
        406,
        "PRECONDITION_FAILED - channel is not transactional".to_owned(),
    );
    assert_eq!(amqp_error(channel.tx_commit().await), not_transactional);
    let channel = connection.create_channel().await.unwrap();
    assert_eq!(amqp_error(channel.tx_rollback().await), not_transactional);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn publishing_to_a_missing_exchange_closes_the_channel_with_404() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    let mut watcher = close_watcher(&channel).await;
    publish(&channel, "nowhere", "k", b"lost").await;
    let error = channel_closed_with(&mut watcher).await;
    assert_eq!(
        error,
        (
            404,
            "NOT_FOUND - no exchange 'nowhere' in vhost '/'".to_owned()
        )
    );
    // The connection is unharmed.
    let channel = connection.create_channel().await.unwrap();
    declare(&channel, "fine").await;
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn publishing_amqprs_missing_exchange_in_tx_fails_at_publish() {
    use amqprs::channel::BasicPublishArguments;
    let server = TestServer::start().await;
    let (connection, channel) = amqprs_open(&server).await;
    let mut events = record_events(&channel).await;
    channel.tx_select().await.unwrap();
    channel
        .basic_publish(
            amqprs::BasicProperties::default(),
            b"lost".to_vec(),
            BasicPublishArguments::new("nowhere", "k"),
        )
        .await
        .unwrap();
    // RabbitMQ checks the exchange when the publish arrives, not at commit.
    assert_eq!(
        next_event(&mut events).await,
        ChannelEvent::Close {
            reply_code: 404,
            reply_text: "NOT_FOUND - no exchange 'nowhere' in vhost '/'".into()
        }
    );
    connection.close().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn publishing_transactions_together_are_bounded_by_a_share_of_the_watermark() {
    // Bounded: were the memory alarm to go off in this process (its RSS
    // counts), the publishes would wait instead of failing.
    tokio::time::timeout(
        std::time::Duration::from_secs(60),
        transactions_together_are_bounded(),
    )
    .await
    .expect("the test finishes within 60 s");
}

async fn transactions_together_are_bounded() {
    // A quarter of the watermark for all open transactions: 128 MiB.
    let server = TestServer::start_with(|config| {
        config.vm_memory_high_watermark_absolute_bytes = Some(512 << 20);
    })
    .await;
    let (connection, setup) = open(&server).await;
    declare(&setup, "txq").await;
    let second = connection.create_channel().await.unwrap();
    let mut second_closed = close_watcher(&second).await;
    let first = connection.create_channel().await.unwrap();
    first.tx_select().await.unwrap();
    second.tx_select().await.unwrap();
    // Held, not yet committed: 80 MiB.
    publish_mebibytes(&first, 80).await.unwrap();
    // 60 MiB more would pass the node's bound: that channel closes.
    let refused = match publish_mebibytes(&second, 60).await {
        Ok(()) => second.tx_commit().await,
        Err(error) => Err(error),
    };
    assert!(refused.is_err());
    assert_eq!(
        channel_closed_with(&mut second_closed).await,
        (
            406,
            format!(
                "PRECONDITION_FAILED - transactions on this node hold more than {} bytes of uncommitted messages",
                128 << 20
            )
        )
    );
    // The first commits whole; what the closed one held was given back.
    first.tx_commit().await.unwrap();
    assert_eq!(ready_count(&setup, "txq").await, 80);
    let third = connection.create_channel().await.unwrap();
    third.tx_select().await.unwrap();
    publish_mebibytes(&third, 100).await.unwrap();
    third.tx_commit().await.unwrap();
    assert_eq!(ready_count(&setup, "txq").await, 180);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

/// Publishes `count` messages of 1 MiB to `txq`.
async fn publish_mebibytes(channel: &Channel, count: usize) -> lapin::Result<()> {
    let body = vec![7u8; 1 << 20];
    for _ in 0..count {
        channel
            .basic_publish(
                "".into(),
                "txq".into(),
                BasicPublishOptions::default(),
                &body,
                BasicProperties::default(),
            )
            .await?;
    }
    Ok(())
}
