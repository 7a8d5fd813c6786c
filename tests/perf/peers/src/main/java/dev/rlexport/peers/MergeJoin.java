package dev.rlexport.peers;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.time.Duration;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.KeyValueStore;

/**
 * The Kafka Streams peer of {@code make bench-peers}: the worker's three input topics merged
 * per trace.
 *
 * <p>One source over the three co-partitioned topics (keyed by trace_id), grouped by key (no
 * repartition: the key is the producers'), aggregated into a KTable whose RocksDB store
 * {@code merged} has a changelog topic, with {@code processing.guarantee=exactly_once_v2}; the
 * table's updates go to the output topic. The merge is the one of {@code
 * tests/perf/peers/merge.py}: the event's fields over the trace's, and a count per event type.
 *
 * <p>Arguments: {@code --bootstrap HOST:PORT --application-id ID --inputs A,B,C --output TOPIC
 * --state-dir DIR} and, left to Kafka Streams' defaults when absent, {@code --threads N
 * --commit-interval-ms MS}. It prints one JSON object a line: its configuration once started
 * (version, heap, threads, commit interval), then the wall time it merged its first record
 * ({@code first_record_at}, seconds since the epoch), which starts the bench's clock. SIGTERM
 * closes it.
 */
public final class MergeJoin {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final AtomicBoolean FIRST = new AtomicBoolean();

  private MergeJoin() {}

  /** The trace's merged state after one more of its events (the state is changed in place). */
  static ObjectNode merge(ObjectNode merged, byte[] value) {
    ObjectNode event;
    try {
      event = (ObjectNode) JSON.readTree(value);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    JsonNode kept = merged.get("counts");
    ObjectNode counts = kept instanceof ObjectNode ? (ObjectNode) kept : JSON.createObjectNode();
    String type = event.path("event_type").asText();
    merged.setAll(event);
    counts.put(type, counts.path(type).asLong(0) + 1);
    merged.set("counts", counts);
    return merged;
  }

  private static Serde<ObjectNode> objectSerde() {
    return Serdes.serdeFrom(
        (topic, node) -> {
          try {
            return node == null ? null : JSON.writeValueAsBytes(node);
          } catch (IOException e) {
            throw new UncheckedIOException(e);
          }
        },
        (topic, bytes) -> {
          try {
            return bytes == null ? null : (ObjectNode) JSON.readTree(bytes);
          } catch (IOException e) {
            throw new UncheckedIOException(e);
          }
        });
  }

  private static Map<String, String> options(String[] args) {
    Map<String, String> out = new HashMap<>();
    for (int i = 0; i + 1 < args.length; i += 2) {
      if (!args[i].startsWith("--")) {
        throw new IllegalArgumentException("expected --name value pairs, got " + args[i]);
      }
      out.put(args[i].substring(2), args[i + 1]);
    }
    for (String required : List.of("bootstrap", "application-id", "inputs", "output", "state-dir")) {
      if (!out.containsKey(required)) {
        throw new IllegalArgumentException("--" + required + " is required");
      }
    }
    return out;
  }

  public static void main(String[] args) throws InterruptedException {
    Map<String, String> opts = options(args);
    Properties props = new Properties();
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, opts.get("application-id"));
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, opts.get("bootstrap"));
    props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
    props.put(StreamsConfig.STATE_DIR_CONFIG, opts.get("state-dir"));
    props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    if (opts.containsKey("threads")) {
      props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, opts.get("threads"));
    }
    if (opts.containsKey("commit-interval-ms")) {
      props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, opts.get("commit-interval-ms"));
    }
    StreamsConfig config = new StreamsConfig(props);

    Serde<ObjectNode> json = objectSerde();
    StreamsBuilder builder = new StreamsBuilder();
    List<String> inputs = Arrays.asList(opts.get("inputs").split(","));
    builder.stream(inputs, Consumed.with(Serdes.String(), Serdes.ByteArray()))
        .groupByKey()
        .aggregate(
            JSON::createObjectNode,
            (traceId, value, merged) -> {
              if (!FIRST.getAndSet(true)) {
                say("first_record_at", System.currentTimeMillis() / 1000.0);
              }
              return merge(merged, value);
            },
            Materialized.<String, ObjectNode, KeyValueStore<Bytes, byte[]>>as("merged")
                .withKeySerde(Serdes.String())
                .withValueSerde(json))
        .toStream()
        .to(opts.get("output"), Produced.with(Serdes.String(), json));

    KafkaStreams streams = new KafkaStreams(builder.build(), props);
    CountDownLatch closed = new CountDownLatch(1);
    streams.setUncaughtExceptionHandler(
        e -> {
          System.err.println("stream thread failed: " + e);
          closed.countDown();
          return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler
              .StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
    Runtime.getRuntime()
        .addShutdownHook(
            new Thread(
                () -> {
                  streams.close(Duration.ofSeconds(30));
                  closed.countDown();
                }));
    System.out.printf(
        Locale.ROOT,
        "{\"kafka_streams\": \"%s\", \"max_heap_mib\": %d, \"stream_threads\": %d,"
            + " \"commit_interval_ms\": %d, \"processors\": %d}%n",
        kafkaVersion(),
        Runtime.getRuntime().maxMemory() / (1024 * 1024),
        config.getInt(StreamsConfig.NUM_STREAM_THREADS_CONFIG),
        config.getLong(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG),
        Runtime.getRuntime().availableProcessors());
    System.out.flush();
    streams.start();
    closed.await();
  }

  /** The Kafka clients' version, from their jar (the class that says it moved in 4.x). */
  private static String kafkaVersion() {
    Properties version = new Properties();
    try (InputStream in = KafkaStreams.class.getResourceAsStream("/kafka/kafka-version.properties")) {
      if (in != null) {
        version.load(in);
      }
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    return version.getProperty("version", "unknown");
  }

  private static void say(String name, double value) {
    System.out.printf(Locale.ROOT, "{\"%s\": %.3f}%n", name, value);
    System.out.flush();
  }
}
