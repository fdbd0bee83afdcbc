"""Interop check of amqps and access control with pika, as a user of both would run it.

    tls_check.py PORT CA_FILE CLIENT_CERT CLIENT_KEY

The broker listens for amqps on PORT with verify_peer (client certificates asked for, not
required) and ssl_cert_login_from = common_name, and has loaded the RabbitMQ 3.10.8 export
in crates/sluice-server/tests/fixtures (users guest, bob with configure/read ^bob\\.).
"""
import signal
import ssl
import sys

import pika
from pika.credentials import ExternalCredentials
from pika.exceptions import ChannelClosedByBroker, ProbableAuthenticationError


def timed_out(_signum, _frame):
    raise TimeoutError("no answer from the broker within 10 s")


def parameters(port, context, credentials):
    return pika.ConnectionParameters(
        host="127.0.0.1",
        port=port,
        ssl_options=pika.SSLOptions(context, "localhost"),
        credentials=credentials,
    )


def round_trip(connection, queue):
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue, exclusive=True)
    channel.basic_publish("", queue, b"over tls")
    method, _, body = channel.basic_get(queue, auto_ack=True)
    assert method is not None and body == b"over tls", (method, body)


def main(port, ca, certificate, key):
    signal.signal(signal.SIGALRM, timed_out)
    signal.alarm(20)
    port = int(port)

    # PLAIN over TLS, no client certificate.
    plain_context = ssl.create_default_context(cafile=ca)
    connection = pika.BlockingConnection(
        parameters(port, plain_context, pika.PlainCredentials("guest", "guest"))
    )
    round_trip(connection, "bob.tls.plain")
    connection.close()
    print("amqps with PLAIN: published with confirms and got it back")

    # EXTERNAL: the client certificate (CN=guest) is the credential.
    external_context = ssl.create_default_context(cafile=ca)
    external_context.load_cert_chain(certificate, key)
    connection = pika.BlockingConnection(parameters(port, external_context, ExternalCredentials()))
    round_trip(connection, "bob.tls.external")
    connection.close()
    print("amqps with EXTERNAL (client certificate CN=guest): round trip")

    # A wrong password over TLS is refused.
    try:
        pika.BlockingConnection(parameters(port, plain_context, pika.PlainCredentials("bob", "nope")))
        raise AssertionError("a wrong password logged in")
    except ProbableAuthenticationError as error:
        assert "ACCESS_REFUSED" in str(error), error
    print("amqps with a wrong password: ACCESS_REFUSED")

    # bob's permissions from the RabbitMQ export, as RabbitMQ answers them.
    connection = pika.BlockingConnection(
        parameters(port, plain_context, pika.PlainCredentials("bob", "bob-pw"))
    )
    channel = connection.channel()
    channel.queue_declare("bob.allowed", auto_delete=True)
    try:
        connection.channel().queue_declare("other")
        raise AssertionError("bob declared a queue outside ^bob\\.")
    except ChannelClosedByBroker as error:
        expected = "ACCESS_REFUSED - access to queue 'other' in vhost '/' refused for user 'bob'"
        assert (error.reply_code, error.reply_text) == (403, expected), error
    print("bob: declare inside ^bob\\. allowed, 'other' refused with RabbitMQ's 403 text")
    connection.close()
    print("ok")


if __name__ == "__main__":
    main(*sys.argv[1:5])
