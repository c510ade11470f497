"""RabbitMQ adapters (aio-pika): topology, publisher-confirmed dispatch, manual-ack consumption.

Importing the package makes the AMQP client read any bytes a producer puts in a short string
(adapters/rabbitmq/wire.py)."""

from adapters.rabbitmq import wire

wire.install()
