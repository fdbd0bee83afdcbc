//! The queue machine against a simple model: every message is in exactly
//! one place (ready, held by one consumer, gone), and every effect and
//! reply the machine gives is one the model allows. Random command
//! sequences, random queue rules.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::command::{
    Command, ConsumerId, ConsumerSpec, DeadLetterReason, Effect, Overflow, QueueConfig, Reply,
};
use super::machine::QueueMachine;

fn consumer(connection: u64, tag: &str) -> ConsumerId {
    ConsumerId {
        connection,
        channel: 1,
        tag: tag.to_owned(),
    }
}

fn spec(prefetch: u32) -> ConsumerSpec {
    ConsumerSpec {
        prefetch,
        no_ack: false,
        priority: 0,
    }
}

fn enqueue() -> Command {
    Command::Enqueue {
        publisher: None,
        size: 10,
        ttl_ms: None,
    }
}

fn deliveries(effects: &[Effect]) -> Vec<(String, u64, u64, u32)> {
    effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::Deliver {
                consumer,
                delivery,
                message,
            } => Some((
                consumer.tag.clone(),
                *delivery,
                message.index,
                message.delivery_count,
            )),
            Effect::DeadLetter { .. } => None,
        })
        .collect()
}

#[test]
fn quorum_machine_serves_in_order_within_prefetch_and_returns_first() {
    let mut machine = QueueMachine::new(QueueConfig::default());
    for index in 1..=5 {
        machine.apply(index, 0, enqueue());
    }
    let (_, effects) = machine.apply(
        6,
        0,
        Command::Checkout {
            consumer: consumer(1, "a"),
            spec: spec(2),
        },
    );
    assert_eq!(
        deliveries(&effects),
        [("a".into(), 0, 1, 0), ("a".into(), 1, 2, 0)]
    );
    // Returning the first puts it ahead of the rest, counted.
    let (_, effects) = machine.apply(
        7,
        0,
        Command::Return {
            consumer: consumer(1, "a"),
            deliveries: vec![0],
        },
    );
    assert_eq!(deliveries(&effects), [("a".into(), 2, 1, 1)]);
    assert_eq!(machine.release_cursor(), 1);
    let (_, effects) = machine.apply(
        8,
        0,
        Command::Settle {
            consumer: consumer(1, "a"),
            deliveries: vec![1, 2],
        },
    );
    assert_eq!(
        deliveries(&effects),
        [("a".into(), 3, 3, 0), ("a".into(), 4, 4, 0)]
    );
    assert_eq!(machine.release_cursor(), 3);
    let stats = machine.stats();
    assert_eq!(
        (stats.messages_ready, stats.messages_unacknowledged),
        (1, 2)
    );
}

#[test]
fn quorum_machine_dead_letters_past_the_delivery_limit_and_on_expiry() {
    let mut machine = QueueMachine::new(QueueConfig {
        delivery_limit: Some(1),
        message_ttl_ms: Some(100),
        ..QueueConfig::default()
    });
    machine.apply(1, 0, enqueue());
    let a = consumer(1, "a");
    machine.apply(
        2,
        10,
        Command::Checkout {
            consumer: a.clone(),
            spec: spec(1),
        },
    );
    let back = |delivery| Command::Return {
        consumer: consumer(1, "a"),
        deliveries: vec![delivery],
    };
    let (_, effects) = machine.apply(3, 20, back(0));
    assert_eq!(deliveries(&effects), [("a".into(), 1, 1, 1)]);
    let (_, effects) = machine.apply(4, 30, back(1));
    assert!(matches!(
        effects.as_slice(),
        [Effect::DeadLetter {
            reason: DeadLetterReason::DeliveryLimit,
            ..
        }]
    ));
    // A message nobody takes expires at the head once log time passes.
    machine.apply(5, 40, Command::Cancel { consumer: a });
    machine.apply(6, 50, enqueue());
    let (_, effects) = machine.apply(7, 149, Command::Tick);
    assert!(effects.is_empty());
    let (_, effects) = machine.apply(8, 150, Command::Tick);
    assert!(matches!(
        effects.as_slice(),
        [Effect::DeadLetter {
            reason: DeadLetterReason::Expired,
            ..
        }]
    ));
    assert_eq!(machine.release_cursor(), 9);
}

