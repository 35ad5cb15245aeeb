package launcher

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// dirWatch reports files created in one directory (inotify), so that the launcher waits for
// QEMU's monitor socket without polling: on a loaded node QEMU takes seconds to bind it, and a
// poll every 5 ms was most of a launcher's start-up CPU.
type dirWatch struct {
	f *os.File
	// created receives (without blocking the reader; one pending value is enough) after each
	// batch of creations.
	created chan struct{}
}

// watchCreates starts watching dir for files created in it or moved into it.
func watchCreates(dir string) (*dirWatch, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("watch %s for new files: %w", dir, err)
	}
	// Non-blocking, so that reads go through the runtime's poller and Close ends them.
	w := &dirWatch{f: os.NewFile(uintptr(fd), "inotify "+dir), created: make(chan struct{}, 1)}
	go w.read()
	return w, nil
}

func (w *dirWatch) read() {
	buf := make([]byte, 4096)
	for {
		if _, err := w.f.Read(buf); err != nil {
			return // closed
		}
		select {
		case w.created <- struct{}{}:
		default:
		}
	}
}

// Close stops the watch.
func (w *dirWatch) Close() error { return w.f.Close() }
