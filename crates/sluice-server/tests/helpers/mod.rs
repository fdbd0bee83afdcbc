//! Client-side helpers shared by the AMQP method tests: connecting with
//! lapin and amqprs, reading reply codes out of errors, waiting on
//! deliveries with a bound instead of sleeping.
#![allow(dead_code)]

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use amqprs::callbacks::ChannelCallback;
use amqprs::channel::Channel as AmqprsChannel;
use amqprs::connection::{Connection as AmqprsConnection, OpenConnectionArguments};
use amqprs::{Ack, BasicProperties as AmqprsProperties, Cancel, CloseChannel, Nack, Return};
use futures_lite::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicPublishOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, Consumer};
use tokio::sync::mpsc;

use crate::support::TestServer;

/// How long a test waits for something that should arrive.
pub const ARRIVAL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a test waits to be sure that nothing arrives.
pub const QUIET_PERIOD: Duration = Duration::from_millis(200);

pub async fn connect(server: &TestServer) -> Connection {
    Connection::connect(&server.uri(), ConnectionProperties::default())
        .await
        .expect("lapin connects")
}

pub async fn open(server: &TestServer) -> (Connection, Channel) {
    let connection = connect(server).await;
    let channel = connection.create_channel().await.expect("channel opens");
    (connection, channel)
}

/// The reply code and text of the AMQP error `result` must hold.
pub fn amqp_error<T: std::fmt::Debug>(result: lapin::Result<T>) -> (u16, String) {
    let error = result.expect_err("expected the broker to refuse");
    match error.kind() {
        lapin::ErrorKind::ProtocolError(error) => (error.get_id(), error.get_message().to_string()),
        other => panic!("expected an AMQP protocol error, got {other:?}"),
    }
}

pub fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
    let mut table = FieldTable::default();
    for (key, value) in entries {
        table.insert((*key).into(), value.clone());
    }
    table
}

pub fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(value.into())
}

pub async fn declare(channel: &Channel, name: &str) -> lapin::Queue {
    declare_with(
        channel,
        name,
        QueueDeclareOptions::default(),
        FieldTable::default(),
    )
    .await
    .expect("queue declares")
}

pub async fn declare_with(
    channel: &Channel,
    name: &str,
    options: QueueDeclareOptions,
    arguments: FieldTable,
) -> lapin::Result<lapin::Queue> {
    channel.queue_declare(name.into(), options, arguments).await
}

pub async fn publish(channel: &Channel, exchange: &str, routing_key: &str, body: &[u8]) {
    publish_with(
        channel,
        exchange,
        routing_key,
        body,
        BasicProperties::default(),
    )
    .await;
}

pub async fn publish_with(
    channel: &Channel,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    properties: BasicProperties,
) {
    channel
        .basic_publish(
            exchange.into(),
            routing_key.into(),
            BasicPublishOptions::default(),
            body,
            properties,
        )
        .await
        .expect("publish is sent");
}

/// A consumer with prefetch 1, tagged "stuck", that takes one message from
/// `queue` and never acks it: the queue cannot drain.
pub async fn stuck_consumer(channel: &Channel, queue: &str) -> Consumer {
    consumer_with_prefetch(channel, queue, "stuck", 1).await
}

/// Subscribes to `queue` as `tag` after setting the channel's prefetch.
pub async fn consumer_with_prefetch(
    channel: &Channel,
    queue: &str,
    tag: &str,
    prefetch: u16,
) -> Consumer {
    channel
        .basic_qos(prefetch, lapin::options::BasicQosOptions::default())
        .await
        .unwrap();
    channel
        .basic_consume(
            queue.into(),
            tag.into(),
            lapin::options::BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap()
}

/// The first entry of a dead-lettered message's `x-death` header.
pub fn first_death(delivery: &Delivery) -> FieldTable {
    let death = delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|headers| headers.inner().get("x-death").cloned());
    let Some(AMQPValue::FieldArray(deaths)) = death else {
        panic!("x-death is set: {death:?}");
    };
    let Some(AMQPValue::FieldTable(first)) = deaths.as_slice().first().cloned() else {
        panic!("one death");
    };
    first
}

/// The next delivery, failing the test after [`ARRIVAL_TIMEOUT`].
pub async fn next_delivery(consumer: &mut Consumer) -> Delivery {
    tokio::time::timeout(ARRIVAL_TIMEOUT, consumer.next())
        .await
        .expect("a delivery arrives in time")
        .expect("the consumer is still running")
        .expect("the delivery is well formed")
}

/// Waits [`QUIET_PERIOD`] and fails if anything is delivered meanwhile.
pub async fn assert_no_delivery(consumer: &mut Consumer) {
    if let Ok(item) = tokio::time::timeout(QUIET_PERIOD, consumer.next()).await {
        match item {
            Some(Ok(delivery)) => panic!(
                "unexpected delivery of {:?}",
                String::from_utf8_lossy(&delivery.data)
            ),
            other => panic!("consumer ended unexpectedly: {other:?}"),
        }
    }
}

/// The body of the next basic.get, or None for get-empty.
pub async fn get_body(channel: &Channel, queue: &str, no_ack: bool) -> Option<Vec<u8>> {
    channel
        .basic_get(queue.into(), lapin::options::BasicGetOptions { no_ack })
        .await
        .expect("basic.get answers")
        .map(|message| message.delivery.data.clone())
}

// ----- amqprs -----

pub async fn amqprs_open(server: &TestServer) -> (AmqprsConnection, AmqprsChannel) {
    let arguments = OpenConnectionArguments::new(
        &server.address.ip().to_string(),
        server.address.port(),
        "guest",
        "guest",
    );
    let connection = AmqprsConnection::open(&arguments)
        .await
        .expect("amqprs connects");
    let channel = connection.open_channel(None).await.expect("channel opens");
    (connection, channel)
}