#[test]
fn quorum_machine_keeps_dead_letters_until_settled_with_at_least_once() {
    let mut machine = QueueMachine::new(QueueConfig {
        max_length: Some(2),
        overflow: Overflow::RejectPublish,
        delivery_limit: Some(0),
        dead_letter_at_least_once: true,
        ..QueueConfig::default()
    });
    machine.apply(1, 0, enqueue());
    machine.apply(2, 0, enqueue());
    let holder = consumer(1, "a");
    let (_, effects) = machine.apply(
        3,
        0,
        Command::Checkout {
            consumer: holder.clone(),
            spec: spec(1),
        },
    );
    assert_eq!(deliveries(&effects), [("a".into(), 0, 1, 0)]);
    // Rejected: no dead-letter effect (nothing leaves yet); it waits, and
    // still counts against the length limit, and its entry is needed.
    let (_, effects) = machine.apply(
        4,
        0,
        Command::Discard {
            consumer: holder.clone(),
            deliveries: vec![0],
        },
    );
    assert!(!effects
        .iter()
        .any(|effect| matches!(effect, Effect::DeadLetter { .. })));
    let waiting = machine.dead_lettered(10);
    assert_eq!(waiting.len(), 1);
    assert_eq!(waiting[0].0, DeadLetterReason::Rejected);
    assert_eq!(waiting[0].1.index, 1);
    assert_eq!(machine.oldest_live(), Some(1));
    // Held messages do not count against x-max-length (as in RabbitMQ);
    // the one waiting does: one more fits, then the queue is full.
    assert_eq!(machine.apply(5, 0, enqueue()).0, Reply::Enqueued);
    assert_eq!(machine.apply(6, 0, enqueue()).0, Reply::Rejected);
    // Returned past the delivery limit: waits too.
    machine.apply(
        7,
        0,
        Command::Return {
            consumer: holder.clone(),
            deliveries: vec![1],
        },
    );
    let indexes: Vec<u64> = machine
        .dead_lettered(10)
        .iter()
        .map(|(_, message)| message.index)
        .collect();
    assert_eq!(indexes, [1, 2]);
    assert_eq!(
        machine.dead_lettered(10)[1].0,
        DeadLetterReason::DeliveryLimit
    );
    // Safe in the targets: gone, and their room is back.
    machine.apply(8, 0, Command::DeadLettered { indexes: vec![1] });
    assert_eq!(machine.dead_lettered(10).len(), 1);
    assert_eq!(machine.oldest_live(), Some(2));
    assert_eq!(machine.apply(9, 0, enqueue()).0, Reply::Enqueued);
    machine.apply(
        10,
        0,
        Command::DeadLettered {
            indexes: vec![2, 77],
        },
    );
    assert!(!machine.has_dead_lettered());
    assert_eq!(machine.oldest_live(), Some(5));
}

#[test]
fn quorum_machine_length_limits_drop_the_head_or_refuse() {
    let mut dropping = QueueMachine::new(QueueConfig {
        max_length: Some(2),
        ..QueueConfig::default()
    });
    let mut refusing = QueueMachine::new(QueueConfig {
        max_length: Some(2),
        overflow: Overflow::RejectPublish,
        ..QueueConfig::default()
    });
    for index in 1..=3 {
        dropping.apply(index, 0, enqueue());
    }
    assert_eq!(dropping.release_cursor(), 2);
    let replies: Vec<Reply> = (1..=3)
        .map(|index| refusing.apply(index, 0, enqueue()).0)
        .collect();
    assert_eq!(replies, [Reply::Enqueued, Reply::Enqueued, Reply::Rejected]);
    assert_eq!(refusing.stats().messages_ready, 2);
}

#[test]
fn quorum_machine_resent_publish_is_enqueued_once() {
    let mut machine = QueueMachine::new(QueueConfig::default());
    let publish = |sequence| Command::Enqueue {
        publisher: Some((7 << 16 | 1, sequence)),
        size: 1,
        ttl_ms: None,
    };
    assert_eq!(machine.apply(1, 0, publish(1)).0, Reply::Enqueued);
    assert_eq!(machine.apply(2, 0, publish(1)).0, Reply::Enqueued);
    assert_eq!(machine.stats().messages_ready, 1);
    // The publisher's connection closed: its numbering starts over.
    machine.apply(3, 0, Command::ConnectionDown { connection: 7 });
    machine.apply(4, 0, publish(1));
    assert_eq!(machine.stats().messages_ready, 2);
}

