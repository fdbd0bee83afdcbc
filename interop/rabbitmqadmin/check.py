"""RabbitMQ's own rabbitmqadmin against Sluice's management API.

    python3 check.py MANAGEMENT_PORT AMQP_URI

Each step runs the real rabbitmqadmin (kept unchanged next to this file) and
checks what it printed, and, where it changed something, what an AMQP
client (pika) sees. Exits non-zero at the first step that fails.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

import pika

HERE = os.path.dirname(os.path.abspath(__file__))
ADMIN = os.path.join(HERE, "rabbitmqadmin")


def admin(port, *args, user="guest", password="guest", expect_ok=True):
    command = [sys.executable, ADMIN, "-H", "127.0.0.1", "-P", str(port),
               "-u", user, "-p", password, *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if expect_ok and result.returncode != 0:
        raise AssertionError(
            f"rabbitmqadmin {' '.join(args)} exited {result.returncode}: {result.stderr or result.stdout}")
    return result


def expect(condition, what):
    if not condition:
        raise AssertionError(what)
    print(f"ok: {what}")


def rows(output):
    """The cells of rabbitmqadmin's table output."""
    table = []
    for line in output.splitlines():
        if line.startswith("|"):
            table.append([cell.strip() for cell in line.strip("|").split("|")])
    return table[1:] if table else []


def main():
    port, uri = int(sys.argv[1]), sys.argv[2]
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    channel = connection.channel()

    admin(port, "declare", "queue", "name=adm_q", "durable=true")
    admin(port, "declare", "queue", "name=adm_qq", "durable=true", "queue_type=quorum")
    admin(port, "declare", "exchange", "name=adm_x", "type=topic")
    admin(port, "declare", "binding", "source=adm_x", "destination=adm_q", "routing_key=a.#")
    channel.queue_declare("adm_q", passive=True)
    expect(True, "declared queue is there for an AMQP client")

    published = admin(port, "publish", "exchange=adm_x", "routing_key=a.b", "payload=hello")
    expect("Message published" in published.stdout, "publish through an exchange routes")
    unrouted = admin(port, "publish", "exchange=adm_x", "routing_key=zzz", "payload=lost")
    expect("NOT routed" in unrouted.stdout, "an unroutable publish says so")

    listed = dict((row[0], row[1]) for row in rows(admin(port, "list", "queues", "name", "messages").stdout))
    expect(listed.get("adm_q") == "1", f"list queues counts the message: {listed}")
    queue_types = json.loads(admin(port, "-f", "raw_json", "list", "queues", "name", "type").stdout)
    expect({"name": "adm_qq", "type": "quorum"} in queue_types, "the quorum queue lists as quorum")

    got = admin(port, "get", "queue=adm_q", "ackmode=ack_requeue_true").stdout
    expect("hello" in got, "get shows the payload")
    method, _, body = channel.basic_get("adm_q", auto_ack=True)
    expect(body == b"hello", "the requeued message reaches pika")

    bindings = rows(admin(port, "list", "bindings", "source", "destination", "routing_key").stdout)
    expect(["adm_x", "adm_q", "a.#"] in bindings, f"list bindings: {bindings}")
    admin(port, "delete", "binding", "source=adm_x", "destination=adm_q",
          "destination_type=queue", "properties_key=a.%23")
    bindings = rows(admin(port, "list", "bindings", "source", "destination", "routing_key").stdout)
    expect(["adm_x", "adm_q", "a.#"] not in bindings, "delete binding removes it")

    channel.basic_publish("", "adm_q", b"to purge")
    admin(port, "purge", "queue", "name=adm_q")
    method, _, _ = channel.basic_get("adm_q", auto_ack=True)
    expect(method is None, "purge empties the queue")

    admin(port, "declare", "vhost", "name=adm_vh")
    admin(port, "declare", "user", "name=adm_user", "password=pw", "tags=management")
    admin(port, "declare", "permission", "vhost=adm_vh", "user=adm_user",
          "configure=.*", "write=.*", "read=.*")
    user_connection = pika.BlockingConnection(pika.ConnectionParameters(
        host="127.0.0.1", port=pika.URLParameters(uri).port, virtual_host="adm_vh",
        credentials=pika.PlainCredentials("adm_user", "pw")))
    expect(user_connection.is_open, "a user declared with rabbitmqadmin logs in over AMQP")
    user_connection.close()
    users = [row[0] for row in rows(admin(port, "list", "users", "name").stdout)]
    expect("adm_user" in users, f"list users: {users}")

    refused = admin(port, "list", "queues", password="wrong", expect_ok=False)
    expect(refused.returncode != 0 and "Access refused" in (refused.stdout + refused.stderr),
           "a wrong password is refused")

    overview = json.loads(admin(port, "-f", "raw_json", "show", "overview").stdout)
    expect(overview[0]["rabbitmq_version"] == "3.10.8", "show overview")
    nodes = rows(admin(port, "list", "nodes", "name", "type").stdout)
    expect(len(nodes) == 1 and nodes[0][1] == "disc", f"list nodes: {nodes}")

    with tempfile.TemporaryDirectory() as directory:
        exported = os.path.join(directory, "definitions.json")
        admin(port, "export", exported)
        with open(exported) as file:
            definitions = json.load(file)
        expect(any(queue["name"] == "adm_q" for queue in definitions["queues"]),
               "export holds the declared queue")
        imported = os.path.join(directory, "import.json")
        with open(imported, "w") as file:
            json.dump({"queues": [{"name": "imported_q", "vhost": "/", "durable": True,
                                   "auto_delete": False, "arguments": {}}],
                       "exchanges": [], "bindings": []}, file)
        admin(port, "import", imported)
        channel.queue_declare("imported_q", passive=True)
        expect(True, "import declares what the file holds")

    parameters = pika.URLParameters(uri)
    parameters.client_properties = {"connection_name": "watched"}
    watched = pika.BlockingConnection(parameters)
    target = None
    deadline = time.time() + 10
    while target is None and time.time() < deadline:
        listed = json.loads(admin(port, "-f", "raw_json", "list", "connections",
                                  "name", "client_properties").stdout)
        target = next((item["name"] for item in listed
                       if item.get("client_properties", {}).get("connection_name") == "watched"), None)
        time.sleep(0.1)
    expect(target is not None, "list connections shows the client's connection name")
    admin(port, "close", "connection", f"name={target}")
    try:
        deadline = time.time() + 10
        while time.time() < deadline:
            watched.process_data_events(time_limit=0.2)
        raise AssertionError("the connection was not closed")
    except pika.exceptions.ConnectionClosedByBroker as closed:
        expect(closed.reply_code == 320, f"close connection: {closed.reply_code} {closed.reply_text}")

    for args in (["delete", "queue", "name=adm_q"], ["delete", "queue", "name=adm_qq"],
                 ["delete", "queue", "name=imported_q"], ["delete", "exchange", "name=adm_x"],
                 ["delete", "user", "name=adm_user"], ["delete", "vhost", "name=adm_vh"]):
        admin(port, *args)
    try:
        channel.queue_declare("adm_q", passive=True)
        raise AssertionError("the deleted queue is still there")
    except pika.exceptions.ChannelClosedByBroker as closed:
        expect(closed.reply_code == 404, "delete queue removes it")
    connection.close()
    print("rabbitmqadmin: all checks passed")


if __name__ == "__main__":
    main()
