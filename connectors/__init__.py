"""Providers of events and objects for volumes; never imports `volume_stream`.

    protocols.py   the contracts: Listener, Lister, ObjectReader, Received, LISTING_SCHEMA
    errors.py      one error tree and one `is_transient` rule for every provider
    _queue.py      QueueListener: drain, dedupe, scope, ordering, visibility guard, ack/extend
    _objects.py    ObjectStore: lazy picklable client, resumable reads, paged listings
    _records.py    what S3 and OSS notifications share (record, FileEvent mapping, checks)
    aws/           client (boto3 options, errors), events (S3 parser), listener (SQS), store (S3)
    alicloud/      client (credentials, errors), events (OSS parser), listener (MNS), store (OSS)
    local/         listener (watchdog), store (lister, reader)
    memory.py      an in-memory listener and store for tests and examples

Loggers keep their short names (`connectors.sqs`, `connectors.s3`, `connectors.mns`,
`connectors.oss`, `connectors.local`), whatever module logs.
"""