#[test]
fn quorum_machine_single_active_consumer_hands_over_in_subscription_order() {
    let mut machine = QueueMachine::new(QueueConfig {
        single_active_consumer: true,
        ..QueueConfig::default()
    });
    for (index, (connection, tag)) in [(1, "a"), (2, "b")].into_iter().enumerate() {
        machine.apply(
            index as u64 + 1,
            0,
            Command::Checkout {
                consumer: consumer(connection, tag),
                spec: spec(10),
            },
        );
    }
    let (_, effects) = machine.apply(3, 0, enqueue());
    assert_eq!(deliveries(&effects), [("a".into(), 0, 3, 0)]);
    // a's connection dies: its message goes back, to b.
    let (_, effects) = machine.apply(4, 0, Command::ConnectionDown { connection: 1 });
    assert_eq!(deliveries(&effects), [("b".into(), 0, 3, 1)]);
    assert_eq!(machine.active_consumer(), Some(&consumer(2, "b")));
}

#[test]
fn quorum_machine_consumer_down_returns_what_that_consumer_alone_held() {
    let mut machine = QueueMachine::new(QueueConfig::default());
    // Two consumers of one connection, one message each.
    for (index, tag) in ["a", "b"].into_iter().enumerate() {
        machine.apply(
            index as u64 + 1,
            0,
            Command::Checkout {
                consumer: consumer(1, tag),
                spec: spec(1),
            },
        );
    }
    let (_, first) = machine.apply(3, 0, enqueue());
    let (_, second) = machine.apply(4, 0, enqueue());
    assert_eq!(
        [deliveries(&first), deliveries(&second)].concat(),
        [("a".into(), 0, 3, 0), ("b".into(), 0, 4, 0)]
    );
    // a is gone (its member left): its message goes back, and to b once
    // b has room; b keeps its own.
    let (reply, effects) = machine.apply(
        5,
        0,
        Command::ConsumerDown {
            consumer: consumer(1, "a"),
        },
    );
    assert_eq!(reply, Reply::Ok);
    assert!(deliveries(&effects).is_empty());
    assert_eq!(machine.stats().messages_ready, 1);
    assert_eq!(machine.stats().consumers, 1);
    let (_, effects) = machine.apply(
        6,
        0,
        Command::Settle {
            consumer: consumer(1, "b"),
            deliveries: vec![0],
        },
    );
    assert_eq!(deliveries(&effects), [("b".into(), 1, 3, 1)]);
}

/// One step of a random run: what to do, with numbers the harness maps
/// onto what exists at that moment.
#[derive(Clone, Debug)]
enum Step {
    Enqueue {
        publisher: Option<u8>,
        resend: bool,
        size: u8,
        ttl: Option<u8>,
    },
    Checkout {
        consumer: u8,
        prefetch: u8,
        no_ack: bool,
        priority: i8,
    },
    Cancel(u8),
    Settle(u8, u8),
    Return(u8, u8),
    Discard(u8, u8),
    Bogus(u8),
    Down(u8),
    /// One consumer is gone (its member left), its deliveries returned.
    Gone(u8),
    Purge,
    Tick,
    /// At-least-once dead-lettering settles the `pick`-th message waiting.
    DeadLettered(u8),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (proptest::option::of(0u8..2), any::<bool>(), any::<u8>(), proptest::option::of(0u8..60))
            .prop_map(|(publisher, resend, size, ttl)| Step::Enqueue { publisher, resend, size, ttl }),
        1 => (0u8..4, 0u8..4, proptest::bool::weighted(0.2), -1i8..2)
            .prop_map(|(consumer, prefetch, no_ack, priority)| Step::Checkout { consumer, prefetch, no_ack, priority }),
        1 => (0u8..4).prop_map(Step::Cancel),
        3 => (0u8..4, any::<u8>()).prop_map(|(c, pick)| Step::Settle(c, pick)),
        1 => (0u8..4, any::<u8>()).prop_map(|(c, pick)| Step::Return(c, pick)),
        1 => (0u8..4, any::<u8>()).prop_map(|(c, pick)| Step::Discard(c, pick)),
        1 => (0u8..4).prop_map(Step::Bogus),
        1 => (0u8..3).prop_map(Step::Down),
        1 => (0u8..4).prop_map(Step::Gone),
        1 => Just(Step::Purge),
        1 => Just(Step::Tick),
        1 => any::<u8>().prop_map(Step::DeadLettered),
    ]
}

