// Interop check for Sluice with amqp091-go, the Go RabbitMQ client.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const (
	n        = 20
	exchange = "interop.go"
)

func check(err error, what string) {
	if err != nil {
		log.Fatalf("FAIL %s: %v", what, err)
	}
}

func assert(ok bool, format string, args ...any) {
	if !ok {
		log.Fatalf("FAIL "+format, args...)
	}
}

func main() {
	uri := "amqp://guest:guest@127.0.0.1:5672/"
	if len(os.Args) > 1 {
		uri = os.Args[1]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	conn, err := amqp.Dial(uri)
	check(err, "dial")
	ch, err := conn.Channel()
	check(err, "channel")
	// Report why the server closed the main channel, should it do so.
	go func() {
		if e := <-ch.NotifyClose(make(chan *amqp.Error, 1)); e != nil {
			log.Printf("channel closed by server: %v", e)
		}
	}()

	check(ch.ExchangeDeclare(exchange, "topic", false, true, false, false, nil), "exchange.declare")
	// Exclusive but not auto-delete: an auto-delete queue would go with the consumer cancelled below.
	q, err := ch.QueueDeclare("", false, false, true, false, nil)
	check(err, "queue.declare")
	assert(strings.HasPrefix(q.Name, "amq.gen-"), "server-named queue: %q", q.Name)
	check(ch.QueueBind(q.Name, "orders.#", exchange, false, nil), "queue.bind")
	fmt.Printf("declared %s and %s\n", exchange, q.Name)

	// Publisher confirms: wait for each deferred confirmation.
	check(ch.Confirm(false), "confirm.select")
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	confirms := make([]*amqp.DeferredConfirmation, 0, n)
	for i := 0; i < n; i++ {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, fmt.Sprintf("orders.eu.%d", i), false, false, amqp.Publishing{
			ContentType:   "application/json",
			Headers:       amqp.Table{"seq": int32(i), "lang": "go"},
			DeliveryMode:  amqp.Persistent,
			CorrelationId: fmt.Sprintf("corr-%d", i),
			MessageId:     fmt.Sprintf("msg-%d", i),
			Body:          []byte(fmt.Sprintf(`{"n": %d}`, i)),
		})
		check(err, "publish")
		confirms = append(confirms, dc)
	}
	for i, dc := range confirms {
		acked, err := dc.WaitContext(ctx)
		check(err, fmt.Sprintf("wait for confirm %d", i))
		assert(acked, "publish %d was nacked", i)
	}
	fmt.Printf("published %d with confirms\n", n)

	// Mandatory publish to a key nothing is bound to: basic.return, then the ack.
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, "nobody.home", true, false, amqp.Publishing{Body: []byte("lost")})
	check(err, "mandatory publish")
	select {
	case r := <-returns:
		assert(r.ReplyCode == 312 && r.RoutingKey == "nobody.home", "return: %+v", r)
	case <-ctx.Done():
		log.Fatal("FAIL no basic.return for a mandatory unroutable publish")
	}
	acked, err := dc.WaitContext(ctx)
	check(err, "confirm of returned publish")
	assert(acked, "returned publish was nacked")
	fmt.Println("mandatory publish returned (312 NO_ROUTE)")

	// Consume with manual ack and prefetch 10: in order, properties intact.
	check(ch.Qos(10, 0, false), "basic.qos")
	deliveries, err := ch.ConsumeWithContext(ctx, q.Name, "interop-go", false, false, false, false, nil)
	check(err, "basic.consume")
	for i := 0; i < n; i++ {
		var d amqp.Delivery
		select {
		case d = <-deliveries:
		case <-ctx.Done():
			log.Fatalf("FAIL timed out after %d deliveries", i)
		}
		assert(string(d.Body) == fmt.Sprintf(`{"n": %d}`, i), "body %d: %q", i, d.Body)
		assert(d.RoutingKey == fmt.Sprintf("orders.eu.%d", i), "routing key %d: %q", i, d.RoutingKey)
		assert(d.ContentType == "application/json", "content type: %q", d.ContentType)
		assert(d.Headers["seq"] == int32(i) && d.Headers["lang"] == "go", "headers: %v", d.Headers)
		assert(d.DeliveryMode == amqp.Persistent, "delivery mode: %d", d.DeliveryMode)
		assert(d.CorrelationId == fmt.Sprintf("corr-%d", i), "correlation id: %q", d.CorrelationId)
		assert(d.MessageId == fmt.Sprintf("msg-%d", i), "message id: %q", d.MessageId)
		assert(!d.Redelivered, "delivery %d marked redelivered", i)
		check(d.Ack(false), "basic.ack")
	}
	check(ch.Cancel("interop-go", false), "basic.cancel")
	fmt.Printf("consumed %d in order with properties intact\n", n)

	// basic.get, then nack with requeue: the next get sees redelivered=true.
	dc, err = ch.PublishWithDeferredConfirmWithContext(ctx, exchange, "orders.get", false, false, amqp.Publishing{Body: []byte("get-me")})
	check(err, "publish")
	_, err = dc.WaitContext(ctx)
	check(err, "confirm")
	d, ok, err := ch.Get(q.Name, false)
	check(err, "basic.get")
	assert(ok && string(d.Body) == "get-me" && !d.Redelivered, "first get: ok=%v %+v", ok, d)
	check(d.Nack(false, true), "basic.nack")
	d, ok, err = ch.Get(q.Name, false)
	check(err, "basic.get")
	assert(ok && string(d.Body) == "get-me" && d.Redelivered, "second get: ok=%v redelivered=%v", ok, d.Redelivered)
	check(d.Ack(false), "basic.ack")
	_, ok, err = ch.Get(q.Name, true)
	check(err, "basic.get")
	assert(!ok, "queue should be empty")
	fmt.Println("basic.get, nack requeue -> redelivered")

	// Passive declare of a missing queue: channel error 404; the connection stays open.
	probe, err := conn.Channel()
	check(err, "channel")
	_, err = probe.QueueDeclarePassive("interop.missing.queue", false, false, false, false, nil)
	var amqpErr *amqp.Error
	assert(errors.As(err, &amqpErr) && amqpErr.Code == amqp.NotFound, "passive declare: %v", err)
	assert(!conn.IsClosed(), "connection closed by a channel error")
	fmt.Println("passive declare of a missing queue -> 404 NOT_FOUND")

	// Transactions: nothing visible before commit.
	tx, err := conn.Channel()
	check(err, "channel")
	check(tx.Tx(), "tx.select")
	check(tx.PublishWithContext(ctx, exchange, "orders.tx", false, false, amqp.Publishing{Body: []byte("in-tx")}), "publish")
	before, err := tx.QueueDeclarePassive(q.Name, false, false, true, false, nil)
	check(err, "queue.declare passive")
	assert(before.Messages == 0, "uncommitted publish visible: %d", before.Messages)
	check(tx.TxCommit(), "tx.commit")
	d, ok, err = tx.Get(q.Name, true)
	check(err, "basic.get")
	assert(ok && string(d.Body) == "in-tx", "committed message: ok=%v %q", ok, d.Body)
	fmt.Println("tx publish + commit")

	check(tx.Close(), "tx channel close")
	queueFeatures(ctx, conn)
	check(ch.Close(), "channel close")
	check(conn.Close(), "connection close")
	fmt.Println("closed cleanly")
}

