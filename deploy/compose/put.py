"""Put objects into the compose stack's bucket: `python3 /setup/put.py NAME [NAME...]`."""

import sys

import boto3

s3 = boto3.client("s3")
for name in sys.argv[1:] or ["hello.txt"]:
    s3.put_object(Bucket="raw", Key=f"incoming/{name}", Body=f"content of {name}\n".encode())
    print(f"put s3://raw/incoming/{name}")