fn config() -> impl Strategy<Value = QueueConfig> {
    (
        proptest::option::of(0u64..6),
        proptest::option::of(0u64..600),
        any::<bool>(),
        proptest::option::of(0u32..3),
        proptest::option::of(0u64..80),
        proptest::bool::weighted(0.3),
        any::<bool>(),
    )
        .prop_map(
            |(
                max_length,
                max_length_bytes,
                reject,
                delivery_limit,
                message_ttl_ms,
                sac,
                at_least_once,
            )| {
                QueueConfig {
                    max_length,
                    max_length_bytes,
                    overflow: if reject {
                        Overflow::RejectPublish
                    } else {
                        Overflow::DropHead
                    },
                    delivery_limit,
                    message_ttl_ms,
                    single_active_consumer: sac,
                    expires_ms: None,
                    // As the queue's arguments allow it: with reject-publish.
                    dead_letter_at_least_once: reject && at_least_once,
                }
            },
        )
}

/// Where a message is, as the model follows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    Ready,
    Held {
        consumer: u8,
        delivery: u64,
    },
    /// Dead-lettered at least once: in the queue until settled as such.
    DeadLettering,
}

#[derive(Default)]
struct Model {
    /// Messages in the queue, by index.
    places: BTreeMap<u64, Place>,
    /// Deliveries each consumer holds: delivery → index.
    held: BTreeMap<u8, BTreeMap<u64, u64>>,
    prefetch: BTreeMap<u8, (u32, bool)>,
    /// Consumers subscribed and not cancelled.
    subscribed: BTreeSet<u8>,
    /// The highest index delivered for the first time so far: fresh
    /// messages go out in index order.
    last_fresh: u64,
    /// The sequence number each publisher sends next (the generator's),
    /// and the highest the machine has seen from it.
    publisher_sequence: [u64; 2],
    last_seen: BTreeMap<u64, u64>,
    /// Body sizes, by index.
    sizes: BTreeMap<u64, u64>,
}

fn id_of(consumer: u8) -> ConsumerId {
    ConsumerId {
        connection: u64::from(consumer % 3),
        channel: 1,
        tag: format!("c{consumer}"),
    }
}

fn tag_number(id: &ConsumerId) -> u8 {
    id.tag[1..].parse().expect("c<number>")
}

impl Model {
    fn ready(&self) -> u64 {
        self.places
            .values()
            .filter(|place| **place == Place::Ready)
            .count() as u64
    }

    /// Messages waiting for at-least-once dead-lettering, and their bytes:
    /// they count against the length limits.
    fn dead_lettering(&self) -> (u64, u64) {
        let waiting: Vec<u64> = self
            .places
            .iter()
            .filter(|(_, place)| **place == Place::DeadLettering)
            .map(|(index, _)| *index)
            .collect();
        (
            waiting.len() as u64,
            waiting.iter().map(|index| self.sizes[index]).sum(),
        )
    }

    /// Checks what the machine keeps for at-least-once dead-lettering
    /// against the model: what joined came from the queue for a reason
    /// the model allows, what left was settled by `settled`.
    fn reconcile_dead_lettering(
        &mut self,
        machine: &QueueMachine,
        settled: &[u64],
    ) -> Result<(), TestCaseError> {
        let waiting = machine.dead_lettered(usize::MAX);
        let now: BTreeSet<u64> = waiting.iter().map(|(_, message)| message.index).collect();
        for (reason, message) in &waiting {
            let place = self.places.get(&message.index).copied();
            if place == Some(Place::DeadLettering) {
                continue;
            }
            match reason {
                DeadLetterReason::Expired => {
                    prop_assert_eq!(place, Some(Place::Ready), "expired from the ready ones")
                }
                DeadLetterReason::MaxLen => {
                    prop_assert!(false, "no maxlen dead-lettering under reject-publish")
                }
                DeadLetterReason::Rejected | DeadLetterReason::DeliveryLimit => {
                    prop_assert!(place.is_some(), "{:?} of a message in the queue", reason)
                }
            }
            self.places.insert(message.index, Place::DeadLettering);
        }
        let gone: Vec<u64> = self
            .places
            .iter()
            .filter(|(index, place)| **place == Place::DeadLettering && !now.contains(index))
            .map(|(index, _)| *index)
            .collect();
        for index in gone {
            prop_assert!(settled.contains(&index), "only settled dead letters leave");
            self.places.remove(&index);
        }
        Ok(())
    }