// queueFeatures checks dead-lettering with x-death and priority queues.
func queueFeatures(ctx context.Context, conn *amqp.Connection) {
	ch, err := conn.Channel()
	check(err, "channel")
	_, err = ch.QueueDeclare("interop.go.dead", false, false, true, false, nil)
	check(err, "queue.declare dead")
	_, err = ch.QueueDeclare("interop.go.work", false, false, true, false, amqp.Table{
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": "interop.go.dead",
	})
	check(err, "queue.declare work")
	check(ch.PublishWithContext(ctx, "", "interop.go.work", false, false, amqp.Publishing{Body: []byte("rejected")}), "publish")
	d, ok, err := ch.Get("interop.go.work", false)
	check(err, "basic.get")
	assert(ok, "nothing to reject")
	check(d.Reject(false), "basic.reject")
	var dead amqp.Delivery
	for i := 0; i < 50; i++ {
		dead, ok, err = ch.Get("interop.go.dead", true)
		check(err, "basic.get dead")
		if ok {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	assert(ok && string(dead.Body) == "rejected", "rejected message not dead-lettered")
	deaths, _ := dead.Headers["x-death"].([]interface{})
	assert(len(deaths) == 1, "x-death: %v", dead.Headers)
	death, _ := deaths[0].(amqp.Table)
	assert(death["reason"] == "rejected" && death["queue"] == "interop.go.work", "x-death entry: %v", death)
	assert(dead.Headers["x-first-death-reason"] == "rejected", "x-first-death-reason: %v", dead.Headers)
	fmt.Println("reject without requeue dead-lettered with x-death")

	_, err = ch.QueueDeclare("interop.go.priority", false, false, true, false, amqp.Table{"x-max-priority": int32(5)})
	check(err, "queue.declare priority")
	for _, m := range []struct {
		priority uint8
		body     string
	}{{1, "low"}, {5, "high"}, {3, "middle"}} {
		check(ch.PublishWithContext(ctx, "", "interop.go.priority", false, false, amqp.Publishing{Priority: m.priority, Body: []byte(m.body)}), "publish")
	}
	var order []string
	for i := 0; i < 3; i++ {
		d, ok, err := ch.Get("interop.go.priority", true)
		check(err, "basic.get priority")
		assert(ok, "priority queue ran dry after %d", i)
		order = append(order, string(d.Body))
	}
	assert(strings.Join(order, ",") == "high,middle,low", "priority order: %v", order)
	fmt.Println("x-max-priority delivers by priority")
	check(ch.Close(), "channel close")
}
