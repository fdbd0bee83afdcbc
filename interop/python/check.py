"""Interop check for Sluice with pika (the Python RabbitMQ client), used as a new user would."""
import signal
import sys

import pika
from pika.exceptions import ChannelClosedByBroker, UnroutableError

N = 20
EXCHANGE = "interop.python"


def timed_out(_signum, _frame):
    raise TimeoutError("no answer from the broker within 10 s")


def main(uri: str) -> None:
    # pika's blocking calls (e.g. waiting for a publisher confirm) have no timeout of their own.
    signal.signal(signal.SIGALRM, timed_out)
    signal.alarm(10)
    conn = pika.BlockingConnection(pika.URLParameters(uri))
    ch = conn.channel()

    ch.exchange_declare(EXCHANGE, exchange_type="topic", auto_delete=True)
    q = ch.queue_declare("", exclusive=True).method.queue
    assert q.startswith("amq.gen-"), f"server-named queue: {q!r}"
    ch.queue_bind(q, EXCHANGE, routing_key="orders.#")
    print(f"declared {EXCHANGE} and {q}")

    # Publisher confirms: in BlockingChannel every basic_publish waits for its ack.
    ch.confirm_delivery()
    for i in range(N):
        props = pika.BasicProperties(
            content_type="application/json",
            headers={"seq": i, "lang": "python"},
            delivery_mode=pika.DeliveryMode.Persistent,
            correlation_id=f"corr-{i}",
            message_id=f"msg-{i}",
        )
        ch.basic_publish(EXCHANGE, f"orders.eu.{i}", f'{{"n": {i}}}'.encode(), props)
    print(f"published {N} with confirms")

    # Mandatory publish to a key nothing is bound to: basic.return, surfaced as UnroutableError.
    try:
        ch.basic_publish(EXCHANGE, "nobody.home", b"lost", mandatory=True)
        raise AssertionError("mandatory unroutable publish was not returned")
    except UnroutableError as e:
        ret = e.messages[0]
        assert ret.method.reply_code == 312, ret.method
        assert ret.method.routing_key == "nobody.home", ret.method
    print("mandatory publish returned (312 NO_ROUTE)")

    # Consume with manual ack and prefetch 10; messages arrive in order, properties intact.
    ch.basic_qos(prefetch_count=10)
    got = 0
    for method, props, body in ch.consume(q, auto_ack=False, inactivity_timeout=5):
        assert method is not None, f"timed out after {got} messages"
        assert body == f'{{"n": {got}}}'.encode(), body
        assert method.routing_key == f"orders.eu.{got}", method.routing_key
        assert props.content_type == "application/json", props
        assert props.headers == {"seq": got, "lang": "python"}, props.headers
        assert props.delivery_mode == 2, props
        assert props.correlation_id == f"corr-{got}", props
        assert props.message_id == f"msg-{got}", props
        assert not method.redelivered
        ch.basic_ack(method.delivery_tag)
        got += 1
        if got == N:
            break
    ch.cancel()
    print(f"consumed {N} in order with properties intact")

    # basic.get, then nack with requeue: the next get sees redelivered=True.
    ch.basic_publish(EXCHANGE, "orders.get", b"get-me")
    method, _, body = ch.basic_get(q, auto_ack=False)
    assert method is not None and body == b"get-me" and not method.redelivered, method
    ch.basic_nack(method.delivery_tag, requeue=True)
    method, _, body = ch.basic_get(q, auto_ack=False)
    assert method is not None and body == b"get-me" and method.redelivered, method
    ch.basic_ack(method.delivery_tag)
    method, _, _ = ch.basic_get(q)
    assert method is None, "queue should be empty"
    print("basic.get, nack requeue -> redelivered")

    # Passive declare of a missing queue: channel error 404, connection stays usable.
    try:
        ch.queue_declare("interop.missing.queue", passive=True)
        raise AssertionError("passive declare of a missing queue succeeded")
    except ChannelClosedByBroker as e:
        assert e.reply_code == 404, e
    assert conn.is_open
    print("passive declare of a missing queue -> 404 NOT_FOUND")

    # Transactions on a new channel: nothing visible before commit.
    tx = conn.channel()
    tx.tx_select()
    tx.basic_publish(EXCHANGE, "orders.tx", b"in-tx")
    assert tx.queue_declare(q, passive=True).method.message_count == 0
    tx.tx_commit()
    method, _, body = tx.basic_get(q, auto_ack=True)
    assert body == b"in-tx", body
    print("tx publish + commit")

    tx.close()
    queue_features(conn)
    conn.close()
    print("closed cleanly")


