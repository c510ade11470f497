"""Publish one message to a service's queue as an outside producer does (the wire format).

    python docs/examples/publish.py AMQP_URL QUEUE TYPE 'JSON_BODY' \\
        (MESSAGE_ID | --key BUSINESS_KEY [--namespace NAME]) [--inbound]

The message ID is the producer's to choose, and the same for every copy of one message: here
either given, or derived from the business key (`--key p-1` for a `Ship` of parcel p-1) in a
namespace of the producer's own (`--namespace`, a URL or a name it owns), so running this
again, or retrying after a lost confirm, sends the same message, which the gateway drops as a
copy. aio-pika (through aiormq) gives a message published without an ID a random one: every
retry of such a producer would be processed again, so this example refuses to send without.

A gateway's message IDs must be UUIDs (`6f1c2a4e-0000-4000-8000-000000000001`): the
service's deduplication keys are UUID columns. A message whose ID is not one (`order-1`) is
never processed: the gateway dead-letters it at once with the reason "message_id 'order-1'
is not a UUID" (`eo dead-letters list`), and it cannot be replayed, since its ID is the
fault: discard it, and publish the message again under a UUID. So this example refuses a
given ID that is not a UUID, before it connects; a business key of any form goes to `--key`,
which derives a UUID from it.

The message carries `user_id` = the URL's user: RabbitMQ checks it against the user that
publishes, and a gateway scopes deduplication to it (one producer cannot squat another's IDs;
production requires it). With `--inbound`, to the gateway's exchange `<QUEUE>.in` (the only
place a producer user of deploy/rabbitmq/setup.sh may publish), else to the default exchange
with the queue's name as routing key.
"""

import argparse
import asyncio
import json
import uuid
from urllib.parse import unquote, urlsplit

import aio_pika


def natural_id(namespace: str, type_: str, key: str) -> str:
    """The message ID of `type_` for business key `key`: uuid5 of "<type>/<key>" in the
    producer's namespace (itself a uuid5 of `namespace` in the URL namespace)."""
    return str(uuid.uuid5(uuid.uuid5(uuid.NAMESPACE_URL, namespace), f"{type_}/{key}"))


async def publish(url: str, queue: str, type_: str, body: dict, message_id: str,
                  inbound: bool = False) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)  # wait for the broker
        exchange = (await channel.get_exchange(f"{queue}.in", ensure=False) if inbound
                    else channel.default_exchange)  # the default one: routing key = queue
        await exchange.publish(
            aio_pika.Message(json.dumps(body).encode(), message_id=message_id, type=type_,
                             user_id=unquote(urlsplit(url).username or "") or "guest",
                             content_type="application/json",
                             delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
            routing_key=queue, mandatory=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("queue")
    parser.add_argument("type")
    parser.add_argument("body", type=json.loads)
    parser.add_argument("message_id", nargs="?", help="a UUID")
    parser.add_argument("--key", help="derive the message ID (a UUID) from this business key")
    parser.add_argument("--namespace", default="https://producer.example/eo",
                        help="the producer's own namespace for derived IDs")
    parser.add_argument("--inbound", action="store_true")
    options = parser.parse_args(argv)
    if (options.message_id is None) == (options.key is None):
        parser.error("give the message ID, or --key to derive it from the business key "
                     "(never a random one: a retry would be a new message)")
    if options.message_id is not None:
        try:  # the gateway dead-letters any other ID unprocessed: refuse it here instead
            message_id = str(uuid.UUID(options.message_id))
        except ValueError:
            parser.error(f"message ID {options.message_id!r} is not a UUID: the gateway would "
                         "dead-letter it unprocessed; give a UUID, or the business key with "
                         "--key to derive one")
    else:
        message_id = natural_id(options.namespace, options.type, options.key)
    asyncio.run(publish(options.url, options.queue, options.type, options.body, message_id,
                        options.inbound))


if __name__ == "__main__":
    main()