    fn ready_bytes(&self) -> u64 {
        self.places
            .iter()
            .filter(|(_, place)| **place == Place::Ready)
            .map(|(index, _)| self.sizes[index])
            .sum()
    }

    fn pick(&self, consumer: u8, pick: u8) -> Option<u64> {
        let held = self.held.get(&consumer)?;
        held.keys()
            .nth(usize::from(pick) % held.len().max(1))
            .copied()
    }

    /// Checks the machine's effects against the model and applies them.
    fn absorb(&mut self, effects: &[Effect], config: &QueueConfig) {
        for effect in effects {
            match effect {
                Effect::Deliver {
                    consumer,
                    delivery,
                    message,
                } => {
                    let number = tag_number(consumer);
                    assert_eq!(
                        self.places.get(&message.index),
                        Some(&Place::Ready),
                        "only a ready message is delivered"
                    );
                    assert!(
                        self.subscribed.contains(&number),
                        "to a subscribed consumer"
                    );
                    if message.delivery_count == 0 {
                        assert!(message.index > self.last_fresh, "fresh messages in order");
                        self.last_fresh = message.index;
                    }
                    if let Some(limit) = config.delivery_limit {
                        assert!(message.delivery_count <= limit);
                    }
                    let (prefetch, no_ack) = self.prefetch[&number];
                    if no_ack {
                        self.places.remove(&message.index);
                    } else {
                        let held = self.held.entry(number).or_default();
                        assert!(
                            prefetch == 0 || held.len() < prefetch as usize,
                            "within prefetch"
                        );
                        held.insert(*delivery, message.index);
                        self.places.insert(
                            message.index,
                            Place::Held {
                                consumer: number,
                                delivery: *delivery,
                            },
                        );
                    }
                }
                Effect::DeadLetter { reason, message } => {
                    let place = self.places.remove(&message.index);
                    match reason {
                        DeadLetterReason::Expired | DeadLetterReason::MaxLen => {
                            assert_eq!(place, Some(Place::Ready), "{reason:?} from the ready ones")
                        }
                        DeadLetterReason::Rejected | DeadLetterReason::DeliveryLimit => {
                            assert!(place.is_some(), "{reason:?} of a message in the queue")
                        }
                    }
                }
            }
        }
    }

