//! Routing benchmarks: topic matching over a 10 000-binding trie and direct
//! lookup over as many keys. Run with `cargo bench -p sluice-core --bench routing`.

use std::hint::black_box;
use std::sync::Arc;

use amq_protocol::types::FieldTable;
use criterion::{criterion_group, criterion_main, Criterion};
use sluice_core::exchange::{Binding, Destination, ExchangeKind, RoutingTable};

/// Bindings per exchange: large enough that scanning every binding would show.
const BINDING_COUNT: usize = 10_000;

fn binding(index: usize, routing_key: String) -> Binding {
    Binding {
        destination: Destination::Queue(Arc::from(format!("queue-{index}"))),
        routing_key,
        arguments: FieldTable::default(),
    }
}

/// Keys shaped like `region.service.event`, with a mix of literal, `*` and `#`
/// patterns typical of event routing.
fn topic_table() -> RoutingTable {
    let mut table = RoutingTable::new(ExchangeKind::Topic);
    for index in 0..BINDING_COUNT {
        let region = index % 10;
        let service = index % 100;
        let event = index;
        let key = match index % 4 {
            0 => format!("region{region}.service{service}.event{event}"),
            1 => format!("region{region}.*.event{event}"),
            2 => format!("region{region}.service{service}.#"),
            _ => format!("#.event{event}"),
        };
        table
            .bind(binding(index, key))
            .expect("benchmark keys are valid");
    }
    table
}

fn direct_table() -> RoutingTable {
    let mut table = RoutingTable::new(ExchangeKind::Direct);
    for index in 0..BINDING_COUNT {
        table
            .bind(binding(index, format!("key-{index}")))
            .expect("benchmark keys are valid");
    }
    table
}

fn topic_routing(criterion: &mut Criterion) {
    let table = topic_table();
    let mut out = Vec::with_capacity(64);
    let mut group = criterion.benchmark_group("topic_10k");
    for (name, key) in [
        ("literal_hit", &b"region4.service44.event44"[..]),
        ("star_and_hash_hits", b"region5.service5.event4005"),
        ("miss", b"nowhere.nothing.none"),
        ("long_key", b"region1.service1.a.b.c.d.e.f.g.h.event9"),
    ] {
        group.bench_function(name, |bencher| {
            bencher.iter(|| {
                out.clear();
                table.route(black_box(key), None, &mut out);
                black_box(out.len())
            })
        });
    }
    group.finish();
}

fn direct_routing(criterion: &mut Criterion) {
    let table = direct_table();
    let mut out = Vec::with_capacity(4);
    let mut group = criterion.benchmark_group("direct_10k");
    for (name, key) in [("hit", &b"key-5000"[..]), ("miss", b"key-none")] {
        group.bench_function(name, |bencher| {
            bencher.iter(|| {
                out.clear();
                table.route(black_box(key), None, &mut out);
                black_box(out.len())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, topic_routing, direct_routing);
criterion_main!(benches);
