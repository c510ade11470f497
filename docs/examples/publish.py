"""Publish one message to a service's queue as an outside producer does (the wire format).

    python docs/examples/publish.py AMQP_URL QUEUE TYPE 'JSON_BODY' [MESSAGE_ID] [--inbound]

With `--inbound`, to the gateway's exchange `<QUEUE>.in` (the only place a producer user of
deploy/rabbitmq/setup.sh may publish), else to the default exchange with the queue's name as
routing key.
"""

import asyncio
import json
import sys
import uuid

import aio_pika


async def publish(url: str, queue: str, type_: str, body: dict, message_id: str,
                  inbound: bool = False) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)  # wait for the broker
        exchange = (await channel.get_exchange(f"{queue}.in", ensure=False) if inbound
                    else channel.default_exchange)  # the default one: routing key = queue
        await exchange.publish(
            aio_pika.Message(json.dumps(body).encode(), message_id=message_id, type=type_,
                             content_type="application/json",
                             delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
            routing_key=queue, mandatory=True)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--inbound"]
    url, queue, type_, body = args[0], args[1], args[2], json.loads(args[3])
    message_id = args[4] if len(args) > 4 else str(uuid.uuid4())  # the same ID per copy
    asyncio.run(publish(url, queue, type_, body, message_id, "--inbound" in sys.argv))
