// Command pstest serves the Pub/Sub fake of the Go client library (cloud.google.com/go/pubsub/v2/pstest)
// on a port given by flag, for the GCS tests and docs (PUBSUB_EMULATOR_HOST=127.0.0.1:PORT).
// -min-ack-deadline lets tests make subscriptions whose messages come back within a second.
// It prints "listening on HOST:PORT" once it accepts connections and runs until it is signalled.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"cloud.google.com/go/pubsub/v2/pstest"
)

func main() {
	host := flag.String("host", "127.0.0.1", "address to bind to")
	port := flag.Int("port", 8085, "port to listen on (0: any free port)")
	minAck := flag.Duration("min-ack-deadline", 10*time.Second,
		"the shortest ack deadline a subscription may have (Pub/Sub's is 10s; tests use less)")
	flag.Parse()
	pstest.SetMinAckDeadline(*minAck)
	srv := pstest.NewServerWithAddress(net.JoinHostPort(*host, fmt.Sprint(*port)))
	fmt.Printf("listening on %s\n", srv.Addr)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	<-stop
	_ = srv.Close()
}
