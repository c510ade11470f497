"""RabbitMQ adapters (aio-pika): topology, publisher-confirmed dispatch, manual-ack consumption."""
