// Interop check for Sluice with the RabbitMQ Java client (com.rabbitmq:amqp-client).
import com.rabbitmq.client.*;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.concurrent.*;

public class Check {
    static final int N = 20;
    static final String EXCHANGE = "interop.java";

    static void check(boolean ok, String what) {
        if (!ok) throw new AssertionError(what);
    }

    static byte[] utf8(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    public static void main(String[] args) throws Exception {
        ConnectionFactory factory = new ConnectionFactory();
        factory.setUri(args.length > 0 ? args[0] : "amqp://guest:guest@127.0.0.1:5672/%2F");
        factory.setAutomaticRecoveryEnabled(false);
        try (Connection conn = factory.newConnection("sluice-interop-java")) {
            Channel ch = conn.createChannel();

            ch.exchangeDeclare(EXCHANGE, BuiltinExchangeType.TOPIC, false, true, null);
            // Server-named and exclusive; not auto-delete, as the consumer below is cancelled.
            String q = ch.queueDeclare("", false, true, false, null).getQueue();
            check(q.startsWith("amq.gen-"), "server-named queue: " + q);
            ch.queueBind(q, EXCHANGE, "orders.#");
            System.out.println("declared " + EXCHANGE + " and " + q);

            // Publisher confirms.
            ch.confirmSelect();
            for (int i = 0; i < N; i++) {
                AMQP.BasicProperties props = new AMQP.BasicProperties.Builder()
                        .contentType("application/json")
                        .headers(Map.of("seq", i, "lang", "java"))
                        .deliveryMode(2)
                        .correlationId("corr-" + i)
                        .messageId("msg-" + i)
                        .build();
                ch.basicPublish(EXCHANGE, "orders.eu." + i, props, utf8("{\"n\": " + i + "}"));
            }
            ch.waitForConfirmsOrDie(5_000);
            System.out.println("published " + N + " with confirms");

            // Mandatory publish to a key nothing is bound to: basic.return.
            CompletableFuture<Return> returned = new CompletableFuture<>();
            ch.addReturnListener(returned::complete);
            ch.basicPublish(EXCHANGE, "nobody.home", true, null, utf8("lost"));
            ch.waitForConfirmsOrDie(5_000);
            Return r = returned.get(5, TimeUnit.SECONDS);
            check(r.getReplyCode() == 312 && r.getRoutingKey().equals("nobody.home"), "return: " + r.getReplyCode());
            System.out.println("mandatory publish returned (312 NO_ROUTE)");

            // Consume with manual ack and prefetch 10: in order, properties intact.
            ch.basicQos(10);
            BlockingQueue<Delivery> deliveries = new LinkedBlockingQueue<>();
            String tag = ch.basicConsume(q, false, (consumerTag, d) -> deliveries.add(d), consumerTag -> { });
            for (int i = 0; i < N; i++) {
                Delivery d = deliveries.poll(5, TimeUnit.SECONDS);
                check(d != null, "timed out after " + i + " deliveries");
                AMQP.BasicProperties p = d.getProperties();
                check(new String(d.getBody(), StandardCharsets.UTF_8).equals("{\"n\": " + i + "}"), "body " + i);
                check(d.getEnvelope().getRoutingKey().equals("orders.eu." + i), "routing key " + i);
                check("application/json".equals(p.getContentType()), "content type: " + p.getContentType());
                check(Integer.valueOf(i).equals(p.getHeaders().get("seq")), "headers: " + p.getHeaders());
                check("java".equals(String.valueOf(p.getHeaders().get("lang"))), "headers: " + p.getHeaders());
                check(p.getDeliveryMode() == 2, "delivery mode: " + p.getDeliveryMode());
                check(("corr-" + i).equals(p.getCorrelationId()), "correlation id: " + p.getCorrelationId());
                check(("msg-" + i).equals(p.getMessageId()), "message id: " + p.getMessageId());
                check(!d.getEnvelope().isRedeliver(), "delivery " + i + " marked redelivered");
                ch.basicAck(d.getEnvelope().getDeliveryTag(), false);
            }
            ch.basicCancel(tag);
            System.out.println("consumed " + N + " in order with properties intact");

            // basic.get, then nack with requeue: the next get sees redelivered=true.
            ch.basicPublish(EXCHANGE, "orders.get", null, utf8("get-me"));
            ch.waitForConfirmsOrDie(5_000);
            GetResponse g = ch.basicGet(q, false);
            check(g != null && new String(g.getBody(), StandardCharsets.UTF_8).equals("get-me")
                    && !g.getEnvelope().isRedeliver(), "first get");
            ch.basicNack(g.getEnvelope().getDeliveryTag(), false, true);
            g = ch.basicGet(q, false);
            check(g != null && g.getEnvelope().isRedeliver(), "second get should be redelivered");
            ch.basicAck(g.getEnvelope().getDeliveryTag(), false);
            check(ch.basicGet(q, true) == null, "queue should be empty");
            System.out.println("basic.get, nack requeue -> redelivered");

            // Passive declare of a missing queue: channel error 404; the connection stays open.
            Channel probe = conn.createChannel();
            try {
                probe.queueDeclarePassive("interop.missing.queue");
                throw new AssertionError("passive declare of a missing queue succeeded");
            } catch (IOException e) {
                ShutdownSignalException sig = (ShutdownSignalException) e.getCause();
                check(!sig.isHardError(), "expected a channel error, got a connection error");
                check(((AMQP.Channel.Close) sig.getReason()).getReplyCode() == 404, "reply: " + sig.getReason());
            }
            check(conn.isOpen(), "connection closed by a channel error");
            System.out.println("passive declare of a missing queue -> 404 NOT_FOUND");

            // Transactions: nothing visible before commit.
            Channel tx = conn.createChannel();
            tx.txSelect();
            tx.basicPublish(EXCHANGE, "orders.tx", null, utf8("in-tx"));
            check(tx.messageCount(q) == 0, "uncommitted publish is visible");
            tx.txCommit();
            g = tx.basicGet(q, true);
            check(g != null && new String(g.getBody(), StandardCharsets.UTF_8).equals("in-tx"), "committed message");
            System.out.println("tx publish + commit");

            tx.close();
            ch.close();
        }
        System.out.println("closed cleanly");
    }
}
