// The AWS SDK for Java v2's DynamoDbStreamsClient, driven line by line from a test
// (tests/volume_stream/java_streams.py): an implementation of the DynamoDB Streams protocol
// (its own JSON parser, SigV4 signer, HTTP client and enums) that no one here wrote.
//
// Commands on stdin, one a line, fields separated by tabs; one JSON answer a line on stdout:
//   client URL REGION KEY SECRET        (re)build the client
//   list TABLE|- LIMIT                  ListStreams, every page
//   describe ARN LIMIT                  DescribeStream, every page of shards
//   children ARN SHARD                  DescribeStream with ShardFilter CHILD_SHARDS
//   iterator ARN SHARD TYPE SEQ|-       GetShardIterator
//   records ITERATOR LIMIT              GetRecords, one page
//   drain ITERATOR LIMIT                GetRecords until an empty page or no next iterator
//   async URL REGION KEY SECRET ARN     every record of every shard with the async client on
//                                       Netty (another HTTP stack), shard by shard
// An SDK error is {"error": {"exception", "code", "status", "message"}}. What is printed is
// what the SDK's model objects hold: enums as the SDK knows them (UNKNOWN_TO_SDK_VERSION for a
// value it does not), attribute values as DynamoDB JSON rebuilt from AttributeValue.type().

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.Map;

import software.amazon.awssdk.auth.credentials.AwsBasicCredentials;
import software.amazon.awssdk.auth.credentials.StaticCredentialsProvider;
import software.amazon.awssdk.awscore.exception.AwsServiceException;
import software.amazon.awssdk.core.SdkBytes;
import software.amazon.awssdk.core.exception.SdkException;
import software.amazon.awssdk.awscore.retry.AwsRetryStrategy;
import software.amazon.awssdk.http.apache.ApacheHttpClient;
import software.amazon.awssdk.http.nio.netty.NettyNioAsyncHttpClient;
import software.amazon.awssdk.regions.Region;
import software.amazon.awssdk.services.dynamodb.model.AttributeValue;
import software.amazon.awssdk.services.dynamodb.model.DescribeStreamResponse;
import software.amazon.awssdk.services.dynamodb.model.GetRecordsResponse;
import software.amazon.awssdk.services.dynamodb.model.KeySchemaElement;
import software.amazon.awssdk.services.dynamodb.model.ListStreamsResponse;
import software.amazon.awssdk.services.dynamodb.model.Record;
import software.amazon.awssdk.services.dynamodb.model.Shard;
import software.amazon.awssdk.services.dynamodb.model.ShardFilterType;
import software.amazon.awssdk.services.dynamodb.model.StreamDescription;
import software.amazon.awssdk.services.dynamodb.model.StreamRecord;
import software.amazon.awssdk.services.dynamodb.streams.DynamoDbStreamsAsyncClient;
import software.amazon.awssdk.services.dynamodb.streams.DynamoDbStreamsClient;

