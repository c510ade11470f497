"""S3 API adapters (aioboto3): the blob store, its client, and a moto server for local runs."""
