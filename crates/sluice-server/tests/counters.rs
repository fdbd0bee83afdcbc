//! Message counters where things happen: per queue, channel, connection and
//! vhost, as the management API and Prometheus will read them.

mod helpers;
mod support;

use helpers::*;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    BasicRejectOptions, ConfirmSelectOptions,
};
use lapin::types::FieldTable;
use lapin::BasicProperties;
use sluice_core::counters::MessageCounts;
use support::TestServer;

const BODY: &[u8] = &[b'x'; 100];

async fn publish_confirmed(channel: &lapin::Channel, exchange: &str, key: &str, mandatory: bool) {
    channel
        .basic_publish(
            exchange.into(),
            key.into(),
            BasicPublishOptions {
                mandatory,
                ..Default::default()
            },
            BODY,
            BasicProperties::default(),
        )
        .await
        .expect("basic.publish is sent")
        .await
        .expect("the publish is confirmed");
}

#[tokio::test]
async fn counters_count_publishes_deliveries_acks_and_confirms_where_they_happen() {
    let server = TestServer::start().await;
    let connection = connect(&server).await;
    let publisher = connection.create_channel().await.unwrap();
    let consumer_channel = connection.create_channel().await.unwrap();
    publisher
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    declare(&publisher, "q").await;
    for _ in 0..10 {
        publish_confirmed(&publisher, "", "q", false).await;
    }
    publish_confirmed(&publisher, "amq.direct", "nowhere", true).await;

    consumer_channel
        .basic_qos(20, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = consumer_channel
        .basic_consume(
            "q".into(),
            "c".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut deliveries = Vec::new();
    for _ in 0..10 {
        deliveries.push(next_delivery(&mut consumer).await);
    }
    // One goes back and comes again, redelivered.
    deliveries[0]
        .acker
        .nack(BasicNackOptions {
            requeue: true,
            ..Default::default()
        })
        .await
        .unwrap();
    let redelivered = next_delivery(&mut consumer).await;
    assert!(redelivered.redelivered);
    for delivery in deliveries.iter().skip(1).chain([&redelivered]) {
        delivery
            .acker
            .ack(BasicAckOptions::default())
            .await
            .unwrap();
    }
    // And one is rejected for good.
    publish_confirmed(&publisher, "", "q", false).await;
    next_delivery(&mut consumer)
        .await
        .acker
        .reject(BasicRejectOptions { requeue: false })
        .await
        .unwrap();

    let queue = server.queue("q");
    let expected_queue = MessageCounts {
        published: 11,
        published_bytes: 1100,
        delivered: 12,
        delivered_bytes: 1200,
        redelivered: 1,
        acked: 10,
        dropped: 1,
        ..MessageCounts::default()
    };
    eventually("the queue counted its messages", || {
        queue.counts() == expected_queue
    })
    .await;

    let vhost = server.running().broker.vhost("/").unwrap();
    let expected_vhost = MessageCounts {
        published: 12,
        published_bytes: 1200,
        routed: 11,
        returned_unroutable: 1,
        // The publisher's channel is in confirm mode.
        received_confirm: 12,
        confirmed: 12,
        delivered: 12,
        delivered_bytes: 1200,
        redelivered: 1,
        acked: 10,
        ..MessageCounts::default()
    };
    eventually("the vhost counted its messages", || {
        vhost.counts() == expected_vhost
    })
    .await;

    let snapshot = server
        .running()
        .connections()
        .into_iter()
        .next()
        .expect("the connection is listed");
    assert!(snapshot.received_bytes > 1200, "{snapshot:?}");
    assert!(snapshot.sent_bytes > 1200, "{snapshot:?}");
    let channel = |id: u16| {
        snapshot
            .channels
            .iter()
            .find(|channel| channel.channel_id == id)
            .map(|channel| channel.counts)
            .expect("the channel is listed")
    };
    let publishing = channel(publisher.id());
    assert_eq!(
        (
            publishing.published,
            publishing.routed,
            publishing.returned_unroutable,
            publishing.confirmed,
            publishing.delivered
        ),
        (12, 11, 1, 12, 0)
    );
    let consuming = channel(consumer_channel.id());
    assert_eq!(
        (
            consuming.published,
            consuming.delivered,
            consuming.redelivered,
            consuming.acked
        ),
        (0, 12, 1, 10)
    );

    consumer_channel.close(200, "bye".into()).await.unwrap();
    eventually("a closed channel is no longer listed", || {
        server.running().connections()[0].channels.len() == 1
    })
    .await;
    // The vhost's totals are its channels' added up: what closed channels
    // counted stays in them.
    assert_eq!(vhost.counts(), expected_vhost);
    connection.close(200, "bye".into()).await.unwrap();
    eventually("the closed connection is no longer listed", || {
        server.running().connections().is_empty()
    })
    .await;
    assert_eq!(vhost.counts(), expected_vhost);
    server.stop().await;
}
