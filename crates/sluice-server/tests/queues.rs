//! queue.* methods and queue properties, as RabbitMQ 3.10 clients see them.

mod helpers;
mod support;

use helpers::*;
use lapin::options::{
    BasicConsumeOptions, BasicGetOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions, QueuePurgeOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use support::TestServer;

fn passive() -> QueueDeclareOptions {
    QueueDeclareOptions {
        passive: true,
        ..Default::default()
    }
}

#[tokio::test]
async fn queues_passive_declare_of_missing_queue_is_404() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    let error = amqp_error(declare_with(&channel, "q", passive(), FieldTable::default()).await);
    assert_eq!(
        error,
        (404, "NOT_FOUND - no queue 'q' in vhost '/'".to_owned())
    );
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn queues_redeclare_with_other_durability_is_406() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "q").await;
    let error = amqp_error(
        declare_with(
            &channel,
            "q",
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await,
    );
    assert_eq!(
        error,
        (
            406,
            "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q' in vhost '/': received 'true' but current is 'false'"
                .to_owned()
        )
    );
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn queues_redeclare_with_other_max_length_is_406() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    let limited = |length| table(&[("x-max-length", AMQPValue::LongInt(length))]);
    declare_with(&channel, "q", QueueDeclareOptions::default(), limited(10))
        .await
        .unwrap();
    // Same value, and arguments RabbitMQ does not compare, are fine.
    let mut same = limited(10);
    same.insert("x-custom".into(), AMQPValue::Boolean(true));
    declare_with(&channel, "q", QueueDeclareOptions::default(), same)
        .await
        .unwrap();
    let error =
        amqp_error(declare_with(&channel, "q", QueueDeclareOptions::default(), limited(20)).await);
    assert_eq!(
        error,
        (
            406,
            "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'q' in vhost '/': received the value '20' of type 'signedint' but current is the value '10' of type 'signedint'"
                .to_owned()
        )
    );
    let channel = connection.create_channel().await.unwrap();
    let error = amqp_error(
        declare_with(
            &channel,
            "q",
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await,
    );
    assert_eq!(
        error,
        (
            406,
            "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'q' in vhost '/': received none but current is the value '10' of type 'signedint'"
                .to_owned()
        )
    );
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn queues_server_named_queues() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    let first = declare(&channel, "").await;
    let second = declare(&channel, "").await;
    for queue in [&first, &second] {
        let name = queue.name().as_str();
        assert!(name.starts_with("amq.gen-"), "{name}");
        assert_eq!(name.len(), "amq.gen-".len() + 22, "{name}");
    }
    assert_ne!(first.name(), second.name());
    // The generated name is usable, also through the default exchange.
    publish(&channel, "", second.name().as_str(), b"hi").await;
    assert_eq!(
        get_body(&channel, second.name().as_str(), true).await,
        Some(b"hi".to_vec())
    );
    // Clients may not pick amq.* names themselves.
    let error = amqp_error(
        declare_with(
            &channel,
            "amq.mine",
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await,
    );
    assert_eq!(
        error,
        (
            403,
            "ACCESS_REFUSED - queue name 'amq.mine' contains reserved prefix 'amq.*'".to_owned()
        )
    );
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn queues_exclusive_queue_is_locked_and_dies_with_its_connection() {
    let server = TestServer::start().await;
    let (owner, channel) = open(&server).await;
    declare_with(
        &channel,
        "mine",
        QueueDeclareOptions {
            exclusive: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    let locked = (
        405,
        "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'mine' in vhost '/'. It could be originally declared on another connection or the exclusive property value does not match that of the original declaration."
            .to_owned(),
    );
    let (other, other_channel) = open(&server).await;
    assert_eq!(
        amqp_error(declare_with(&other_channel, "mine", passive(), FieldTable::default()).await),
        locked
    );
    let other_channel = other.create_channel().await.unwrap();
    let consume = other_channel
        .basic_consume(
            "mine".into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await;
    assert_eq!(amqp_error(consume), locked);
    let other_channel = other.create_channel().await.unwrap();
    let get = other_channel
        .basic_get("mine".into(), BasicGetOptions::default())
        .await;
    assert_eq!(amqp_error(get), locked);
    // The owner may use it on any of its channels.
    let second_channel = owner.create_channel().await.unwrap();
    declare_with(&second_channel, "mine", passive(), FieldTable::default())
        .await
        .unwrap();
    // An exclusive queue is never durable, whatever the declare says, as in
    // RabbitMQ: redeclaring it durable is equivalent.
    declare_with(
        &second_channel,
        "mine",
        QueueDeclareOptions {
            exclusive: true,
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    // Redeclared by its owner as not exclusive: locked, checked before the
    // durable flag, as in RabbitMQ.
    let error = amqp_error(
        declare_with(
            &second_channel,
            "mine",
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await,
    );
    assert_eq!(error, locked);
    let other_channel = other.create_channel().await.unwrap();
    owner.close(200, "bye".into()).await.unwrap();
    // Gone by close-ok, as with RabbitMQ.
    let (code, _) =
        amqp_error(declare_with(&other_channel, "mine", passive(), FieldTable::default()).await);
    assert_eq!(
        code, 404,
        "the exclusive queue outlived its connection's close-ok"
    );
    other.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn queues_exclusive_queue_is_gone_for_every_client_at_its_owners_close_ok() {
    // A test suite's pattern (py-amqp's): each test declares the same
    // exclusive queue on a fresh connection the moment the last one closed.
    let server = TestServer::start().await;
    let (other, _) = open(&server).await;
    for round in 0..30 {
        let (owner, channel) = open(&server).await;
        declare_with(
            &channel,
            "suite-queue",
            QueueDeclareOptions {
                exclusive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap_or_else(|error| panic!("round {round}: {error}"));
        let other_channel = other.create_channel().await.unwrap();
        owner.close(200, "next test".into()).await.unwrap();
        let (code, text) = amqp_error(
            declare_with(
                &other_channel,
                "suite-queue",
                passive(),
                FieldTable::default(),
            )
            .await,
        );
        assert_eq!(code, 404, "round {round}: {text}");
    }
    server.stop().await;
}

#[tokio::test]
async fn queues_auto_delete_goes_with_its_last_consumer_only() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare_with(
        &channel,
        "transient",
        QueueDeclareOptions {
            auto_delete: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    // Never had a consumer: stays, even across a publish and get.
    publish(&channel, "", "transient", b"m").await;
    assert!(get_body(&channel, "transient", true).await.is_some());
    declare_with(&channel, "transient", passive(), FieldTable::default())
        .await
        .unwrap();
    let consume = || {
        channel.basic_consume(
            "transient".into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
    };
    let first = consume().await.unwrap();
    let second = consume().await.unwrap();
    channel
        .basic_cancel(first.tag(), Default::default())
        .await
        .unwrap();
    let queue = declare_with(&channel, "transient", passive(), FieldTable::default())
        .await
        .unwrap();
    assert_eq!(queue.consumer_count(), 1);
    channel
        .basic_cancel(second.tag(), Default::default())
        .await
        .unwrap();
    let (code, _) =
        amqp_error(declare_with(&channel, "transient", passive(), FieldTable::default()).await);
    assert_eq!(code, 404);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn queues_bind_unbind_and_purge() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "q").await;
    channel
        .queue_bind(
            "q".into(),
            "amq.direct".into(),
            "k".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    for _ in 0..3 {
        publish(&channel, "amq.direct", "k", b"m").await;
    }
    channel
        .queue_unbind(
            "q".into(),
            "amq.direct".into(),
            "k".into(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    publish(&channel, "amq.direct", "k", b"after unbind").await;
    let purged = channel
        .queue_purge("q".into(), QueuePurgeOptions::default())
        .await
        .unwrap();
    assert_eq!(purged, 3);
    assert_eq!(get_body(&channel, "q", true).await, None);
    // Binding to a missing exchange or queue is 404.
    let error = amqp_error(
        channel
            .queue_bind(
                "q".into(),
                "nowhere".into(),
                "k".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await,
    );
    assert_eq!(
        error,
        (
            404,
            "NOT_FOUND - no exchange 'nowhere' in vhost '/'".to_owned()
        )
    );
    let channel = connection.create_channel().await.unwrap();
    let error = amqp_error(
        channel
            .queue_bind(
                "nobody".into(),
                "amq.direct".into(),
                "k".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await,
    );
    assert_eq!(
        error,
        (404, "NOT_FOUND - no queue 'nobody' in vhost '/'".to_owned())
    );
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn queues_delete_if_unused_if_empty_and_count() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "q").await;
    publish(&channel, "", "q", b"1").await;
    publish(&channel, "", "q", b"2").await;
    let error = amqp_error(
        channel
            .queue_delete(
                "q".into(),
                QueueDeleteOptions {
                    if_empty: true,
                    ..Default::default()
                },
            )
            .await,
    );
    assert_eq!(
        error,
        (
            406,
            "PRECONDITION_FAILED - queue 'q' in vhost '/' not empty".to_owned()
        )
    );
    let channel = connection.create_channel().await.unwrap();
    // One message delivered and unacked, one still ready.
    channel
        .basic_qos(1, lapin::options::BasicQosOptions::default())
        .await
        .unwrap();
    let consumer = channel
        .basic_consume(
            "q".into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let queue = server.queue("q");
    eventually("one message is delivered", || queue.message_count() == 1).await;
    let other = connection.create_channel().await.unwrap();
    // Both conditions fail: emptiness is checked first, as in RabbitMQ.
    let error = amqp_error(
        other
            .queue_delete(
                "q".into(),
                QueueDeleteOptions {
                    if_unused: true,
                    if_empty: true,
                    ..Default::default()
                },
            )
            .await,
    );
    assert_eq!(
        error,
        (
            406,
            "PRECONDITION_FAILED - queue 'q' in vhost '/' not empty".to_owned()
        )
    );
    let other = connection.create_channel().await.unwrap();
    let error = amqp_error(
        other
            .queue_delete(
                "q".into(),
                QueueDeleteOptions {
                    if_unused: true,
                    ..Default::default()
                },
            )
            .await,
    );
    assert_eq!(
        error,
        (
            406,
            "PRECONDITION_FAILED - queue 'q' in vhost '/' in use".to_owned()
        )
    );
    channel
        .basic_cancel(consumer.tag(), Default::default())
        .await
        .unwrap();
    channel.close(200, "done".into()).await.unwrap();
    // Both messages are ready again after the channel closed.
    let channel = connection.create_channel().await.unwrap();
    let deleted = channel
        .queue_delete("q".into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    assert_eq!(deleted, 2);
    // Deleting a missing queue succeeds with a count of 0.
    let deleted = channel
        .queue_delete("q".into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    assert_eq!(deleted, 0);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn queues_declare_ok_counts_ready_messages_and_consumers() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "counted").await;
    for _ in 0..3 {
        publish(&channel, "", "counted", b"m").await;
    }
    let queue = declare(&channel, "counted").await;
    assert_eq!((queue.message_count(), queue.consumer_count()), (3, 0));
    channel.basic_qos(1, Default::default()).await.unwrap();
    let mut consumer = channel
        .basic_consume(
            "counted".into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    next_delivery(&mut consumer).await;
    // One out with the consumer (unacked), two ready.
    let queue = declare_with(&channel, "counted", passive(), FieldTable::default())
        .await
        .unwrap();
    assert_eq!((queue.message_count(), queue.consumer_count()), (2, 1));
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn queues_queue_type_classic_and_quorum_accepted_stream_refused() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare_with(
        &channel,
        "classic",
        QueueDeclareOptions::default(),
        table(&[("x-queue-type", text("classic"))]),
    )
    .await
    .unwrap();
    declare_with(
        &channel,
        "quorum",
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        table(&[("x-queue-type", text("quorum"))]),
    )
    .await
    .unwrap();
    for queue_type in ["stream"] {
        let channel = connection.create_channel().await.unwrap();
        let (code, text_) = amqp_error(
            declare_with(
                &channel,
                queue_type,
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                table(&[("x-queue-type", text(queue_type))]),
            )
            .await,
        );
        assert_eq!(code, 406, "{text_}");
        assert!(
            text_.starts_with("PRECONDITION_FAILED - ") && text_.contains("'x-queue-type'"),
            "{text_}"
        );
        assert!(text_.contains(queue_type), "{text_}");
    }
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn queues_empty_name_means_last_declared_queue() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    // A passive declare takes "" as the name it is, as RabbitMQ does.
    let error = amqp_error(declare_with(&channel, "", passive(), FieldTable::default()).await);
    assert_eq!(
        error,
        (404, "NOT_FOUND - no queue '' in vhost '/'".to_owned())
    );
    let channel = connection.create_channel().await.unwrap();
    let error = amqp_error(
        channel
            .queue_purge("".into(), QueuePurgeOptions::default())
            .await,
    );
    assert_eq!(
        error,
        (404, "NOT_FOUND - no previously declared queue".to_owned())
    );
    let channel = connection.create_channel().await.unwrap();
    let generated = declare(&channel, "").await;
    channel
        .queue_bind(
            "".into(),
            "amq.fanout".into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    publish(&channel, "amq.fanout", "", b"to the last").await;
    assert_eq!(
        get_body(&channel, "", true).await,
        Some(b"to the last".to_vec())
    );
    // No queue and no routing key: the key is the queue's name too, as in
    // RabbitMQ.
    channel
        .queue_bind(
            "".into(),
            "amq.direct".into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    publish(&channel, "amq.direct", "", b"empty key").await;
    publish(
        &channel,
        "amq.direct",
        generated.name().as_str(),
        b"by name",
    )
    .await;
    assert_eq!(
        get_body(&channel, "", true).await,
        Some(b"by name".to_vec())
    );
    assert_eq!(get_body(&channel, "", true).await, None);
    channel
        .queue_unbind(
            "".into(),
            "amq.direct".into(),
            "".into(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    publish(
        &channel,
        "amq.direct",
        generated.name().as_str(),
        b"unbound",
    )
    .await;
    assert_eq!(get_body(&channel, "", true).await, None);
    let deleted = channel
        .queue_delete("".into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    assert_eq!(deleted, 0);
    let (code, _) = amqp_error(
        declare_with(
            &channel,
            generated.name().as_str(),
            passive(),
            FieldTable::default(),
        )
        .await,
    );
    assert_eq!(code, 404);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn queues_max_length_drops_head() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare_with(
        &channel,
        "bounded",
        QueueDeclareOptions::default(),
        table(&[("x-max-length", AMQPValue::LongInt(2))]),
    )
    .await
    .unwrap();
    for body in ["1", "2", "3", "4"] {
        publish(&channel, "", "bounded", body.as_bytes()).await;
    }
    assert_eq!(
        get_body(&channel, "bounded", true).await,
        Some(b"3".to_vec())
    );
    assert_eq!(
        get_body(&channel, "bounded", true).await,
        Some(b"4".to_vec())
    );
    assert_eq!(get_body(&channel, "bounded", true).await, None);
    // Invalid limits are refused naming the argument.
    let (code, text_) = amqp_error(
        declare_with(
            &channel,
            "negative",
            QueueDeclareOptions::default(),
            table(&[("x-max-length", AMQPValue::LongInt(-1))]),
        )
        .await,
    );
    assert_eq!(code, 406);
    assert!(text_.contains("'x-max-length'"), "{text_}");
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn queues_amqprs_declare_purge_delete() {
    use amqprs::channel::{
        BasicPublishArguments, QueueDeclareArguments, QueueDeleteArguments, QueuePurgeArguments,
    };
    let server = TestServer::start().await;
    let (connection, channel) = amqprs_open(&server).await;
    let (name, messages, consumers) = channel
        .queue_declare(QueueDeclareArguments::default())
        .await
        .unwrap()
        .unwrap();
    assert!(name.starts_with("amq.gen-"), "{name}");
    assert_eq!((messages, consumers), (0, 0));
    for _ in 0..4 {
        channel
            .basic_publish(
                amqprs::BasicProperties::default(),
                b"m".to_vec(),
                BasicPublishArguments::new("", &name),
            )
            .await
            .unwrap();
    }
    let (_, messages, _) = channel
        .queue_declare(QueueDeclareArguments::new(&name).passive(true).finish())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(messages, 4);
    let purged = channel
        .queue_purge(QueuePurgeArguments::new(&name))
        .await
        .unwrap();
    assert_eq!(purged, Some(4));
    channel
        .basic_publish(
            amqprs::BasicProperties::default(),
            b"m".to_vec(),
            BasicPublishArguments::new("", &name),
        )
        .await
        .unwrap();
    let deleted = channel
        .queue_delete(QueueDeleteArguments::new(&name))
        .await
        .unwrap();
    assert_eq!(deleted, Some(1));
    connection.close().await.unwrap();
    server.stop().await;
}

/// Requeued messages count against `x-max-length` again: with drop-head,
/// the oldest go at once, as RabbitMQ's `requeue_and_run` trims before it
/// delivers.
#[tokio::test]
async fn queues_max_length_drop_head_applies_to_requeued_messages() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare_with(
        &channel,
        "bounded-requeue",
        QueueDeclareOptions::default(),
        table(&[("x-max-length", AMQPValue::LongInt(2))]),
    )
    .await
    .unwrap();
    let consumer_channel = connection.create_channel().await.unwrap();
    consumer_channel
        .basic_qos(2, lapin::options::BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = consumer_channel
        .basic_consume(
            "bounded-requeue".into(),
            "holder".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    publish(&channel, "", "bounded-requeue", b"1").await;
    publish(&channel, "", "bounded-requeue", b"2").await;
    next_delivery(&mut consumer).await;
    next_delivery(&mut consumer).await;
    publish(&channel, "", "bounded-requeue", b"3").await;
    publish(&channel, "", "bounded-requeue", b"4").await;
    let queue = server.queue("bounded-requeue");
    eventually("3 and 4 are ready", || queue.message_count() == 2).await;
    // 1 and 2 come back to the head: four ready, over the limit of two.
    consumer_channel.close(200, "bye".into()).await.unwrap();
    eventually("requeued", || queue.consumer_count() == 0).await;
    assert_eq!(queue.message_count(), 2);
    assert_eq!(
        get_body(&channel, "bounded-requeue", true).await,
        Some(b"3".to_vec())
    );
    assert_eq!(
        get_body(&channel, "bounded-requeue", true).await,
        Some(b"4".to_vec())
    );
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

/// A reply text quoting a 255-byte name is longer than the protocol's short
/// string: it is cut as RabbitMQ cuts it, and the connection carries on.
#[tokio::test]
async fn queues_error_quoting_a_longest_name_is_cut_to_fit_and_the_connection_lives() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    let name = "q".repeat(255);
    declare(&channel, &name).await;
    let redeclared = channel
        .queue_declare(
            name.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await;
    let (code, text) = amqp_error(redeclared);
    assert_eq!(code, 406);
    assert_eq!(text.len(), 255, "{text}");
    assert!(
        text.starts_with("PRECONDITION_FAILED - inequivalent arg 'durable'"),
        "{text}"
    );
    assert!(text.ends_with("..."), "{text}");
    let again = connection
        .create_channel()
        .await
        .expect("the connection lives");
    declare(&again, "after").await;
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}