    /// What settling takes from a consumer, before the machine's effects.
    fn settle(&mut self, consumer: u8, delivery: u64, requeue: bool) {
        let index = self
            .held
            .get_mut(&consumer)
            .and_then(|held| held.remove(&delivery))
            .expect("settled a held delivery");
        if requeue {
            self.places.insert(index, Place::Ready);
        } else {
            self.places.remove(&index);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn quorum_machine_agrees_with_the_model(config in config(), steps in proptest::collection::vec(step(), 1..120)) {
        let mut machine = QueueMachine::new(config.clone());
        let mut model = Model::default();
        let mut time = 0;
        for (position, step) in steps.iter().enumerate() {
            let index = position as u64 + 1;
            time += 7;
            let mut in_queue_before: BTreeSet<u64> = model.places.keys().copied().collect();
            let command = match step.clone() {
                Step::Enqueue { publisher, resend, size, ttl } => {
                    let publisher = publisher.map(|number| {
                        let sequence = &mut model.publisher_sequence[usize::from(number)];
                        if !resend || *sequence == 0 {
                            *sequence += 1;
                        }
                        (u64::from(number) << 16, *sequence)
                    });
                    Command::Enqueue { publisher, size: u32::from(size), ttl_ms: ttl.map(u64::from) }
                }
                Step::Checkout { consumer, prefetch, no_ack, priority } => {
                    if model.held.get(&consumer).is_some_and(|held| !held.is_empty()) {
                        // Changing the spec of a consumer holding messages is
                        // not something a channel does.
                        Command::Tick
                    } else {
                        model.prefetch.insert(consumer, (u32::from(prefetch), no_ack));
                        model.subscribed.insert(consumer);
                        Command::Checkout {
                            consumer: id_of(consumer),
                            spec: ConsumerSpec { prefetch: u32::from(prefetch), no_ack, priority: i32::from(priority) },
                        }
                    }
                }
                Step::Cancel(consumer) => {
                    model.subscribed.remove(&consumer);
                    Command::Cancel { consumer: id_of(consumer) }
                }
                Step::Settle(consumer, pick) | Step::Return(consumer, pick) | Step::Discard(consumer, pick) => {
                    let Some(delivery) = model.pick(consumer, pick) else { continue };
                    let deliveries = vec![delivery];
                    let id = id_of(consumer);
                    match step {
                        Step::Settle(..) => { model.settle(consumer, delivery, false); Command::Settle { consumer: id, deliveries } }
                        Step::Return(..) => { model.settle(consumer, delivery, true); Command::Return { consumer: id, deliveries } }
                        _ => {
                            // The discarded message's dead-letter effect
                            // removes it in the model.
                            let index = model.held.get_mut(&consumer).and_then(|held| held.remove(&delivery)).unwrap();
                            model.places.insert(index, Place::Ready);
                            Command::Discard { consumer: id, deliveries }
                        }
                    }
                }
                Step::Bogus(consumer) => Command::Settle { consumer: id_of(consumer), deliveries: vec![9_999] },
                Step::Down(connection) => {
                    for consumer in 0u8..4 {
                        if u64::from(consumer % 3) == u64::from(connection) {
                            model.subscribed.remove(&consumer);
                            for (_, index) in model.held.remove(&consumer).unwrap_or_default() {
                                model.places.insert(index, Place::Ready);
                            }
                        }
                    }
                    if connection < 2 {
                        model.publisher_sequence[usize::from(connection)] = 0;
                        model.last_seen.remove(&(u64::from(connection) << 16));
                    }
                    Command::ConnectionDown { connection: u64::from(connection) }
                }
                Step::Gone(consumer) => {
                    model.subscribed.remove(&consumer);
                    for (_, index) in model.held.remove(&consumer).unwrap_or_default() {
                        model.places.insert(index, Place::Ready);
                    }
                    Command::ConsumerDown { consumer: id_of(consumer) }
                }
                Step::Purge => Command::Purge,
                Step::Tick => Command::Tick,
                Step::DeadLettered(pick) => {
                    let waiting: Vec<u64> = model
                        .places
                        .iter()
                        .filter(|(_, place)| **place == Place::DeadLettering)
                        .map(|(index, _)| *index)
                        .collect();
                    let mut indexes = vec![1_000_000];
                    if !waiting.is_empty() {
                        indexes.push(waiting[usize::from(pick) % waiting.len()]);
                    }
                    Command::DeadLettered { indexes }
                }
            };
            let settled_dead_letters = match &command {
                Command::DeadLettered { indexes } => indexes.clone(),
                _ => Vec::new(),
            };
            let (dead_lettering, dead_lettering_bytes) = model.dead_lettering();
            let ready_before = model.ready();
            let ready_bytes_before = model.ready_bytes();
            let new_message = match (&command, step) {
                (Command::Enqueue { publisher, size, .. }, _) => {
                    let fresh = match publisher {
                        Some((number, sequence)) => {
                            let last = model.last_seen.entry(*number).or_insert(0);
                            let fresh = *sequence > *last;
                            *last = (*last).max(*sequence);
                            fresh
                        }
                        None => true,
                    };
                    fresh.then_some(*size)
                }
                _ => None,
            };
            let (reply, effects) = machine.apply(index, time, command);
            match (step, new_message) {
                (Step::Bogus(_), _) => prop_assert!(matches!(reply, Reply::Unknown)),
                (Step::Purge, _) => {
                    prop_assert_eq!(&reply, &Reply::Purged(ready_before));
                    model.places.retain(|_, place| *place != Place::Ready);
                }
                (Step::Enqueue { .. }, Some(size)) => {
                    let over = config
                        .max_length
                        .is_some_and(|max| ready_before + dead_lettering + 1 > max)
                        || config.max_length_bytes.is_some_and(|max| {
                            ready_bytes_before + dead_lettering_bytes + u64::from(size) > max
                        });
                    if config.overflow == Overflow::RejectPublish && over {
                        prop_assert_eq!(&reply, &Reply::Rejected);
                    } else {
                        prop_assert_eq!(&reply, &Reply::Enqueued);
                        model.places.insert(index, Place::Ready);
                        model.sizes.insert(index, u64::from(size));
                        in_queue_before.insert(index);
                    }
                }
                (Step::Enqueue { .. }, None) => prop_assert_eq!(&reply, &Reply::Enqueued, "a resend"),
                _ => {}
            }
            if config.dead_letter_at_least_once {
                prop_assert!(
                    !effects.iter().any(|effect| matches!(effect, Effect::DeadLetter { .. })),
                    "at least once, nothing leaves before it is settled"
                );
            }
            model.absorb(&effects, &config);
            model.reconcile_dead_lettering(&machine, &settled_dead_letters)?;

            // The machine and the model agree on where everything is.
            let stats = machine.stats();
            let held: u64 = model.held.values().map(|held| held.len() as u64).sum();
            prop_assert_eq!(stats.messages_ready, model.ready(), "ready after {:?}", step);
            prop_assert_eq!(stats.messages_unacknowledged, held, "held after {:?}", step);
            prop_assert_eq!(
                machine.release_cursor(),
                model.places.keys().next().copied().unwrap_or(index + 1),
                "release cursor after {:?}", step
            );
            if let Some(max) = config.max_length {
                if config.overflow == Overflow::DropHead {
                    prop_assert!(stats.messages_ready <= max);
                }
            }
            // What left the queue is reported once, for its body to go.
            let in_queue_after: BTreeSet<u64> = model.places.keys().copied().collect();
            let mut released = machine.take_released();
            released.sort_unstable();
            let left: Vec<u64> = in_queue_before.difference(&in_queue_after).copied().collect();
            prop_assert_eq!(released, left, "released after {:?}", step);
            // A snapshot restores to the same machine.
            let snapshot = serde_json::to_vec(&machine).unwrap();
            let restored: QueueMachine = serde_json::from_slice(&snapshot).unwrap();
            prop_assert_eq!(&restored, &machine);
        }
    }
}

#[test]
fn quorum_machine_dequeues_and_forgets_the_consumers_of_a_node_that_went_down() {
    let mut machine = QueueMachine::new(QueueConfig::default());
    for index in 1..=3 {
        machine.apply(index, 0, enqueue());
    }
    let getter = consumer(7, "basic.get");
    let dequeue = |settled| Command::Dequeue {
        consumer: consumer(7, "basic.get"),
        settled,
    };
    let (reply, _) = machine.apply(4, 0, dequeue(false));
    let Reply::Dequeued(Some((held, message, remaining))) = reply else {
        panic!("a message to get: {reply:?}");
    };
    assert_eq!((message.index, remaining), (1, 2));
    // Settled at once: gone, under a delivery id never used before.
    let (reply, _) = machine.apply(5, 0, dequeue(true));
    assert!(
        matches!(reply, Reply::Dequeued(Some((delivery, message, 1))) if delivery != held && message.index == 2)
    );
    assert_eq!(machine.take_released(), [2]);
    // The getter is never served as a consumer.
    let on_node_one = ConsumerId {
        connection: (1 << super::machine::NODE_SHIFT) | 5,
        channel: 1,
        tag: "a".into(),
    };
    let (_, effects) = machine.apply(
        6,
        0,
        Command::Checkout {
            consumer: on_node_one.clone(),
            spec: spec(10),
        },
    );
    assert_eq!(deliveries(&effects), [("a".into(), 0, 3, 0)]);
    // Its node goes down: what it held is back, counted as a delivery.
    machine.apply(7, 0, Command::NodeDown { node: 1 });
    assert!(!machine.has_consumer(&on_node_one));
    let stats = machine.stats();
    assert_eq!(
        (stats.messages_ready, stats.messages_unacknowledged),
        (1, 1)
    );
    machine.apply(
        8,
        0,
        Command::Settle {
            consumer: getter.clone(),
            deliveries: vec![held],
        },
    );
    assert!(!machine.has_consumer(&getter));
    let (reply, _) = machine.apply(9, 0, dequeue(true));
    assert!(
        matches!(reply, Reply::Dequeued(Some((_, message, 0))) if message.index == 3 && message.delivery_count == 1)
    );
    assert_eq!(machine.apply(10, 0, dequeue(true)).0, Reply::Dequeued(None));
}

#[test]
fn quorum_machine_release_puts_back_first_without_counting_a_delivery() {
    let mut machine = QueueMachine::new(QueueConfig {
        delivery_limit: Some(0),
        ..QueueConfig::default()
    });
    for index in 1..=2 {
        machine.apply(index, 0, enqueue());
    }
    let a = consumer(1, "a");
    let (_, effects) = machine.apply(
        3,
        0,
        Command::Checkout {
            consumer: a.clone(),
            spec: spec(1),
        },
    );
    assert_eq!(deliveries(&effects), [("a".into(), 0, 1, 0)]);
    machine.apply(
        4,
        0,
        Command::Cancel {
            consumer: a.clone(),
        },
    );
    // Never seen by its client: back at the head, not past a delivery
    // limit of 0, and the consumer is gone once it holds nothing.
    let (reply, effects) = machine.apply(
        5,
        0,
        Command::Release {
            consumer: a.clone(),
            deliveries: vec![0],
        },
    );
    assert_eq!(reply, Reply::Ok);
    assert!(effects.is_empty(), "{effects:?}");
    assert!(!machine.has_consumer(&a));
    let (reply, _) = machine.apply(
        6,
        0,
        Command::Dequeue {
            consumer: consumer(2, "basic.get"),
            settled: true,
        },
    );
    assert!(
        matches!(reply, Reply::Dequeued(Some((_, message, 1))) if message.index == 1 && message.delivery_count == 0)
    );
}

#[test]
fn quorum_machine_expires_once_unused_for_its_x_expires() {
    let mut machine = QueueMachine::new(QueueConfig {
        expires_ms: Some(1000),
        ..QueueConfig::default()
    });
    machine.apply(1, 5_000, enqueue());
    assert_eq!(machine.expires_at_ms(), Some(6_000));
    assert!(!machine.is_expired(5_999));
    // A consumer holds it off; its leaving starts the countdown again.
    let a = consumer(1, "a");
    machine.apply(
        2,
        5_500,
        Command::Checkout {
            consumer: a.clone(),
            spec: spec(10),
        },
    );
    assert_eq!(machine.expires_at_ms(), None);
    assert!(!machine.is_expired(100_000));
    machine.apply(3, 7_000, Command::Cancel { consumer: a });
    assert_eq!(machine.expires_at_ms(), Some(8_000));
    // A redeclaration counts as a use.
    machine.apply(4, 7_500, Command::Touch);
    assert!(!machine.is_expired(8_000));
    assert!(machine.is_expired(8_500));
    // Without x-expires, never.
    let plain = QueueMachine::new(QueueConfig::default());
    assert_eq!(plain.expires_at_ms(), None);
}

#[test]
fn quorum_machine_set_config_keeps_the_newest_rules_and_drops_past_a_lower_limit() {
    let mut machine = QueueMachine::new(QueueConfig::default());
    for index in 1..=10 {
        machine.apply(index, 1_000, enqueue());
    }
    assert_eq!(machine.stats().messages_ready, 10);
    let limited = |max_length| QueueConfig {
        max_length: Some(max_length),
        ..QueueConfig::default()
    };
    // A max-length of 4: the oldest six go at once, dead-lettered maxlen.
    let (_, effects) = machine.apply(
        11,
        1_000,
        Command::SetConfig {
            config: limited(4),
            generation: 2,
        },
    );
    assert_eq!(machine.stats().messages_ready, 4);
    let dropped: Vec<u64> = effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::DeadLetter {
                reason: DeadLetterReason::MaxLen,
                message,
            } => Some(message.index),
            _ => None,
        })
        .collect();
    assert_eq!(dropped, [1, 2, 3, 4, 5, 6]);
    // Another member's proposal of an older change comes later: skipped.
    machine.apply(
        12,
        1_000,
        Command::SetConfig {
            config: limited(1),
            generation: 1,
        },
    );
    assert_eq!(machine.stats().messages_ready, 4);
    assert_eq!(machine.config().max_length, Some(4));
    // The same change proposed by a second member: nothing more.
    machine.apply(
        13,
        1_000,
        Command::SetConfig {
            config: limited(4),
            generation: 2,
        },
    );
    assert_eq!(machine.config_generation(), 2);
    // Cleared by a later change: no limit from here on.
    machine.apply(
        14,
        1_000,
        Command::SetConfig {
            config: QueueConfig::default(),
            generation: 3,
        },
    );
    machine.apply(15, 1_000, enqueue());
    assert_eq!(machine.stats().messages_ready, 5);
}
