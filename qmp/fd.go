package qmp

import (
	"context"
	"fmt"
	"os"
	"syscall"
)

// SendFD passes f to QEMU under fdname with getfd: the descriptor travels as
// SCM_RIGHTS ancillary data on the command itself, which is how QEMU
// expects it (no QMP capability is needed; go-qemu wrongly demands "oob").
// Commands then refer to it by name (netdev_add's fd, for example). QEMU
// keeps its own copy: the caller may close f after SendFD returns. Sending
// a name again replaces QEMU's earlier descriptor of that name.
func (m *Monitor) SendFD(ctx context.Context, fdname string, f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("qmp getfd %s: %w", fdname, err)
	}
	var execErr error
	// Control keeps the descriptor open until the callback returns, so f
	// cannot be closed under us while the command is in flight.
	err = rc.Control(func(fd uintptr) {
		args := struct {
			FDName string `json:"fdname"`
		}{fdname}
		_, execErr = m.execute(ctx, "getfd", args, syscall.UnixRights(int(fd)))
	})
	if err == nil {
		err = execErr
	}
	if err != nil {
		return fmt.Errorf("qmp getfd %s: %w", fdname, err)
	}
	return nil
}

// CloseFD makes QEMU close a descriptor received with SendFD that no device
// took over.
func (m *Monitor) CloseFD(ctx context.Context, fdname string) error {
	args := struct {
		FDName string `json:"fdname"`
	}{fdname}
	return m.Call(ctx, "closefd", args, nil)
}