def queue_features(conn) -> None:
    """TTL with dead-lettering, priorities, direct reply-to and single active consumer."""
    ch = conn.channel()
    # Expired messages go to the dead-letter exchange with RabbitMQ's x-death header.
    ch.queue_declare("interop.dead", exclusive=True)
    ch.queue_declare("interop.ttl", exclusive=True, arguments={
        "x-message-ttl": 50, "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "interop.dead"})
    ch.basic_publish("", "interop.ttl", b"expires")
    for _ in range(50):
        method, props, body = ch.basic_get("interop.dead", auto_ack=True)
        if method is not None:
            break
        conn.sleep(0.05)
    assert method is not None and body == b"expires", "expired message not dead-lettered"
    death = props.headers["x-death"][0]
    assert death["reason"] == "expired" and death["queue"] == "interop.ttl", death
    assert death["count"] == 1 and props.headers["x-first-death-reason"] == "expired", props.headers
    print("x-message-ttl expiry dead-lettered with x-death")

    # Priority queue: the higher priority is delivered first.
    ch.queue_declare("interop.priority", exclusive=True, arguments={"x-max-priority": 5})
    for priority, body in ((1, b"low"), (5, b"high"), (3, b"middle")):
        ch.basic_publish("", "interop.priority", body, pika.BasicProperties(priority=priority))
    order = [ch.basic_get("interop.priority", auto_ack=True)[2] for _ in range(3)]
    assert order == [b"high", b"middle", b"low"], order
    print("x-max-priority delivers by priority")

    # Direct reply-to: an RPC round trip with no reply queue.
    replies = []
    ch.basic_consume("amq.rabbitmq.reply-to", lambda c, m, p, b: replies.append((p, b)),
                     auto_ack=True)
    ch.queue_declare("interop.rpc", exclusive=True)
    ch.basic_publish("", "interop.rpc", b"ping",
                     pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
    method, props, body = ch.basic_get("interop.rpc", auto_ack=True)
    assert props.reply_to.startswith("amq.rabbitmq.reply-to."), props.reply_to
    ch.basic_publish("", props.reply_to, b"pong")
    while not replies:
        conn.process_data_events(time_limit=0.1)
    assert replies[0][1] == b"pong", replies
    print("direct reply-to round trip")

    # Single active consumer: only the first consumer receives; the next takes over.
    first, second = conn.channel(), conn.channel()
    ch.queue_declare("interop.sac", auto_delete=True,
                     arguments={"x-single-active-consumer": True})
    got = {"first": [], "second": []}
    first.basic_consume("interop.sac", lambda c, m, p, b: got["first"].append(b), auto_ack=True)
    second.basic_consume("interop.sac", lambda c, m, p, b: got["second"].append(b), auto_ack=True)
    for i in range(3):
        ch.basic_publish("", "interop.sac", f"sac-{i}".encode())
    while len(got["first"]) < 3:
        conn.process_data_events(time_limit=0.1)
    assert not got["second"], got
    first.close()
    ch.basic_publish("", "interop.sac", b"sac-after")
    while not got["second"]:
        conn.process_data_events(time_limit=0.1)
    assert got["second"] == [b"sac-after"], got
    second.close()
    ch.close()
    print("single active consumer fails over to the next consumer")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "amqp://guest:guest@127.0.0.1:5672/%2F")
