"""Create the compose stack's bucket, queue and S3 -> SQS notification on moto (idempotent).

    docker compose -f deploy/compose.yaml run --rm moto-client       # runs this
    python3 /setup/put.py a.jpg                                      # then put objects
"""

import boto3

BUCKET, QUEUE, PREFIX = "raw", "raw-events", "incoming/"

s3, sqs = boto3.client("s3"), boto3.client("sqs")
s3.create_bucket(Bucket=BUCKET)
queue_url = sqs.create_queue(QueueName=QUEUE)["QueueUrl"]
arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])
s3.put_bucket_notification_configuration(Bucket=BUCKET, NotificationConfiguration={
    "QueueConfigurations": [{
        "QueueArn": arn["Attributes"]["QueueArn"],
        "Events": ["s3:ObjectCreated:*", "s3:ObjectRemoved:*"],
        "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": PREFIX}]}},
    }]})
print(f"s3://{BUCKET}/{PREFIX} -> {queue_url}")