/// What the broker sent to an amqprs channel outside RPC replies.
#[derive(Debug, PartialEq, Eq)]
pub enum ChannelEvent {
    Ack { delivery_tag: u64, multiple: bool },
    Nack { delivery_tag: u64, multiple: bool },
    Cancel { consumer_tag: String },
    Close { reply_code: u16, reply_text: String },
    Return { reply_code: u16, reply_text: String },
}

/// An amqprs channel callback forwarding every event to a test.
pub struct Recorder(pub mpsc::UnboundedSender<ChannelEvent>);

pub async fn record_events(channel: &AmqprsChannel) -> mpsc::UnboundedReceiver<ChannelEvent> {
    let (sender, receiver) = mpsc::unbounded_channel();
    channel
        .register_callback(Recorder(sender))
        .await
        .expect("callback registers");
    receiver
}

pub async fn next_event(events: &mut mpsc::UnboundedReceiver<ChannelEvent>) -> ChannelEvent {
    tokio::time::timeout(ARRIVAL_TIMEOUT, events.recv())
        .await
        .expect("an event arrives in time")
        .expect("the recorder is alive")
}

type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

// Written out by hand: the trait is declared with `async_trait`, which is
// not a dependency of these tests.
impl ChannelCallback for Recorder {
    fn close<'a, 'b, 'c>(
        &'a mut self,
        _channel: &'b AmqprsChannel,
        close: CloseChannel,
    ) -> Boxed<'c, Result<(), amqprs::error::Error>>
    where
        'a: 'c,
        'b: 'c,
        Self: 'c,
    {
        Box::pin(async move {
            let _ = self.0.send(ChannelEvent::Close {
                reply_code: close.reply_code(),
                reply_text: close.reply_text().clone(),
            });
            Ok(())
        })
    }

    fn cancel<'a, 'b, 'c>(
        &'a mut self,
        _channel: &'b AmqprsChannel,
        cancel: Cancel,
    ) -> Boxed<'c, Result<(), amqprs::error::Error>>
    where
        'a: 'c,
        'b: 'c,
        Self: 'c,
    {
        Box::pin(async move {
            let _ = self.0.send(ChannelEvent::Cancel {
                consumer_tag: cancel.consumer_tag().clone(),
            });
            Ok(())
        })
    }

    fn flow<'a, 'b, 'c>(
        &'a mut self,
        _channel: &'b AmqprsChannel,
        active: bool,
    ) -> Boxed<'c, Result<bool, amqprs::error::Error>>
    where
        'a: 'c,
        'b: 'c,
        Self: 'c,
    {
        Box::pin(async move { Ok(active) })
    }

    fn publish_ack<'a, 'b, 'c>(&'a mut self, _channel: &'b AmqprsChannel, ack: Ack) -> Boxed<'c, ()>
    where
        'a: 'c,
        'b: 'c,
        Self: 'c,
    {
        Box::pin(async move {
            let _ = self.0.send(ChannelEvent::Ack {
                delivery_tag: ack.delivery_tag(),
                multiple: ack.mutiple(),
            });
        })
    }

    fn publish_nack<'a, 'b, 'c>(
        &'a mut self,
        _channel: &'b AmqprsChannel,
        nack: Nack,
    ) -> Boxed<'c, ()>
    where
        'a: 'c,
        'b: 'c,
        Self: 'c,
    {
        Box::pin(async move {
            let _ = self.0.send(ChannelEvent::Nack {
                delivery_tag: nack.delivery_tag(),
                multiple: nack.multiple(),
            });
        })
    }

    fn publish_return<'a, 'b, 'c>(
        &'a mut self,
        _channel: &'b AmqprsChannel,
        ret: Return,
        _basic_properties: AmqprsProperties,
        _content: Vec<u8>,
    ) -> Boxed<'c, ()>
    where
        'a: 'c,
        'b: 'c,
        Self: 'c,
    {
        Box::pin(async move {
            let _ = self.0.send(ChannelEvent::Return {
                reply_code: ret.reply_code(),
                reply_text: ret.reply_text().clone(),
            });
        })
    }
}

/// A consumer that only watches `channel` for the error closing it: lapin
/// hands a channel's close reason to its consumers, which is race free where
/// a method sent after the failing one might find the channel already closed.
pub async fn close_watcher(channel: &Channel) -> Consumer {
    let queue = declare_with(
        channel,
        "",
        QueueDeclareOptions {
            exclusive: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .expect("watcher queue declares");
    channel
        .basic_consume(
            queue.name().clone(),
            "close-watcher".into(),
            lapin::options::BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("watcher consumes")
}

/// The reply code and text the watched channel was closed with.
pub async fn channel_closed_with(watcher: &mut Consumer) -> (u16, String) {
    let item = tokio::time::timeout(ARRIVAL_TIMEOUT, watcher.next())
        .await
        .expect("the channel closes in time");
    match item {
        Some(Err(error)) => amqp_error::<()>(Err(error)),
        other => panic!("expected the channel's close error, got {other:?}"),
    }
}

/// Polls `condition` every 10 ms until it holds, failing the test with
/// `what` after [`ARRIVAL_TIMEOUT`].
pub async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + ARRIVAL_TIMEOUT;
    while !condition() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Properties with the per-message `expiration`, in milliseconds.
pub fn expiring_in(milliseconds: &str) -> BasicProperties {
    BasicProperties::default().with_expiration(milliseconds.into())
}
