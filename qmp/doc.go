// Package qmp is qvirt's client for the QEMU Machine Protocol (QMP), written
// for QEMU 7.2 (Debian bookworm) and later.
//
// # Why not go-qemu's socket monitor
//
// We keep go-qemu's vocabulary: [Monitor] implements its qmp.Monitor
// interface, and events are its qmp.Event. We do not use its transport:
// go-qemu's SocketMonitor has no deadlines, reads replies with a
// bufio.Scanner whose 64 KiB token limit breaks query-qmp-schema (about 200 KiB
// on QEMU 7.2), runs one command at a time, and sends events on an unbuffered
// channel, so a caller that asks for events and stops reading them deadlocks
// every later command. Its generated qmp/raw package follows QEMU 2.11's
// schema and is not used either: the typed commands here were checked
// against QEMU 7.2's query-qmp-schema.
//
// # Concurrency contract
//
//   - One goroutine, started by [Dial], owns reading the connection. It
//     decodes a stream of JSON values with no size limit, matches replies to
//     callers by the "id" field every command carries, and fans events out.
//     It never blocks on a caller: replies go to a buffered slot per command,
//     events to subscriptions that drop their oldest event when full.
//   - Every method of [Monitor] is safe for concurrent use. Commands from many
//     goroutines may be in flight at once; QEMU answers them in order, and
//     each caller gets its own reply.
//   - Every command takes a context. Cancelling it abandons the wait for the
//     reply (the late reply is discarded); it does not undo the command in
//     QEMU, which may still carry it out. A write interrupted half-way
//     leaves the stream unusable, so the monitor then closes the connection.
//   - When the connection drops, every pending and later call fails with an
//     error wrapping [ErrDisconnected] and the cause (usually io.EOF: QEMU
//     exited). After [Monitor.Close] they fail with [ErrClosed]. Close is
//     idempotent and returns once the reading goroutine has stopped.
//   - A QMP error reply is returned as a *[Error] (wrapped with the command
//     name), so callers branch with errors.As on its Class.
//
// # Events
//
// [Monitor.Subscribe] gives a buffered stream of every event. A subscriber
// that falls behind loses its oldest events, counted by
// [Subscription.Dropped]; it never slows replies or other subscribers.
// go-qemu's Events(ctx) is built on a subscription.
//
// To wait for the event that a command causes, register interest before
// sending the command, or the event may arrive before the wait starts:
// [Monitor.ExecuteAndWait] does both, and [Monitor.NewWaiter] gives a
// [Waiter] to use around any sequence of calls. Waiters see every event,
// without drops.
//
// # Logging
//
// The package does not log. Everything it knows is returned as an error or
// exposed through [Monitor.Err] and [Monitor.Done].
package qmp