public final class StreamsProbe {
    private static DynamoDbStreamsClient client;

    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        System.out.println("{\"ready\":true}");
        System.out.flush();
        String line;
        while ((line = in.readLine()) != null) {
            String[] f = line.split("\t", -1);
            String out;
            try {
                out = run(f);
            } catch (AwsServiceException e) {
                out = "{\"error\":{\"exception\":" + str(e.getClass().getSimpleName())
                    + ",\"code\":" + str(e.awsErrorDetails().errorCode())
                    + ",\"status\":" + e.statusCode()
                    + ",\"message\":" + str(e.awsErrorDetails().errorMessage()) + "}}";
            } catch (java.util.concurrent.CompletionException e) {
                Throwable c = e.getCause();
                out = "{\"error\":{\"exception\":" + str(c.getClass().getSimpleName())
                    + ",\"message\":" + str(String.valueOf(c.getMessage())) + "}}";
            } catch (SdkException e) {
                out = "{\"error\":{\"exception\":" + str(e.getClass().getSimpleName())
                    + ",\"message\":" + str(String.valueOf(e.getMessage())) + "}}";
            }
            System.out.println(out);
            System.out.flush();
        }
        if (client != null) {
            client.close();
        }
    }

    private static String run(String[] f) {
        switch (f[0]) {
            case "client":
                if (client != null) {
                    client.close();
                }
                client = DynamoDbStreamsClient.builder()
                    .endpointOverride(URI.create(f[1]))
                    .region(Region.of(f[2]))
                    .credentialsProvider(StaticCredentialsProvider.create(
                        AwsBasicCredentials.create(f[3], f[4])))
                    .httpClient(ApacheHttpClient.builder().build())
                    .overrideConfiguration(o -> o.retryStrategy(AwsRetryStrategy.doNotRetry()))
                    .build();
                return "{\"ok\":true}";
            case "list":
                return list(f[1].equals("-") ? null : f[1], Integer.parseInt(f[2]));
            case "describe":
                return describe(f[1], Integer.parseInt(f[2]));
            case "children": {
                StreamDescription d = client.describeStream(r -> r.streamArn(f[1]).shardFilter(
                    s -> s.type(ShardFilterType.CHILD_SHARDS).shardId(f[2]))).streamDescription();
                List<String> out = new ArrayList<>();
                for (Shard s : d.shards()) {
                    out.add(shard(s));
                }
                return "{\"shards\":[" + String.join(",", out) + "]}";
            }
            case "iterator":
                return "{\"iterator\":" + str(client.getShardIterator(r -> {
                    r.streamArn(f[1]).shardId(f[2]).shardIteratorType(f[3]);
                    if (!f[4].equals("-")) {
                        r.sequenceNumber(f[4]);
                    }
                }).shardIterator()) + "}";
            case "records": {
                GetRecordsResponse page = client.getRecords(
                    r -> r.shardIterator(f[1]).limit(Integer.parseInt(f[2])));
                List<String> out = new ArrayList<>();
                for (Record r : page.records()) {
                    out.add(record(r));
                }
                return "{\"records\":[" + String.join(",", out) + "],\"next\":"
                    + str(page.nextShardIterator()) + "}";
            }
            case "drain": {
                String it = f[1];
                List<String> out = new ArrayList<>();
                int pages = 0;
                while (it != null) {
                    final String current = it;
                    GetRecordsResponse page = client.getRecords(
                        r -> r.shardIterator(current).limit(Integer.parseInt(f[2])));
                    pages++;
                    for (Record r : page.records()) {
                        out.add(record(r));
                    }
                    it = page.nextShardIterator();
                    if (page.records().isEmpty()) {
                        break;
                    }
                }
                return "{\"records\":[" + String.join(",", out) + "],\"pages\":" + pages
                    + ",\"next\":" + str(it) + "}";
            }
            case "async":
                return readAsync(f);
            default:
                throw new IllegalArgumentException("unknown command " + f[0]);
        }
    }

    private static String readAsync(String[] f) {
        try (DynamoDbStreamsAsyncClient c = DynamoDbStreamsAsyncClient.builder()
                .endpointOverride(URI.create(f[1]))
                .region(Region.of(f[2]))
                .credentialsProvider(StaticCredentialsProvider.create(
                    AwsBasicCredentials.create(f[3], f[4])))
                .httpClientBuilder(NettyNioAsyncHttpClient.builder())
                .overrideConfiguration(o -> o.retryStrategy(AwsRetryStrategy.doNotRetry()))
                .build()) {
            List<String> out = new ArrayList<>();
            for (Shard s : c.describeStream(r -> r.streamArn(f[5])).join()
                    .streamDescription().shards()) {
                String it = c.getShardIterator(r -> r.streamArn(f[5]).shardId(s.shardId())
                    .shardIteratorType("TRIM_HORIZON")).join().shardIterator();
                while (it != null) {
                    final String current = it;
                    GetRecordsResponse page = c.getRecords(r -> r.shardIterator(current)).join();
                    for (Record r : page.records()) {
                        out.add(record(r));
                    }
                    it = page.nextShardIterator();
                    if (page.records().isEmpty()) {
                        break;
                    }
                }
            }
            return "{\"records\":[" + String.join(",", out) + "]}";
        }
    }

    private static String list(String table, int limit) {
        List<String> out = new ArrayList<>();
        String start = null;
        int pages = 0;
        do {
            final String from = start;
            ListStreamsResponse page = client.listStreams(r -> r.tableName(table).limit(limit)
                .exclusiveStartStreamArn(from));
            pages++;
            page.streams().forEach(s -> out.add("{\"StreamArn\":" + str(s.streamArn())
                + ",\"TableName\":" + str(s.tableName()) + ",\"StreamLabel\":"
                + str(s.streamLabel()) + "}"));
            start = page.lastEvaluatedStreamArn();
        } while (start != null);
        return "{\"streams\":[" + String.join(",", out) + "],\"pages\":" + pages + "}";
    }

    private static String describe(String arn, int limit) {
        List<String> shards = new ArrayList<>();
        String start = null;
        int pages = 0;
        StreamDescription d;
        do {
            final String from = start;
            DescribeStreamResponse page = client.describeStream(r -> r.streamArn(arn)
                .limit(limit).exclusiveStartShardId(from));
            d = page.streamDescription();
            pages++;
            for (Shard s : d.shards()) {
                shards.add(shard(s));
            }
            start = d.lastEvaluatedShardId();
        } while (start != null);
        List<String> keys = new ArrayList<>();
        for (KeySchemaElement k : d.keySchema()) {
            keys.add("{\"AttributeName\":" + str(k.attributeName()) + ",\"KeyType\":"
                + str(String.valueOf(k.keyType())) + "}");
        }
        return "{\"StreamArn\":" + str(d.streamArn()) + ",\"StreamLabel\":" + str(d.streamLabel())
            + ",\"StreamStatus\":" + str(String.valueOf(d.streamStatus()))
            + ",\"StreamViewType\":" + str(String.valueOf(d.streamViewType()))
            + ",\"CreationRequestDateTime\":" + seconds(d.creationRequestDateTime())
            + ",\"TableName\":" + str(d.tableName())
            + ",\"KeySchema\":[" + String.join(",", keys) + "]"
            + ",\"Shards\":[" + String.join(",", shards) + "],\"pages\":" + pages + "}";
    }

    private static String shard(Shard s) {
        return "{\"ShardId\":" + str(s.shardId()) + ",\"ParentShardId\":" + str(s.parentShardId())
            + ",\"StartingSequenceNumber\":" + str(s.sequenceNumberRange().startingSequenceNumber())
            + ",\"EndingSequenceNumber\":" + str(s.sequenceNumberRange().endingSequenceNumber())
            + "}";
    }

    private static String record(Record r) {
        StreamRecord d = r.dynamodb();
        StringBuilder b = new StringBuilder();
        b.append("{\"eventID\":").append(str(r.eventID()))
            .append(",\"eventName\":").append(str(String.valueOf(r.eventName())))
            .append(",\"eventVersion\":").append(str(r.eventVersion()))
            .append(",\"eventSource\":").append(str(r.eventSource()))
            .append(",\"awsRegion\":").append(str(r.awsRegion()))
            .append(",\"dynamodb\":{\"ApproximateCreationDateTime\":")
            .append(seconds(d.approximateCreationDateTime()))
            .append(",\"SequenceNumber\":").append(str(d.sequenceNumber()))
            .append(",\"SizeBytes\":").append(d.sizeBytes())
            .append(",\"StreamViewType\":").append(str(String.valueOf(d.streamViewType())))
            .append(",\"Keys\":").append(image(d.keys()));
        if (d.hasNewImage()) {
            b.append(",\"NewImage\":").append(image(d.newImage()));
        }
        if (d.hasOldImage()) {
            b.append(",\"OldImage\":").append(image(d.oldImage()));
        }
        return b.append("}}").toString();
    }

    private static String seconds(Instant t) {
        return t == null ? "null" : t.getEpochSecond() + "." + String.format("%09d", t.getNano());
    }

    private static String image(Map<String, AttributeValue> m) {
        List<String> out = new ArrayList<>();
        for (Map.Entry<String, AttributeValue> e : m.entrySet()) {
            out.add(str(e.getKey()) + ":" + value(e.getValue()));
        }
        return "{" + String.join(",", out) + "}";
    }

    private static String value(AttributeValue v) {
        switch (v.type()) {
            case S: return "{\"S\":" + str(v.s()) + "}";
            case N: return "{\"N\":" + str(v.n()) + "}";
            case B: return "{\"B\":" + str(b64(v.b())) + "}";
            case BOOL: return "{\"BOOL\":" + v.bool() + "}";
            case NUL: return "{\"NULL\":" + v.nul() + "}";
            case M: return "{\"M\":" + image(v.m()) + "}";
            case L: {
                List<String> out = new ArrayList<>();
                for (AttributeValue x : v.l()) {
                    out.add(value(x));
                }
                return "{\"L\":[" + String.join(",", out) + "]}";
            }
            case SS: return "{\"SS\":" + strs(v.ss()) + "}";
            case NS: return "{\"NS\":" + strs(v.ns()) + "}";
            case BS: {
                List<String> out = new ArrayList<>();
                for (SdkBytes x : v.bs()) {
                    out.add(b64(x));
                }
                return "{\"BS\":" + strs(out) + "}";
            }
            default: return "{\"UNKNOWN_TO_SDK_VERSION\":" + str(v.toString()) + "}";
        }
    }

    private static String b64(SdkBytes b) {
        return Base64.getEncoder().encodeToString(b.asByteArray());
    }

    private static String strs(List<String> xs) {
        List<String> out = new ArrayList<>();
        for (String x : xs) {
            out.add(str(x));
        }
        return "[" + String.join(",", out) + "]";
    }

    /** A JSON string literal (null as null), non-ASCII escaped. */
    private static String str(String s) {
        if (s == null) {
            return "null";
        }
        StringBuilder b = new StringBuilder("\"");
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c == '"' || c == '\\') {
                b.append('\\').append(c);
            } else if (c < 0x20 || c > 0x7e) {
                b.append(String.format("\\u%04x", (int) c));
            } else {
                b.append(c);
            }
        }
        return b.append('"').toString();
    }
}
